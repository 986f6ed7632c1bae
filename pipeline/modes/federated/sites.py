"""A federated site's worker: the global mode's ingest and release on the site's own users, then sharing.

``privrec up --mode federated --sites M`` starts one worker per site (``PRIVREC_SITE=i``). A site

1. ingests only its own users' events, from its own topic (:func:`pipeline.modes.federated.federation.site_topic`),
   into its own trusted namespace (:func:`pipeline.modes.federated.federation.site_namespace`) — an event of another
   site's user is a dead letter naming the right site;
2. releases its statistics every tick through its own mechanism, keyed by its own secret seed
   (the ordinary :class:`pipeline.release.stages.ReleaseStage`, persisted before published); at user level (the
   default) the release tick first folds each of its users' interactions of the tick, clipped, at most
   ``user_cap`` ticks per user and epoch and within the lifetime budget, into the statistics, and keeps the
   users' ledger in its own namespace (:class:`pipeline.state.userlevel.Folder`, as in global mode) — a user
   belongs to one site, so that ledger is the user's whole history;
3. shares on the schedule (every tick, or ticks 1, 2, 4, ...): star — its latest release to the
   coordinator; decentralized — one consensus round with its neighbours, after which it solves
   ``M y_i`` into its own serving model (:class:`SiteSync`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import faust
import numpy as np
import redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from numpy.typing import NDArray

from models.mechanisms import Mechanism, noise_std
from models.ground.consensus import edges_adjacency, mixing_matrix, parse_edge_list, topology_adjacency
from models.streaming import ReleasedStats
from models.streaming.federated import assign_sites, block_noise_std, is_sync_tick

from ...config.kafkaconn import client_kwargs
from ...config.redisconn import connect
from ...data.catalog import Catalog, UnknownUserError
from .federation import ConsensusSite, FedKeys, decode_message, encode_message, site_namespace, site_topic
from ...config.keys import PublicKeys
from ...data.records import TOPICS
from ...config.settings import Settings
from ...release.stages import ReleaseStage, SolveStage
from ...release.statements import flat_facts, rendered

log = logging.getLogger("privrec.site")

__all__ = ["SiteCatalog", "SiteReleaseStage", "federated_statement", "site_guarantee", "site_settings", "site_adjacency", "SiteSync", "register"]


class SiteCatalog:
    """A catalog that knows only one site's users (the others raise :class:`UnknownUserError`)."""

    def __init__(self, catalog: Catalog, *, site: int, sites: int) -> None:
        self._inner, self.site, self.sites = catalog, int(site), int(sites)
        self.site_of_unit = assign_sites(catalog.n_units, sites)
        self.name = f"{catalog.name}/site{site}"

    def __getattr__(self, name: str) -> Any:  # everything else is the catalog's
        return getattr(self._inner, name)

    def unit_of(self, user: str) -> int:
        unit = self._inner.unit_of(user)
        owner = int(self.site_of_unit[unit])
        if owner != self.site:
            raise UnknownUserError(f"user {user!r} belongs to site {owner}, not to site {self.site} "
                                   f"(send it to topic {site_topic(owner)!r})")
        return unit

    @property
    def fingerprint(self) -> str:
        return str(self._inner.fingerprint)


class SiteReleaseStage(ReleaseStage):
    """The release stage of a site: its mechanism covers its own units only (its own seed, in its namespace).

    With user-space noise the site's noise sits on its own units' blocks; the sum over the sites
    then has one noise draw per unit block, as the global mode has (models.streaming.federated).
    """

    def make_mechanism(self, units: np.ndarray) -> Mechanism:
        s = self.settings
        assert s.site is not None
        own = assign_sites(self.catalog.n_units, s.sites) == s.site
        return super().make_mechanism(own)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.statement = federated_statement(self.settings, self.statement)


