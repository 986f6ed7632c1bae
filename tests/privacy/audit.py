"""The audit's engine: worst-case neighbouring streams through the real pipeline, and a Neyman–Pearson distinguisher.

Every statistic privrec releases is ``post(C X + Z)``: the exact per-tick statistic ``X`` (what ingest and the fold
wrote to the trusted store), a public linear map, and Gaussian noise that does not depend on the data (keyed by the
secret seed). Two neighbouring streams ``A`` and ``B`` (the stated relation: same arrivals, contexts and shown
items; one user's, or one interaction's, private part differs) therefore give releases ``y_A = m_A + N`` and
``y_B = m_B + N`` with the same noise law, and the most powerful test between them (Neyman–Pearson) thresholds
``w . y`` with ``w = Sigma^{-1} (m_B - m_A)``: its Gaussian-DP ``mu`` is ``w . (m_B - m_A) / sd(w . N)``.

:func:`run_stream` drives the real code for one stream — ``parse_batch`` inside ``UserIngestProcessor`` /
``IngestProcessor``, the fold (:class:`pipeline.state.userlevel.Folder`, inside :meth:`ReleaseStage.tick`), the release
stage with its own mechanisms — against a real ``redis-server``, and records what each tick handed the mechanisms
(the trusted snapshot the tick read). :class:`StageNeighbours` then re-releases those inputs through the stage's own
``Releaser`` and item mechanism, each trial with another secret seed (the mechanism object the stage built, keyed by
another seed: same calibration, independent noise). :func:`distinguish` estimates ``Sigma`` on training seeds,
checks on test seeds that ``y_B - y_A`` is exactly ``m_B - m_A`` (the noise does not depend on the data: the two
hypotheses differ by a shift), and measures ``mu`` of the fixed test ``w`` on the held-out test seeds.

``--model hierarchy`` (:mod:`models.streaming.hierarchy`) publishes one vector per tick instead: the weighted blocks
``[pool, items, units]`` through one mechanism, unweighted by :meth:`ReleasedHierarchy.from_vector` (a public
per-block scale: post-processing, the same ``mu``). :func:`run_stream` records the exact weighted vector each tick
handed the mechanism (``TrustedStore.snapshot_hierarchy``) and what it published; :class:`HierarchyReleases`
re-releases it with the stage's own mechanism under other seeds (bit for bit with the namespace's seed, checked on
the published blocks), :class:`HierarchyNeighbours` restricts the releases to some blocks and names the public fields
of the released hash that differ between the streams (each is ``mu = inf``).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis
from scipy import stats as sps

from models.accounting import gdp_mu
from models.ground.noise import KeyedNoise
from models.mechanisms import Mechanism
from models.ground.items import ReleasedItems
from models.mechanisms import noise_std
from models.mechanisms.factorization import BLTMechanism, blt_coefficients
from models.mechanisms.participation import toeplitz_matrix
from models.streaming import ReleasedStats, UnitStats
from models.streaming.hierarchy import ReleasedHierarchy
from pipeline.data.catalog import Catalog
from pipeline.ingestion.agents import make_processor
from pipeline.ingestion.shown_lists import ShownListCheck
from pipeline.config.keys import PublicKeys
from pipeline.config.settings import Settings
from pipeline.release.stages import ReleaseStage
from pipeline.state.trusted import TrustedKeys

__all__ = ["Trace", "run_stream", "reseeded", "StageReleases", "StageNeighbours", "HierarchyReleases",
           "HierarchyNeighbours", "Neighbours", "Estimate", "distinguish", "exact_mu", "claimed_mu", "margin", "event",
           "ALPHA", "HIERARCHY_ARRAYS"]

#: One-sided level of the margin: a mechanism that keeps its claim fails the audit with probability <= ALPHA
#: over the choice of seeds (the seeds are fixed, so a given run is deterministic).
ALPHA = 1e-3


def event(i: int, user: str, arm: str, reward: float, context: Sequence[float] | None = None, *,
          shown: Sequence[str] | None = None, kind: str | None = None) -> bytes:
    """One ``interactions`` value, as the HTTP paths and producers write it (``shown``: the list it answers;
    ``kind``: ``"listen"`` for an organic listen)."""
    obj: dict[str, Any] = {"event_id": f"e{i}", "user": user, "arm": arm, "reward": reward, "ts": 1.7e12 + i}
    if kind is not None:
        obj["kind"] = kind
    if context is not None:
        obj["context"] = list(context)
    if shown is not None:
        obj["shown"] = list(shown)
    return json.dumps(obj).encode()


@dataclass
class Trace:
    """What one stream's release ticks handed the mechanisms: the exact statistics each tick read."""

    stage: ReleaseStage
    stats: list[UnitStats]       # per tick: the trusted snapshot (Grams, b, counts) the releaser got
    items: list[np.ndarray]      # per tick: the exact item reward sums (empty without the item term)
    seed: int                    # the namespace's secret noise seed
    published: list[dict[str, np.ndarray]]  # per tick: what the tick published ("b": b_tilde, "items": sums; the
    #                                         hierarchy: its blocks "pool", "items", "units" and their noise stds)
    hierarchy: list[np.ndarray] = field(default_factory=list)  # per tick: the exact weighted hierarchy vector
    public: list[dict[bytes, bytes]] = field(default_factory=list)  # per tick: the released hash but its noisy arrays


