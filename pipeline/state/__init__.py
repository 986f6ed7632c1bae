"""The trusted store: what must never leave the trusted boundary.

Serving never imports this package (an import contract in ``pyproject.toml``, and the Redis ACL
users of :mod:`pipeline.config.acl` at run time).

Modules
-------
trusted       trusted state in Redis: exact statistics, processed offsets, mechanism state, the
              noise secret; the atomic ingest script and the durable publish of a release
userlevel     user-level privacy: per-user tick contributions, clipping, the cap, the fold into the
              public ledger (:mod:`pipeline.config.ledger`)
"""

__all__ = ["trusted", "userlevel"]
