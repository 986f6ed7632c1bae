"""Local mode: devices add the noise; no exact per-user value ever reaches the server.

The devices run :mod:`models.local`; the page's device side is ``pipeline/apps/static/local.js``.
Documented in ``docs/local-protocol.md``.

Modules
-------
localmode     the worker's wiring: the analyzer's ingest and the release timer
ingest        the analyzer's thin ingest adapters (reports, shuffled batches) and its shards in Redis
release       the release of the partitions' sums, through the global release sequence
local_http    the HTTP side: ``GET /local/config``, ``POST /report``, the refusal of raw rewards
"""

__all__ = ["esa", "ingest", "local_http", "localmode", "release", "shuffler_service"]