#: The released hash's fields that hold the hierarchy's noisy blocks; every other field is public as it is.
HIERARCHY_ARRAYS = (b"a:pool", b"a:items", b"a:units")


def _as_served(client: redis.Redis, settings: Settings, raws: Sequence[bytes]) -> list[bytes]:
    """Where the model requires a server-issued ``rec_id`` (:func:`pipeline.ingestion.shown_lists.rec_id_required`),
    each feedback without one answers the list it names (or its ``arm`` alone), recorded as ``GET /recommend``
    records it; else ``raws``."""
    check = ShownListCheck.for_settings(client, settings)
    if not check.require_rec_id:
        return list(raws)
    keys = check.keys  # the web's namespace (a federated site's worker reads the coordinator's)
    out = []
    for raw in raws:
        ev = json.loads(raw)
        if ev.get("rec_id") is None and ev.get("kind", "feedback") != "listen":
            rec_id, shown = f"audit-{ev['event_id']}", ev.get("shown", [ev["arm"]])
            client.set(keys.recommendation(rec_id), json.dumps({"rec_id": rec_id, "user": ev["user"],
                                                                "items": shown}), ex=86400)
            raw = json.dumps({**ev, "rec_id": rec_id, "shown": shown}).encode()
        out.append(raw)
    return out


