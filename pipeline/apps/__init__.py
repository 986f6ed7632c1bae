"""The processes a deployment runs, wiring the flow and the modes together.

Modules
-------
worker_app    the faust application of a worker: registers the ingest task
              (:mod:`pipeline.ingestion.agents`), the leader's tick (:mod:`pipeline.release.timers`),
              and the mode's parts
worker        ``python -m pipeline.apps.worker``: one faust worker
web           ``python -m pipeline.apps.web``: the HTTP API and the page (``static/``)
"""

__all__ = ["web", "worker", "worker_app"]
