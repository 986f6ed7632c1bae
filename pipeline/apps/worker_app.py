"""The faust application of a privrec worker.

``app`` is built from the environment settings (:class:`pipeline.config.settings.Settings`;
``privrec up`` sets them for each worker it starts). It owns the worker
lifecycle, the leader election and the leader-only release/solve timer
(:mod:`pipeline.release.timers`); ingest runs as an app task (:mod:`pipeline.ingestion.agents`).
Both are registered by :func:`build_worker_app`, which receives everything they
need: the app imports them, never the reverse, and importing this module
starts nothing.

Why ingest is a batch consumer task rather than a per-event faust agent:
measured on this machine (deploy/NOTES-broker.md), faust's per-event stream
tops out at ~8–9k events/s (three event-loop iterations and two task
creations per event, whatever the batch size of ``stream.take``), while an
aiokafka ``getmany`` loop inside the same worker runs at ~78k/s. Idempotence
does not depend on it: the processed offset of each partition is stored in
Redis atomically with the statistics it produced.

Wiring traps (all measured, see the notes): the faust CLI re-enables the web
server on 0.0.0.0:6066, so workers start through :mod:`pipeline.apps.worker`;
``exactly_once`` needs transactions Tansu does not support; group joins take
``session_timeout / 2``, hence the 6 s session timeout.
"""

from __future__ import annotations

import os
from pathlib import Path

import faust

from ..ingestion import agents
from ..serve import items_live
from ..modes.local import localmode
from ..modes.federated import sites
from ..release import timers
from ..data.catalog import load_catalog
from ..config.kafkaconn import faust_credentials
from ..config.metrics import WorkerMetrics, serve_metrics
from ..config.settings import Settings
from ..state.foldround import OwnedPartitions

__all__ = ["create_app", "build_worker_app"]


def create_app(settings: Settings, *, state_dir: Path | None = None, web_port: int | None = None) -> faust.App:
    """A faust app for ``settings`` (memory store, at-least-once, 6 s sessions)."""
    if settings.kafka is None:
        raise ValueError("setting `kafka` (KAFKA_BOOTSTRAP) is required to run a worker")
    datadir = (state_dir or Path(os.environ.get("PRIVREC_STATE_DIR", ".privrec"))) / "faust"
    return faust.App(
        f"privrec-{settings.namespace}",
        broker=f"kafka://{settings.kafka}",
        broker_credentials=faust_credentials(settings),
        store="memory://",
        processing_guarantee="at_least_once",
        broker_session_timeout=6.0,
        broker_rebalance_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=1.0,
        topic_partitions=settings.partitions,
        consumer_auto_offset_reset="earliest",
        web_enabled=web_port is not None,
        web_port=web_port or 6066,
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        datadir=str(datadir),
        autodiscover=False,
    )


def build_worker_app(settings: Settings | None = None) -> faust.App:
    """The worker's app: settings from the environment, the catalog, ingest and the release timer."""
    settings = settings or Settings.from_mapping({})
    catalog = load_catalog(settings)
    web = os.environ.get("PRIVREC_WEB_PORT")
    app = create_app(settings, web_port=int(web) if web else None)
    if settings.mode == "federated":
        # a site: ingest and release on its own users, then share (pipeline.modes.federated.sites); the star's
        # coordinator is its own process (pipeline.modes.federated.coordinator)
        if settings.site is None:
            raise ValueError("setting `site` (PRIVREC_SITE) is required to run a federated site's worker")
        sites.register(app, settings, catalog)
        return app
    # the worker's own Prometheus endpoint (its URL goes into the worker's ops record): loopback on a free port
    # unless PRIVREC_METRICS_ADDR / PRIVREC_METRICS_PORT say otherwise (a container exposes 0.0.0.0:<port>)
    worker_metrics = WorkerMetrics()
    url = serve_metrics(worker_metrics, _metrics_port(), os.environ.get("PRIVREC_METRICS_ADDR", "127.0.0.1"))
    if settings.mode == "local":  # reports in place of events; the devices add the noise
        localmode.register(app, settings, catalog, metrics=worker_metrics, metrics_url=url)
        return app
    owned = OwnedPartitions()  # ingest's assignment: the partitions this worker folds in a fold round
    agents.register(app, settings, catalog, metrics=worker_metrics, metrics_url=url, owned=owned)
    items_live.register(app, settings, catalog)  # a catalog directory: follow the items topic
    timers.register(app, settings, catalog, worker_metrics, owned=owned)
    return app


def _metrics_port() -> int:
    text = os.environ.get("PRIVREC_METRICS_PORT", "0")
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ValueError(f"PRIVREC_METRICS_PORT must be a port number in [0, 65535] (0: a free port), got {text!r}")
    return port