def run_stream(client: redis.Redis, settings: Settings, catalog: Catalog,
               ticks: Sequence[Mapping[int, Sequence[bytes]]], *, seed: int,
               stage_type: type[ReleaseStage] = ReleaseStage, allow_dead: bool = False, force: bool = True,
               shown_check: bool = True) -> Trace:
    """Ingest ``ticks`` (per release tick, the events that land on each partition) and release once per tick, as
    the worker does. Every event must be counted, unless ``allow_dead`` (then ingest may dead-letter some).
    ``force`` false: the stage decides whether a tick releases, as the worker's timer lets it — every tick must
    still release (the add/remove relation's public schedule). ``shown_check`` false: ingest without the check of
    feedback lists against the server's record (the code before issue 32: an under-protected control).

    The namespace (``settings.namespace``) must be fresh; its secret noise seed is set to ``seed`` first.
    """
    s = settings
    client.set(TrustedKeys(s.namespace).secret, str(int(seed)))
    proc = make_processor(client, s, catalog)  # the worker's own construction
    if not shown_check:
        proc.shown = None
    stage = stage_type(s, catalog, client)
    n_items = stage.n_items
    offsets: dict[int, int] = {}
    stats: list[UnitStats] = []
    items: list[np.ndarray] = []
    hierarchy: list[np.ndarray] = []
    public: list[dict[bytes, bytes]] = []
    published: list[dict[str, np.ndarray]] = []
    keys = PublicKeys(s.namespace)
    for t, per_partition in enumerate(ticks, start=1):
        for partition, raws in per_partition.items():
            raws = _as_served(client, s, raws)
            start = offsets.get(partition, 0)
            batch = proc.process(partition, list(enumerate(raws, start=start)))
            assert allow_dead or not batch.dead, batch.dead  # every event of the audit is valid
            offsets[partition] = start + len(raws)
        version = stage.tick(force=force)
        assert version == t, (version, t)
        raw = client.hgetall(keys.released)
        if s.hierarchy:  # one vector of weighted blocks (the tick's snapshot: what the mechanism was handed)
            rel = ReleasedHierarchy.from_mapping(raw)
            public.append({k: v for k, v in raw.items() if k not in HIERARCHY_ARRAYS})
            if s.add_remove:  # its count is the pool block's noisy one (post-processing), never the exact one
                assert int(raw[b"count"]) == max(0, round(rel.count)), (raw[b"count"], rel.count)
                del public[-1][b"count"]
            snap, h, _ = stage.store.snapshot_hierarchy(s.partitions, catalog.n_units, catalog.d, stage.layout.dim)
            stats.append(snap)
            hierarchy.append(h)
            items.append(np.zeros(0))
            published.append({"pool": rel.pool, "items": rel.items, "units": rel.units,
                              "std": np.array([rel.std_pool, rel.std_items, rel.std_units])})
            continue
        snap, sums, _ = stage.store.snapshot_items(s.partitions, catalog.n_units, catalog.d, n_items)
        stats.append(snap)
        items.append(sums)
        out = {"b": ReleasedStats.from_mapping(raw).b_tilde}
        rel_items = ReleasedItems.from_mapping(raw)
        if rel_items is not None:
            out["items"] = rel_items.sums
        published.append(out)
    return Trace(stage, stats, items, int(seed), published, hierarchy, public)


def reseeded(mechanism: Mechanism, seed: int) -> Mechanism:
    """The same calibrated mechanism keyed by another secret ``seed`` (user-space wrappers: their inner one)."""
    out = copy.copy(mechanism)
    inner = getattr(mechanism, "inner", None)
    if inner is not None:
        out.inner = reseeded(inner, seed)  # type: ignore[attr-defined]
        return out
    if not hasattr(mechanism, "_source"):
        raise TypeError(f"{type(mechanism).__name__}: no keyed noise source to reseed")
    out.seed = int(seed)  # type: ignore[attr-defined]
    out._source = KeyedNoise(int(seed), int(getattr(mechanism, "stream")))  # type: ignore[attr-defined]
    return out


@dataclass
class Neighbours:
    """Two neighbouring streams as the adversary sees them: the exact values released and a release per seed.

    ``exact_a`` / ``exact_b``: ``(ticks, dim)`` the exact values the mechanism(s) released (the noise-free part);
    ``release_a(seed)`` / ``release_b(seed)``: ``(ticks, dim)`` what was released with the secret seed ``seed``.
    """

    exact_a: np.ndarray
    exact_b: np.ndarray
    release_a: Callable[[int], np.ndarray]
    release_b: Callable[[int], np.ndarray]


