"""Local mode's worker: the analyzer's ingest on the reports (or the shuffler service's batches) and the release timer.

Devices (the page, :class:`models.local.LocalClient`) send reports to ``ldp-reports`` (key = user, through
``POST /report``), or — with shuffling — seal them to the analyzer's key and send them to the shuffler service
(:mod:`pipeline.modes.local.shuffler_service`), which produces stripped, shuffled batches to ``ldp-shuffled``. The
global mode's flow runs on them:

1. **ingest** (:mod:`pipeline.modes.local.ingest`, run by :func:`pipeline.ingestion.agents.register`): each
   partition's messages are decoded and folded by the analyzer (:class:`models.local.analyzer.Analyzer`, the same
   fold the offline twin runs) into the partition's sums, committed with its next offset in one Lua script;
2. **release** (:class:`pipeline.modes.local.release.LocalReleaseStage`): sums the partitions and publishes them,
   with the public noise std of the sum; the server adds no noise (the devices did);
3. **solve** and **serve**: unchanged.
"""

from __future__ import annotations

from typing import Any

from ...config.redisconn import connect
from ...config.settings import Settings
from ...data.catalog import Catalog
from ...ingestion import agents
from ...release import timers
from .esa import KEY_ENV, analyzer_key
from .ingest import BatchIngestProcessor, LocalIngest, ReportIngestProcessor, local_config, report_topic
from .local_http import catalog_codebook
from .release import LocalReleaseStage

__all__ = ["register", "RELEASE_POLL_S"]

#: How often local mode's leader looks for newly folded reports (at most; ``tick_seconds`` if shorter). A release
#: spends nothing here (the devices added the noise) and happens only when the folded count has changed
#: (:meth:`LocalReleaseStage.tick`), so each shuffled batch is served within this long of its fold rather than up to
#: a release tick later. The offline twin solves at each batch's close (:class:`models.local.policy.LocalItemUCB`);
#: held out (docs/local-measurements.md), that lag cost the tagged catalog 0.1-0.2x random play at epsilon >= 2.
RELEASE_POLL_S = 0.25


def register(app: Any, settings: Settings, catalog: Catalog, *, metrics: Any = None, metrics_url: str | None = None
             ) -> None:
    """Local mode's worker: the ingest task on the reports (or the shuffler's batches), the release timer."""
    config = local_config(settings, catalog.d)
    client = connect(settings.redis_url or "redis://127.0.0.1:6379/0")
    processor: LocalIngest
    if settings.shuffle_batch:
        key = analyzer_key()  # the worker is the analyzer: it holds the key that opens the sealed reports
        if key is None:
            raise ValueError(f"`shuffle_batch` ({settings.shuffle_batch}) needs the analyzer's key in {KEY_ENV}: the "
                             f"shuffler is its own service (pipeline.modes.local.shuffler_service), which `privrec "
                             f"up --mode local --shuffle-batch n` starts with the key pair")
        codebook = (catalog_codebook(catalog, config.codewords, bool(settings.local_item_term))
                    if config.codewords else None)
        processor = BatchIngestProcessor(client, settings.namespace, catalog, config, key, codebook=codebook,
                                         item_term=bool(settings.local_item_term))
    else:
        processor = ReportIngestProcessor(client, settings.namespace, catalog, config)
    agents.register(app, settings, catalog, topic=report_topic(settings), metrics=metrics, metrics_url=metrics_url,
                    processor=processor)
    timers.register(app, settings, catalog, metrics, release=LocalReleaseStage,
                    interval=min(settings.tick_seconds, RELEASE_POLL_S))
