"""Federated mode: each site runs the global flow on its own users, then shares its releases.

Documented in ``docs/mode-federated.md``.

Modules
-------
sites               a site's worker: the global ingest and release on the site's users, then sharing
federation          the transport: site messages on ``federated-updates``, consensus at a site
coordinator         the star's coordinator (``python -m pipeline.modes.federated.coordinator``)
federated_serving   serving each user from their site's model; feedback goes to their site
"""

__all__ = ["coordinator", "federated_serving", "federation", "sites"]