class StageReleases:
    """What a :class:`ReleaseStage` publishes over a recorded stream, for any secret seed (cached per seed).

    Per tick: ``"b"``, the bandit statistic ``b_tilde`` exactly as ``Releaser.release`` makes it (the stage's own
    ``Releaser``: ``exact_b_tilde`` of the tick's snapshot, then its mechanism's ``step_to``; the rest of a
    :class:`~models.streaming.ReleasedStats` is the Grams and counts, which :class:`StageNeighbours` checks are
    equal in both streams, and the public noise std), and ``"items"``, the item reward sums as
    ``ReleaseStage._release_items`` steps them through the stage's item mechanism.
    """

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        stage = trace.stage
        self.names = tuple(n for n, m in (("b", stage.mechanism), ("items", stage.item_mechanism)) if m is not None)
        self.exact = {"b": np.array([stage.releaser.exact_b_tilde(st) for st in trace.stats]),
                      "items": np.array(trace.items)}
        self._cache: dict[int, dict[str, np.ndarray]] = {}
        mine = self(trace.seed)  # with the namespace's own seed: exactly what the ticks published
        for t, pub in enumerate(trace.published, start=1):
            for name in self.names:
                if not np.array_equal(mine[name][t - 1], pub[name]):
                    raise AssertionError(f"tick {t}: the re-released {name!r} differs from what the stage published")

    def __call__(self, seed: int) -> dict[str, np.ndarray]:
        hit = self._cache.get(seed)
        if hit is None:
            hit = self._cache[seed] = self._release(seed)
        return hit

    def _release(self, seed: int) -> dict[str, np.ndarray]:
        stage = self.trace.stage
        out: dict[str, np.ndarray] = {}
        for name, mechanism in (("b", stage.releaser.mechanism), ("items", stage.item_mechanism)):
            if mechanism is None:
                continue
            mech = reseeded(mechanism, seed)
            state = mech.init_state()
            rows = []
            for exact in self.exact[name]:
                y, state, _ = mech.step_to(state, exact)
                rows.append(y)
            out[name] = np.array(rows)
        return out


class StageNeighbours(Neighbours):
    """The releases of two recorded streams' stages, restricted to ``statistics`` (``"b"`` and/or ``"items"``)."""

    def __init__(self, a: StageReleases, b: StageReleases, statistics: Sequence[str]) -> None:
        # the public part (exact Grams and counts, released as they are) must not depend on the private change:
        # ``leaks`` names what differs (each is mu = inf)
        self.leaks = sorted({name for sa, sb in zip(a.trace.stats, b.trace.stats)
                             for name, x, y in (("gram", sa.gram, sb.gram), ("count", sa.count, sb.count))
                             if not np.array_equal(x, y)})
        names = tuple(statistics)
        missing = [n for n in names if n not in a.names]
        if missing:
            raise ValueError(f"the stage releases {a.names}, not {missing}")

        def cat(parts: dict[str, np.ndarray]) -> np.ndarray:
            return np.concatenate([parts[n] for n in names], axis=1)

        super().__init__(cat(a.exact), cat(b.exact), lambda seed: cat(a(seed)), lambda seed: cat(b(seed)))


class HierarchyReleases:
    """What a ``--model hierarchy`` stage publishes over a recorded stream, for any secret seed (cached per seed).

    Per tick one vector of the layout's weighted blocks (``stage.layout``: ``[pool, items, units]``), the stage's own
    mechanism (``stage.mechanism``, ``blt-exact``) stepped with ``step_to`` over the exact vectors the ticks read, as
    ``ReleaseStage._tick_hierarchy`` does. With the namespace's own seed, :meth:`ReleasedHierarchy.from_vector` of
    these releases (the public unweighting) gives every published block and noise std bit for bit (checked).
    """

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        stage = trace.stage
        if stage.mechanism is None:
            raise ValueError("the hierarchy is released without noise: nothing to audit")
        self.layout = stage.layout
        self.exact = np.array(trace.hierarchy)
        self._cache: dict[int, np.ndarray] = {}
        stds: list[float] = []  # the public noise std of each tick's release (the same for every seed)
        mine = self._cache[trace.seed] = self._release(trace.seed, stds)  # exactly what the ticks published
        for t, (y, std, pub) in enumerate(zip(mine, stds, trace.published), start=1):
            rel = ReleasedHierarchy.from_vector(self.layout, y, std=std, version=t)
            for name, ours in (("pool", rel.pool), ("items", rel.items), ("units", rel.units),
                               ("std", np.array([rel.std_pool, rel.std_items, rel.std_units]))):
                theirs = pub[name]
                if (ours is None) != (theirs is None) or (ours is not None and not np.array_equal(ours, theirs)):
                    raise AssertionError(f"tick {t}: the re-released {name!r} differs from what the stage published")

    def __call__(self, seed: int) -> np.ndarray:
        """``(ticks, layout.dim)``: the weighted vectors released with the secret ``seed``."""
        hit = self._cache.get(seed)
        if hit is None:
            hit = self._cache[seed] = self._release(seed)
        return hit

    def _release(self, seed: int, stds: list[float] | None = None) -> np.ndarray:
        mech = reseeded(self.trace.stage.mechanism, seed)  # type: ignore[arg-type]
        state = mech.init_state()
        rows = []
        for exact in self.exact:
            y, state, _ = mech.step_to(state, exact)
            rows.append(y)
            if stds is not None:
                stds.append(noise_std(mech, state))
        return np.array(rows)

    def columns(self, blocks: Sequence[str]) -> np.ndarray:
        """The released vector's coordinates of ``blocks`` (in the layout's order)."""
        return np.concatenate([np.arange(self.layout.dim)[self.layout.slice(b)] for b in blocks])


