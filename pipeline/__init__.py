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
- ``app`` / ``agents`` / ``timers`` / ``worker`` — the faust worker (``python -m pipeline.worker``).
- ``services`` — start, probe and stop the embedded Tansu broker and ``redis-server``.

Submodules are not imported here, so ``import pipeline`` stays cheap and importing the
serving code never loads the trusted store; import the module you need.
"""

__all__ = ["settings", "catalog", "records", "keys", "trusted", "ingest", "stages", "baseline_release", "serving", "web", "services"]
