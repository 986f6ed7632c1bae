"""pipeline: moves data between Kafka, Redis and the math in ``models``.

Each module has one job (DESIGN §1):

- ``settings`` — every setting, from flags and ``PRIVREC_*`` environment variables, validated.
- ``catalog`` — users → model units, arms → features and names (synthetic or LastFM).
- ``records`` — topic record types and the strict parser of ``interactions`` events.
- ``keys`` / ``trusted`` — Redis key layout: public (released, model, ledger) and trusted
  (exact statistics, offsets, noise state, the noise secret) — serving imports only ``keys``.
- ``ingest`` — validation and exact statistics, idempotent per partition offset.
- ``stages`` — the leader's release (mechanism state persisted before publishing) and solve.
- ``baseline_release`` — the same for the per-unit baselines (Shariff & Sheffet, DGS).
- ``serving`` — UCB recommendations from the published serving models only.
- ``web`` — the HTTP API and the web page (``python -m pipeline.web``).
- ``app`` — builds the faust worker's app and registers ``agents`` (the ingest task) and
  ``timers`` (the leader's release/solve tick) on it; neither imports the app.
- ``worker`` — ``python -m pipeline.worker``.
- ``services/`` — start, probe and stop tracked processes: the embedded Tansu broker
  (``broker``), ``redis-server`` (``redis_server``), the workers (``process``).

Layers are checked by import-linter (``pyproject.toml``): serving (``serving``, ``web``) never
imports the trusted store, ingest, the stages or the worker.

Submodules are not imported here, so ``import pipeline`` stays cheap and importing the
serving code never loads the trusted store; import the module you need.
"""

__all__ = ["settings", "catalog", "records", "keys", "trusted", "ingest", "stages", "baseline_release", "serving", "web",
           "services", "app", "agents", "timers"]