class HierarchyNeighbours(Neighbours):
    """Two recorded hierarchy streams' releases restricted to ``blocks`` (``None``: every block that is on).

    ``leaks`` names the released hash's public fields (everything but the noisy blocks: the count of interactions,
    offsets, version, event, ledger, noise stds, schema) that differ between the streams in some tick: each is
    ``mu = inf``.
    """

    def __init__(self, a: HierarchyReleases, b: HierarchyReleases, blocks: Sequence[str] | None = None) -> None:
        if a.layout != b.layout:
            raise ValueError(f"the streams have other layouts: {a.layout} / {b.layout}")
        self.blocks = tuple(a.layout.blocks if blocks is None else blocks)
        self.leaks = sorted({k.decode() for pa, pb in zip(a.trace.public, b.trace.public)
                             for k in pa.keys() | pb.keys() if pa.get(k) != pb.get(k)})
        self.mechanism = a.trace.stage.mechanism
        cols = a.columns(self.blocks)
        super().__init__(a.exact[:, cols], b.exact[:, cols], lambda seed: a(seed)[:, cols],
                         lambda seed: b(seed)[:, cols])


def exact_mu(nb: HierarchyNeighbours) -> float:
    """The exact ``mu`` between two hierarchy neighbours (a cross-check of :func:`distinguish`, not used by the tests).

    The ``blt-exact`` release after ``t`` ticks is ``m_t + eta_t``, ``eta = L z`` with ``L`` the lower-triangular
    Toeplitz matrix of ``blt_coefficients`` and ``z`` i.i.d. ``N(0, scale**2)`` per tick and coordinate (one epoch), so
    ``mu = ||L^-1 (m_B - m_A)||_F / scale``.
    """
    mech = nb.mechanism
    if not isinstance(mech, BLTMechanism):
        raise TypeError(f"exact_mu knows the BLT factorization, not {type(mech).__name__}")
    delta = nb.exact_b - nb.exact_a
    n = delta.shape[0]
    if n > mech.capacity:
        raise ValueError(f"{n} ticks: more than one epoch ({mech.capacity})")
    L = toeplitz_matrix(blt_coefficients(mech.theta, mech.w, mech.capacity))[:n, :n]
    return float(np.linalg.norm(np.linalg.solve(L, delta)) / mech.scale)


@dataclass(frozen=True)
class Estimate:
    """The distinguisher's result: ``mu`` of its test on held-out seeds, and how it was obtained."""

    mu: float
    n_train: int
    n_test: int
    dim: int
    shift: float  # ||m_B - m_A||: the exact difference of the released means (over every tick and coordinate)

    def margin(self, mu_claimed: float, alpha: float = ALPHA) -> float:
        return margin(mu_claimed, self.n_test, alpha)


