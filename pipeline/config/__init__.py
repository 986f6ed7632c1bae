"""The ground every pipeline process stands on: settings, key layout, connections, ACL.

Modules
-------
settings      every setting, from flags and ``PRIVREC_*`` environment variables, validated
fields        how a setting is declared (type, default, group, help, model), once; the flags come from it
keys          names of the Redis keys that may leave the trusted boundary (released and model
              state, the ledger); the trusted keys are built in :mod:`pipeline.state.trusted`
ledger        the public user-level ledger record and what it says about a user's spent budget
acl           the Redis ACL users that enforce who may read what (web, workers, sites, coordinator)
kafkaconn     Kafka client options: bootstrap address, TLS and SASL
redisconn     Redis clients that ride out a Redis restart
metrics       the worker's Prometheus metrics (``/metrics``) and the ledger's public figures
faults        fault points for the fault tests (a process kills itself at a named point)

Nothing here imports another ``pipeline`` package or the web framework.
"""

__all__ = ["acl", "faults", "fields", "kafkaconn", "keys", "ledger", "metrics", "redisconn", "settings"]
