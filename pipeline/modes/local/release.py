"""Local mode's release: the partitions' analyzer states summed and published (no server noise: the devices added
it), through the global mode's release sequence (:func:`pipeline.release.stages.unchanged`, then
:func:`pipeline.release.stages.persist_and_publish`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import redis

from models.accounting import NoNoiseEvent, event_to_dict
from models.ground.items import ReleasedItems
from models.local import LocalConfig
from models.local.analyzer import merge, released_stats

from ...config.settings import Settings
from ...data.catalog import Catalog
from ...release.stages import persist_and_publish, projection, unchanged
from ...state.trusted import TrustedStore
from .ingest import local_config, read_shard
from .local_http import local_statement

__all__ = ["LocalReleaseStage"]


@dataclass
class LocalReleaseStage:
    """Leader-only: the partitions' sums of reports → the released statistics (no server noise)."""

    settings: Settings
    catalog: Catalog
    client: redis.Redis
    config: LocalConfig = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.store = TrustedStore(self.client, s.namespace)
        self.store.ensure_config(s.model_config() | {"catalog_fingerprint": self.catalog.fingerprint})
        self.config = local_config(s, self.catalog.d)
        self.structure, self.V = projection(s.algorithm, self.catalog.W)
        self.statement = local_statement(self.config)

    def recover(self) -> int:
        """Publish a release that was persisted but not yet published (after a crash)."""
        return self.store.publish()

    def tick(self, *, force: bool = False) -> int | None:
        """Release the summed shards as of now; ``None`` if no report arrived since the last release."""
        self.recover()
        c = self.catalog
        shards = [read_shard(self.store, p, c) for p in range(self.settings.partitions)]
        # codewords: population-wide batches, every unit serves the population's model (count: as counted)
        total = merge([state for state, _ in shards], n_units=c.n_units, d=c.d, population=bool(self.config.codewords))
        if unchanged(self.store, int(total.count.sum()), force=force):
            return None
        released = released_stats(total, self.structure, self.V, self.store.pending_version() + 1)
        event = json.dumps(event_to_dict(NoNoiseEvent()))  # the server spends nothing: the devices add the noise
        # the item term: the sums of the item reports' estimates, released as they are (the devices added the noise)
        items = None if total.items is None else (None, ReleasedItems(total.items, total=total.items_n,
                                                                      noise_std=float(np.sqrt(total.items_var))
                                                                      ).to_mapping())
        offsets = [0 if offset is None else offset for _, offset in shards]
        return persist_and_publish(self.store, None, released, event, offsets, items)
