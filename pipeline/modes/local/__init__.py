"""Local mode: devices add the noise; no exact per-user value ever reaches the server.

The devices run :mod:`models.local`; the page's device side is ``pipeline/apps/static/local.js``.
Documented in ``docs/local-mode.md``.

Modules
-------
localmode     the server side in the worker: report ingest, the shuffler, the release of the sums
              of reports
local_http    the HTTP side: ``GET /local/config``, ``POST /report``, the refusal of raw rewards
"""

__all__ = ["esa", "local_http", "localmode", "shuffler_service"]