def margin(mu_claimed: float, n_test: int, alpha: float = ALPHA) -> float:
    """How far above ``mu_claimed`` the estimate may land by Monte-Carlo error alone (one-sided, level ``alpha``).

    ``mu_hat = w.delta / s_hat`` with ``w`` and ``delta`` fixed before the test seeds are drawn, so for a
    mechanism whose ``mu`` (of this ``w``) is at most ``mu_claimed``, ``mu_hat > mu_claimed / q`` only if
    ``s_hat / s < q``; ``(n - 1) s_hat**2 / s**2`` is chi-square with ``n - 1`` degrees of freedom, and
    ``q = sqrt(chi2.ppf(alpha, n - 1) / (n - 1))``.
    """
    q = math.sqrt(sps.chi2.ppf(alpha, n_test - 1) / (n_test - 1))
    return mu_claimed * (1.0 / q - 1.0)


def distinguish(nb: Neighbours, train: Sequence[int], test: Sequence[int], *, check: int = 100,
                noise_factor: float = 1.0) -> Estimate:
    """Neyman–Pearson distinguisher between ``A`` and ``B``; ``mu`` measured on the ``test`` seeds.

    ``noise_factor`` scales every release's noise (``0.5``: the under-noised control — the same releases with
    ``sigma / 2``). The first ``check`` test seeds also release ``B`` and check ``y_B - y_A = m_B - m_A``.
    """
    m_a, m_b = nb.exact_a.reshape(-1), nb.exact_b.reshape(-1)
    delta = m_b - m_a

    def noise(seed: int) -> np.ndarray:
        return noise_factor * (nb.release_a(seed).reshape(-1) - m_a)

    z_train = np.array([noise(s) for s in train])
    var = z_train.var(axis=0)
    free = var <= 1e-24 * max(1.0, float(var.max()))  # coordinates released without noise
    if np.any(np.abs(delta[free]) > 1e-12):
        return Estimate(math.inf, len(train), len(test), int(delta.size), float(np.linalg.norm(delta)))
    keep = ~free
    cov = np.cov(z_train[:, keep], rowvar=False)
    w = np.linalg.solve(np.atleast_2d(cov), delta[keep])
    stat = []
    for i, s in enumerate(test):
        y_a = nb.release_a(s).reshape(-1)
        if i < check:
            shift = nb.release_b(s).reshape(-1) - y_a
            scale = 1.0 + float(np.abs(y_a).max())
            if not np.allclose(shift, delta, rtol=0, atol=1e-9 * scale):
                raise AssertionError(f"seed {s}: y_B - y_A is not the exact difference m_B - m_A (max error "
                                     f"{np.abs(shift - delta).max():.3g}): the noise depends on the data")
        stat.append(float(w @ (noise_factor * (y_a - m_a))[keep]))
    sd = float(np.std(stat, ddof=1))
    return Estimate(float(w @ delta[keep]) / sd, len(train), len(test), int(keep.sum()), float(np.linalg.norm(delta)))


def claimed_mu(statement: dict[str, Any], statistic: str | None = None) -> float:
    """The ``mu`` a published statement claims: for one statistic (``"b"`` / ``"items"``; the hierarchy's blocks
    ``"pool"`` / ``"items"`` / ``"units"``) or, ``None``, all of them (composed in quadrature).

    Reads ``statement["statistics"]`` (per statistic ``mu_at_cap``, or ``mu`` at event level) when the statement
    has it; else
    ``mu_at_cap`` / ``epsilon`` + ``delta`` (the whole release) and, for one statistic of a composed release,
    ``composition[<statistic>]["epsilon"]`` (``"bandit"`` for ``b``).
    """
    per = statement.get("statistics")
    if per:  # the noisy statistics' own mu (entries without one, e.g. the Grams, are released as public)
        mus = {e["name"]: float(e.get("mu_at_cap", e.get("mu"))) for e in per if "mu_at_cap" in e or "mu" in e}
        if statistic is None:
            return math.sqrt(sum(m * m for m in mus.values()))
        return mus[statistic]
    delta = float(statement["delta"])
    comp = statement.get("composition")
    if statistic is not None and comp is not None:
        return gdp_mu(float(comp["bandit" if statistic == "b" else statistic]["epsilon"]), delta)
    if "mu_at_cap" in statement:
        return float(statement["mu_at_cap"])
    return gdp_mu(float(statement["epsilon"]), delta)