def site_guarantee(settings: Settings, catalog: Catalog) -> dict[str, Any]:
    """A site's privacy statement computed from the public calibration alone (for the coordinator and the web).

    The same calibration as :meth:`SiteReleaseStage.make_mechanism` (the seed does not enter the statement): at
    user level (the default) the mechanism's multi-participation factor for ``user_cap`` ticks, the user-level
    statement and the lifetime budget of the global mode (:func:`~pipeline.release.statements.user_level_statement`,
    :func:`~pipeline.config.ledger.with_budget`).
    """
    from models.ground.graphs import sensitivities
    from models.mechanisms import make_mechanism
    from models.mechanisms.participation import participation_bound, participation_factor, replace_sensitivity

    from ...config.ledger import with_budget
    from ...release.stages import projection
    from ...release.statements import privacy_statement, user_level_statement

    s = settings
    mech: Mechanism | None = None
    if s.private:
        _, V = projection(s.algorithm, catalog.W)
        own = assign_sites(catalog.n_units, s.sites) == (s.site or 0)

        def build(scale: float) -> Mechanism:
            scale *= replace_sensitivity(s.clips[0], signed=True)  # neighbours replace a clipped contribution
            return make_mechanism(s.mechanism, dim=catalog.n_units * catalog.d,
                                  sensitivity=scale * float(sensitivities(V)[own].max()), epsilon=s.epsilon,
                                  delta=s.delta, horizon=s.tree_ticks, seed=0,  # the event ignores the seed
                                  sensitivity_l1=scale * float(np.abs(V[:, own]).sum(axis=0).max()
                                                               * math.sqrt(catalog.d)),
                                  mixing=V * own[None, :], block_dim=catalog.d)

        mech = build(participation_factor(build(1.0), s.user_cap) if s.user_level else 1.0)
    statement = privacy_statement(s, mech)
    statement["relation"] = s.relation  # replace: who arrived at a site, and when, is public
    if not s.user_level:
        return statement
    cap = s.user_cap

    def ratio(k: int) -> float:  # B(k) / B(cap), as ReleaseStage.participation_ratio (a site has no item sums)
        if mech is None:
            return min(k, cap) ** 2 / cap**2
        return participation_bound(mech, min(k, cap)) / participation_bound(mech, cap)

    return with_budget(user_level_statement(s, statement, ratio, mech), s.lifetime_budget, s.delta)


def federated_statement(settings: Settings, site_statement: dict[str, Any]) -> dict[str, Any]:
    """What a federated deployment guarantees: each site's mechanism over its own users, and who sees what."""
    star = settings.topology == "star"
    out = dict(site_statement)
    if not settings.private:
        per_site = "none: epsilon = inf, sites share their statistics without noise"
    elif settings.user_level:
        budget = settings.lifetime_budget
        per_site = (f"per epoch of {settings.tree_ticks} release ticks, every release a site ever shares is "
                    f"(epsilon, delta)-DP with respect to everything one of its users contributed (user level, "
                    f"replace): the site's fold sums and clips each user's interactions of a tick and counts at "
                    f"most {settings.user_cap} ticks per user and epoch (user_cap); its ledger keeps each user's "
                    f"spent budget over the epochs and stops learning from a user before it would exceed "
                    + (f"epsilon {budget:g} (user_budget)" if math.isfinite(budget) else "the user_budget (none set)")
                    + "; a user belongs to one site (a public rule), so that site's ledger is their whole history "
                      "and their contributions touch that site's releases only (parallel composition); everything "
                      "the coordinator and the other sites compute is post-processing")
    else:
        per_site = ("every release a site ever shares is (epsilon, delta)-DP with respect to one interaction of "
                    "one of its users (event level, replace-one); sites hold disjoint users, so one interaction "
                    "touches one site's releases only (parallel composition); everything the coordinator and "
                    "the other sites compute is post-processing")
    out.update({
        "mode": "federated",
        "sites": settings.sites,
        "topology": settings.topology,
        "schedule": settings.fed_schedule,
        "site": settings.site,
        "trust": ("each site sees its own users' raw feedback; the coordinator and the other sites see only "
                  "the site's released statistics (its noisy b_tilde, and the public Grams and counts of its "
                  "units)" + ("" if star else "; neighbours exchange consensus states, which are mixtures of "
                              "released statistics (post-processing)")),
        "per_site": per_site,
        **rendered(flat_facts(settings, float(out["epsilon"]) if out.get("private") else math.inf,
                              float(out.get("delta", settings.delta)),
                              user_level=out.get("unit") == "user", federated=True)),
    })
    return out


