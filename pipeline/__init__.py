"""pipeline: moves data between Kafka, Redis and the math in ``models``.

Each module has one job (DESIGN §1). The three trust modes share ingest → release → solve → serve; a
mode decides only where the statistics are perturbed and how the noisy parts are aggregated:
global — ``ingest`` + ``stages`` (the server's mechanism); federated — ``sites`` (each site runs the
global stages on its users) + ``federation`` / ``coordinator`` (sums or consensus of the sites'
releases); local — ``localmode`` (sums of the devices' reports; the devices run ``models.local``).

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
- ``localmode`` / ``local_http`` — local mode (devices add the noise): report ingest, the release of the
  sums of reports, the shuffler; ``POST /report`` and ``GET /local/config`` (serving side).
- ``sites`` / ``federation`` / ``coordinator`` / ``federated_serving`` — federated mode.
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
           "services", "app", "agents", "timers", "localmode", "local_http"]
