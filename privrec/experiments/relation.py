"""``privrec experiment relation``: what the add/remove relation costs against replace, through the real stages.

The LastFM replay's protocol (``privrec replay lastfm``: the top item of each logged event's pool is recommended,
reward 1 iff it is the logged item, then the logged listen) run offline through the pipeline's own parts — the
worker's ingest processor (:func:`pipeline.ingestion.agents.make_processor`: the fold, the clips, the shown-list
check), :class:`pipeline.release.stages.ReleaseStage`, :class:`pipeline.release.stages.SolveStage` and the serving
:class:`pipeline.serve.serving.Recommender` — on a redis-server of its own, without Kafka or HTTP. Each
``(epsilon, relation, seed)`` is a fresh namespace whose secret noise seed is ``seed``: the two relations see the
same events *and* the same noise keys, so any difference in the reward is the relation's.

What differs between the relations (docs/privacy.md): under add/remove the stage releases every tick whatever
arrived and publishes the pool block's noisy count instead of the exact one; the noise is the same (calibrated to
the larger of the two differences). ``per_tick`` events make one release tick (the live replay at its default rate
makes about 100 per one-second tick).

Writes ``relation.json`` and ``relation.md``: the reward ratio to random play per epsilon, relation and seed.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RelationConfig", "run_relation", "replay_through_stages"]

RELATIONS = ("add-remove", "replace")


@dataclass(frozen=True)
class RelationConfig:
    events: int = 5000
    start: int = 0
    epsilons: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    seeds: tuple[int, ...] = (1, 2)
    per_tick: int = 100
    data_dir: str | None = None
    relations: tuple[str, ...] = field(default=RELATIONS)

    def __post_init__(self) -> None:
        if self.events < 1 or self.per_tick < 1 or self.start < 0:
            raise ValueError(f"`events` and `per_tick` must be positive and `start` non-negative, got {self.events}, "
                             f"{self.per_tick}, {self.start}.")
        if not self.epsilons or any(not e > 0 for e in self.epsilons):
            raise ValueError(f"`epsilons` must be positive (inf: no noise), got {self.epsilons}.")
        if not self.seeds:
            raise ValueError("`seeds` must name at least one noise seed.")
        unknown = set(self.relations) - set(RELATIONS)
        if unknown or not self.relations:
            raise ValueError(f"`relations` must be among {RELATIONS}, got {self.relations}.")


def replay_through_stages(redis_url: str, events: Sequence[Any], *, epsilon: float, relation: str, seed: int,
                          per_tick: int, data_dir: str | None, namespace: str) -> float:
    """The replay's reward ratio to random play for ``events`` (:class:`producers.lastfm` events: ``user``, ``arm``,
    ``pool``) through the real ingest, release, solve and serving of a stack with these settings."""
    import redis

    from pipeline.config.keys import partition_of
    from pipeline.config.settings import Settings
    from pipeline.data.catalog import load_catalog
    from pipeline.ingestion.agents import make_processor
    from pipeline.release.stages import ReleaseStage, SolveStage
    from pipeline.serve.serving import Recommender
    from pipeline.state.trusted import TrustedKeys

    client = redis.Redis.from_url(redis_url)
    s = Settings(catalog="lastfm", data_dir=data_dir, epsilon=epsilon, privacy_relation=relation, kafka=None,
                 namespace=namespace, redis_url=redis_url)
    catalog = load_catalog(s)
    client.set(TrustedKeys(namespace).secret, str(int(seed)))  # the same noise keys for every relation
    proc = make_processor(client, s, catalog)
    stage, rec = ReleaseStage(s, catalog, client), Recommender(client, namespace, catalog)
    solve = SolveStage(s, client, stage.statement, catalog)
    stage.tick(force=True)
    solve.run()
    pending: dict[int, list[bytes]] = {}
    offsets: dict[int, int] = {}
    reward = random_reward = 0.0
    for i, ev in enumerate(events, start=1):
        top = rec.recommend(ev.user, list(ev.pool), 1)["items"][0]["item"]
        r = 1.0 if top == ev.arm else 0.0
        reward += r
        random_reward += 1.0 / len(ev.pool)
        part = pending.setdefault(partition_of(ev.user, s.partitions), [])
        part.append(json.dumps({"event_id": f"f{i}", "user": ev.user, "arm": top, "reward": r, "ts": 1.7e12 + i,
                                "shown": [top]}).encode())  # the hierarchy takes no rec_id: no Gram is released
        part.append(json.dumps({"event_id": f"l{i}", "user": ev.user, "arm": ev.arm, "reward": 1.0,
                                "ts": 1.7e12 + i, "kind": "listen"}).encode())  # the logged listen, every event
        if i % per_tick == 0 or i == len(events):
            for p, raws in pending.items():
                first = offsets.get(p, 0)
                batch = proc.process(p, list(enumerate(raws, start=first)))
                if batch.dead:
                    raise RuntimeError(f"ingest refused replay events: {batch.dead[:3]}")
                offsets[p] = first + len(raws)
            pending.clear()
            stage.tick()
            solve.run()
    client.close()
    return reward / random_reward


def run_relation(cfg: RelationConfig, out: Path, *, progress: Callable[[int, int], None] | None = None
                 ) -> dict[str, Any]:
    """Every ``(epsilon, relation, seed)`` of ``cfg`` on one redis-server of its own; writes the JSON and Markdown."""
    from pipeline import services
    from producers.lastfm import load_catalog as load_lastfm

    from .runner import machine_info

    t0 = time.perf_counter()
    info = machine_info()
    lastfm = load_lastfm(cfg.data_dir, progress=False)
    events = list(lastfm.events(limit=cfg.events, start=cfg.start))
    cells = [(e, rel, seed) for e in cfg.epsilons for rel in cfg.relations for seed in cfg.seeds]
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="privrec-relation-") as tmp:
        handle = services.start_redis(tmp, appendonly=False)
        try:
            for done, (eps, rel, seed) in enumerate(cells, start=1):
                ratio = replay_through_stages(handle.url, events, epsilon=eps, relation=rel, seed=seed,
                                              per_tick=cfg.per_tick, data_dir=cfg.data_dir,
                                              namespace=f"relation-{done}")
                results.setdefault(_eps(eps), {}).setdefault(rel, []).append(ratio)
                if progress is not None:
                    progress(done, len(cells))
        finally:
            services.stop(handle)
    doc = {"config": {**asdict(cfg), "epsilons": [_eps(e) for e in cfg.epsilons]}, "events": len(events),
           "results": results, "machine": info, "python_speed_us_after": machine_info()["python_speed_us"],
           "seconds": time.perf_counter() - t0}
    out.mkdir(parents=True, exist_ok=True)
    (out / "relation.json").write_text(json.dumps(doc, indent=2))
    (out / "relation.md").write_text(_markdown(doc))
    return doc


def _eps(e: float) -> str:
    return "inf" if math.isinf(e) else f"{e:g}"


def _markdown(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    rels = cfg["relations"]
    lines = [f"LastFM events {cfg['start']:,}–{cfg['start'] + doc['events']:,}, through the real ingest, release, "
             f"solve and serving ({cfg['per_tick']} events per release tick); reward ratio to random play, per "
             f"noise seed {cfg['seeds']} (the same noise keys for both relations). Yardstick "
             f"{doc['machine']['python_speed_us']} / {doc['python_speed_us_after']} us; {doc['seconds']:.0f} s.", "",
             "| epsilon | " + " | ".join(rels) + " | difference |", "|---|" + "---|" * (len(rels) + 1)]
    for eps, row in doc["results"].items():
        cells = [", ".join(f"{v:.3f}" for v in row.get(r, [])) for r in rels]
        diff = (max(abs(a - b) for a, b in zip(row[rels[0]], row[rels[-1]]))
                if len(rels) > 1 and rels[0] in row and rels[-1] in row else float("nan"))
        lines.append(f"| {eps} | " + " | ".join(cells) + f" | {diff:.3f} |")
    return "\n".join(lines) + "\n"