def site_settings(settings: Settings, site: int) -> Settings:
    """The settings a site runs with: its own namespace (trusted keys, noise seed, releases)."""
    return settings.replace(namespace=site_namespace(settings.namespace, site), site=site)


def site_adjacency(settings: Settings) -> NDArray[np.float64]:
    """The site graph of ``settings.topology`` (a name, or an edge-list file)."""
    if settings.topology in ("star", "ring", "complete"):
        return topology_adjacency(settings.topology, settings.sites)
    return edges_adjacency(parse_edge_list(Path(settings.topology).read_text()), settings.sites)


@dataclass
class SiteSync:
    """One site's sharing step, after each release tick (blocking Redis I/O: run it in a thread).

    :meth:`step` returns the messages to send on ``federated-updates`` (bytes); the caller sends
    them and then calls :meth:`sent` for a star release. Nothing is sent twice in a row for the
    same release version, and a consensus round's message is fixed once written.
    """

    settings: Settings          # the site's settings (site namespace)
    catalog: Catalog
    client: redis.Redis
    release: ReleaseStage

    def __post_init__(self) -> None:
        s = self.settings
        assert s.site is not None
        self.site = s.site
        self.keys = FedKeys(s.namespace)
        self.public = PublicKeys(s.namespace)
        self.star = s.topology == "star"
        self.n_units, self.d = self.catalog.n_units, self.catalog.d
        self.consensus: ConsensusSite | None = None
        if not self.star:
            P = mixing_matrix(site_adjacency(s), s.consensus_kappa)
            self.consensus = ConsensusSite(self.client, s.namespace, site=self.site, P=P, n_units=self.n_units,
                                           d=self.d, structure=self.release.structure)
            self.solver = SolveStage(s, self.client, self.release.statement)
        self._resend_open_round = True
        # the timer thread (step) and the inbox (receive) both advance rounds: one at a time
        self._lock = threading.Lock()

    def _latest_release(self) -> ReleasedStats | None:
        raw = self.client.hgetall(self.public.released)
        return None if not raw else ReleasedStats.from_mapping(raw)

    def _block_std(self) -> NDArray[np.float64]:
        mech = self.release.mechanism
        state = None if mech is None else self.release.store.load_noise_state(mech)
        return block_noise_std(mech, state, self.n_units)

    def step(self) -> list[bytes]:
        with self._lock:
            return self._step()

    def _step(self) -> list[bytes]:
        """Share if the schedule says so; decentralized: also finish a round and serve its view.

        The schedule runs on the site's own tick clock (``ticks``, persisted): every tick, or ticks
        1, 2, 4, 8, ... (doubling). Star: the latest release, if newer than the last one sent.
        Decentralized: a new consensus round (rounds keep mixing when no new data arrives, so the
        views converge; a round waits for every neighbour's state of the same round).
        """
        rel = self._latest_release()
        if rel is None:
            return []
        t = int(self.client.hincrby(self.keys.sync, "ticks", 1))
        due = is_sync_tick(t, self.settings.fed_schedule)
        if self.star:
            sent = self.client.hget(self.keys.sync, "sent_version")
            if not due or (sent is not None and int(sent) >= rel.version):
                return []
            return [encode_message("release", site=self.site, version=rel.version, release=rel,
                                   block_std=self._block_std())]
        assert self.consensus is not None
        out: list[bytes] = []
        raw = self.client.hget(self.keys.site, "sent")
        if raw is not None:  # a round is open: its message was fixed (and sent, unless we crashed)
            if self._resend_open_round:
                out.append(raw)
            self._resend_open_round = False
            if not self.consensus.finish_round():
                return out
            self._serve_view()
        self._resend_open_round = False
        if due or self.consensus.round == 0:
            out.append(self.consensus.start_round(rel, self._block_std()))
        return out

    def sent(self, version: int) -> None:
        self.client.hset(self.keys.sync, "sent_version", str(version))

    def receive(self, raw: bytes) -> None:
        """File a message from ``federated-updates`` (decentralized: a neighbour's round state)."""
        if self.consensus is None:
            return
        try:
            msg = decode_message(raw, n_units=self.n_units, d=self.d, sites=self.settings.sites)
        except ValueError as exc:
            log.warning("site %d: ignoring a malformed federated update: %s", self.site, exc)
            return
        with self._lock:
            self.consensus.receive(msg, raw)
            if self.consensus.finish_round():
                self._serve_view()

    def _serve_view(self) -> None:
        """Solve ``M * y_i`` (the site's estimate of the network total) into the site's serving model."""
        assert self.consensus is not None
        view = self.consensus.view()
        m = self.settings.sites
        total = replace(view, V=self.release.V, gram=m * view.gram, b_tilde=m * view.b_tilde,
                        count=np.rint(m * np.asarray(view.count, float)).astype(np.int64),
                        version=self.consensus.round, noise_std=self._network_noise_std())
        self.solver.solve_released(total, version=self.consensus.round)

    def _network_noise_std(self) -> float:
        """Per-coordinate noise std of the network total (public: every site has this calibration and ticks in step).

        User-space noise: the sites' draws sit on disjoint unit blocks, so the total's std is the inner
        std times the largest row norm of ``V`` (as in global mode); otherwise ``sqrt(M)`` times a site's.
        """
        mech = self.release.mechanism
        if mech is None:
            return 0.0
        state = self.release.store.load_noise_state(mech)
        if state is None:
            return 0.0
        inner = getattr(mech, "inner", None)
        if inner is not None:
            return float(noise_std(inner, state) * np.linalg.norm(self.release.V, axis=1).max())
        return math.sqrt(self.settings.sites) * noise_std(mech, state)


def register(app: faust.App, settings: Settings, catalog: Catalog) -> None:
    """A site worker: ingest on the site's topic, the release timer plus sharing, the inbox (decentralized)."""
    from ...ingestion import agents

    assert settings.site is not None
    own = site_settings(settings, settings.site)
    site_catalog = SiteCatalog(catalog, site=settings.site, sites=settings.sites)
    agents.register(app, own, site_catalog, topic=site_topic(settings.site))  # type: ignore[arg-type]
    state: dict[str, Any] = {}

    def build() -> SiteSync:
        if "sync" not in state:
            client = connect(own.redis_url or "redis://127.0.0.1:6379/0")
            stage = SiteReleaseStage(own, site_catalog, client)  # type: ignore[arg-type]
            state["sync"] = SiteSync(own, site_catalog, client, stage)  # type: ignore[arg-type]
        sync: SiteSync = state["sync"]
        return sync

    def tick() -> list[bytes]:
        sync = build()
        sync.release.tick()
        return sync.step()

    @app.timer(settings.tick_seconds)
    async def site_release_and_share() -> None:
        loop = asyncio.get_running_loop()
        try:
            messages = await loop.run_in_executor(None, tick)
            producer = await _producer(state, own)
            for raw in messages:
                await producer.send_and_wait(TOPICS["federated_updates"], key=f"site-{own.site}".encode(), value=raw)
            sync = build()
            if sync.star and messages:
                version = decode_message(messages[-1], n_units=sync.n_units, d=sync.d, sites=own.sites).version
                await loop.run_in_executor(None, sync.sent, version)
        except Exception:  # keep the timer alive; the next tick retries (messages are idempotent)
            log.exception("site %s: release/share tick failed", own.site)

    if settings.topology != "star":
        @app.task
        async def site_inbox() -> None:
            consumer = AIOKafkaConsumer(TOPICS["federated_updates"], **client_kwargs(own),
                                        group_id=f"privrec-{own.namespace}-inbox", auto_offset_reset="earliest",
                                        session_timeout_ms=6000, heartbeat_interval_ms=1000)
            await consumer.start()
            loop = asyncio.get_running_loop()
            try:
                async for record in consumer:
                    if record.value is not None:
                        await loop.run_in_executor(None, build().receive, record.value)
            finally:
                await consumer.stop()


async def _producer(state: dict[str, Any], settings: Settings) -> AIOKafkaProducer:
    producer = state.get("producer")
    if producer is None:
        producer = AIOKafkaProducer(**client_kwargs(settings), linger_ms=5, max_request_size=16 * 1024 * 1024)
        await producer.start()
        state["producer"] = producer
    return producer

