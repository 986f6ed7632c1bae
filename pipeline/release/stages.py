"""The release and solve stages (leader-only), as plain classes the faust timers call.

Release (the privacy boundary of global mode): take a consistent snapshot of
the exact statistics, feed it to the continual-release mechanism as one
tick, **persist the new mechanism state together with the release, then
publish** the release. A crash between the two leaves a pending release that
:meth:`ReleaseStage.recover` publishes as it is: released noise is never
redrawn (and, with keyed noise, could not differ anyway).

Solve: turn the latest released statistics into per-unit serving models
``(theta_u, M_u)`` with a version, written atomically.

The other papers' baselines (``--algorithm ss-*`` / ``dgs-*``) keep one
mechanism per unit (:mod:`pipeline.release.baseline_release`): their release is
already every unit's serving model ``(theta_u, C_u, width_u)`` (post-processing
of the noisy per-unit statistics only), persisted with the per-unit mechanism
states before it is published, and solve copies it to the model keys with
each unit's own ``width``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis
import scipy.sparse as sp

from models.policies.peruser import PerUserLinUCB, ServingModels
from models.accounting import event_to_dict
from models.ground.items import ReleasedItems, popularity_feature
from models.ground.graphs import adjacency_from_w, goblin_projection, sensitivities
from models.mechanisms import Mechanism, TreeState, make_mechanism, noise_std
from models.mechanisms.participation import participation_bound, participation_factor, replace_sensitivity
from models.streaming import ReleasedStats, Releaser, solve
from models.streaming.hierarchy import (HierarchyLayout, ReleasedHierarchy, default_shares, parse_shares,
                                        solve_hierarchy)
from models.streaming.release import SPARSE_STRUCTURES
from models.streaming.solve import public_prior, solve_sparse
from models.streaming.sparse import laplacian_regulariser

from ..config import faults
from .baseline_release import BaselineStateStore, build_baseline, widths_summary
from ..data.catalog import Catalog, item_capacity
from ..config.keys import PublicKeys
from ..config.ledger import LifetimeBudget, with_budget
from ..config.settings import Settings
from ..state.trusted import TrustedStore
from ..state.userlevel import Folder
from ..state.foldround import FoldRounds
from .statements import (HIERARCHY_MECHANISM, ITEM_MECHANISM, hierarchy_statement, privacy_statement,
                         user_level_statement)

__all__ = ["ReleaseStage", "SolveStage", "unchanged", "persist_and_publish", "projection", "hierarchy_layout",
           "is_hierarchy", "HIERARCHY_MECHANISM", "ITEM_MECHANISM"]


def projection(algorithm: str, W: Any) -> tuple[str, Any]:
    """``(structure, V)`` of an algorithm over a catalog's ``W`` (the per-unit baselines: ``linucb``'s).

    A sparse ``W`` (every LastFM user, ``graph = "users"``) keeps everything sparse: CoLin is ``sparse-kron``
    with ``V = W``; GOB.Lin is ``laplacian``, ``V = I`` and the regulariser ``I + L``
    (:func:`regulariser`) instead of the dense projection ``(I + L)^{-1/2}`` — the same serving models.
    """
    if sp.issparse(W):
        n = W.shape[0]
        if algorithm == "colin":
            return "sparse-kron", sp.csr_matrix(W, dtype=np.float64)
        return ("laplacian" if algorithm == "goblin" else "linucb"), sp.identity(n, format="csr")
    if algorithm == "linucb" or algorithm.startswith(("ss-", "dgs-")):
        return "linucb", np.eye(W.shape[0])
    if algorithm == "colin":
        return "kron", np.asarray(W, dtype=np.float64)
    return "kron", goblin_projection(adjacency_from_w(W))


def regulariser(algorithm: str, W: Any) -> Any:
    """GOB.Lin over a sparse ``W``: ``I + L`` of the graph ``W`` describes (``None`` for everything else)."""
    if not (sp.issparse(W) and algorithm == "goblin"):
        return None
    A = sp.csr_matrix(W)
    A = ((A + A.T) > 0).astype(np.float64)
    return laplacian_regulariser(A)


#: The hierarchy's noise stream (its mechanism: :data:`~pipeline.release.statements.HIERARCHY_MECHANISM`).
HIERARCHY_STREAM = 11


def hierarchy_layout(settings: Settings, catalog: Catalog) -> HierarchyLayout:
    """The hierarchy's blocks for a catalog: the ``hierarchy_shares`` setting, else the public rule
    (:func:`models.streaming.hierarchy.default_shares`) on the users the catalog knows."""
    shares = (parse_shares(settings.hierarchy_shares) if settings.hierarchy_shares is not None else
              default_shares(users=known_users(catalog), units=catalog.n_units, private=settings.private))
    return HierarchyLayout(d=catalog.d, n_items=item_capacity(catalog), n_units=catalog.n_units, shares=shares)


def known_users(catalog: Catalog) -> int:
    """The users a catalog lists (public): LastFM's 1,892, a directory's users.csv and graph, the synthetic world's."""
    return len(getattr(catalog, "_user_unit", {}))


def hierarchy_features(catalog: Catalog, n_items: int) -> np.ndarray:
    """The catalog's contexts as of now, at most ``n_items`` rows (an open catalog grows; rows it does not have yet
    count as zero contexts, :func:`models.streaming.hierarchy.contribution`)."""
    F = np.asarray(catalog.feature_matrix, dtype=np.float64)
    return F[:n_items]


def local_as_hierarchy(released: ReleasedStats, items: ReleasedItems | None) -> ReleasedHierarchy:
    """Local mode's population-wide release (codewords: every unit holds the population's sum ``b`` of the listens'
    codeword vectors, estimated from the blanketed histogram, with noise std ``noise_std``; ``count`` the reports)
    as the hierarchy's pool block, and its item sums (``--local-item-term``) as the item block: post-processing."""
    b = released.b_tilde.reshape(released.count.shape[0], -1)[0]
    return ReleasedHierarchy.from_sums(b, float(released.count.sum()), released.noise_std,
                                       None if items is None else items.sums,
                                       0.0 if items is None else items.noise_std, released.version)


def is_hierarchy(raw: dict[bytes, bytes]) -> bool:
    """Whether a released hash holds a :class:`~models.streaming.hierarchy.ReleasedHierarchy`."""
    meta = raw.get(b"meta")
    return meta is not None and json.loads(meta).get("schema") == ReleasedHierarchy.SCHEMA


#: The item sums' noise stream (their mechanism: :data:`~pipeline.release.statements.ITEM_MECHANISM`).
ITEM_STREAM = 7
#: Released item sums within this many noise stds of zero count as zero (models.ground.items).
ITEM_THRESHOLD_STDS = 2.0
#: The item term's weight shrinks as ``weight / (1 + (std / ITEM_NOISE_SCALE)**2)`` (models.policies.popularity).
ITEM_NOISE_SCALE = 2.0


def item_term(items: ReleasedItems, weight: float) -> tuple[float, np.ndarray]:
    """``(weight in force, popularity feature)`` of released item sums: the serving model's item term.

    The same rule as :class:`models.policies.PopularityUCB` (the offline twin); public inputs only.
    """
    pop = popularity_feature(items.sums, total=items.total, threshold=ITEM_THRESHOLD_STDS * items.noise_std)
    return weight / (1.0 + (items.noise_std / ITEM_NOISE_SCALE) ** 2), pop


def unchanged(store: TrustedStore, count: int, *, force: bool = False) -> bool:
    """Whether the last persisted release already covers ``count`` interactions (then a tick releases nothing;
    ``force``: never). The release sequence's *compare*, shared by every mode's release stage."""
    last = None if force else store.r.hget(store.keys.pending, "count")
    return last is not None and int(last) == count


def persist_and_publish(store: TrustedStore, state: Any, released: ReleasedStats | ReleasedHierarchy, event: str,
                        offsets: list[int], items: Any = None, ledger: str | None = None, **counts: int | None
                        ) -> int:
    """The release sequence's *persist* then *publish* (a crash in between: :meth:`ReleaseStage.recover` publishes
    it), shared by every mode's release stage; returns the release's version. The arguments are
    :meth:`pipeline.state.trusted.TrustedStore.persist_release`'s."""
    store.persist_release(state, released, event, offsets, items, ledger, **counts)
    faults.point("release-persisted")
    store.publish()
    faults.point("release-published")
    return released.version


@dataclass


@dataclass
class ReleaseStage:
    """Leader-only: one call of :meth:`tick` is one release."""

    settings: Settings
    catalog: Catalog
    client: redis.Redis

    def __post_init__(self) -> None:
        s = self.settings
        self.store = TrustedStore(self.client, s.namespace)
        self.store.ensure_config(s.model_config() | {"catalog_fingerprint": self.catalog.fingerprint})
        self.structure, self.V = projection(s.algorithm, self.catalog.W)
        self.mechanism: Mechanism | None = None
        self.baseline: PerUserLinUCB | None = None
        if s.baseline is not None:
            # per-unit mechanisms of their own (the `mechanism` setting does not apply)
            self.baseline = build_baseline(s, self.catalog, self.store.noise_seed())
            self.baseline_store = BaselineStateStore(self.client, s.namespace)
            self._baseline_version: int | None = -1  # which stored state the in-memory policy holds (-1: none)
        elif s.hierarchy:
            self.layout = hierarchy_layout(s, self.catalog)
            self.mechanism = self.make_hierarchy_mechanism() if s.private else None
        elif s.private:
            self.mechanism = self.make_mechanism(np.ones(self.catalog.n_units, dtype=bool))
        self.releaser = Releaser(structure=self.structure, V=self.V, d=self.catalog.d,
                                 mechanism=None if s.hierarchy else self.mechanism,
                                 Q=regulariser(s.algorithm, self.catalog.W))
        # the item term: each item's reward sum, released beside the bandit statistic (its own mechanism and key)
        self.n_items = item_capacity(self.catalog) if s.item_term else 0
        self.item_mechanism: Mechanism | None = None
        if s.item_term and s.private:
            def items(scale: float) -> Mechanism:
                scale *= replace_sensitivity(s.clips[1], signed=False)  # item rewards are nonnegative
                return make_mechanism(ITEM_MECHANISM, dim=self.n_items, sensitivity=scale, epsilon=s.epsilons()[1],
                                      delta=s.delta, horizon=s.tree_ticks, seed=self.store.noise_seed(),
                                      stream=ITEM_STREAM)

            self.item_mechanism = items(self._user_scale(items(1.0)))
        self.folder: Folder | None = None
        if s.user_level and self.baseline is None:
            hierarchy = None
            if s.hierarchy:
                n_items = self.layout.n_items
                hierarchy = (self.layout, lambda: hierarchy_features(self.catalog, n_items))
            self.folder = Folder(self.client, s.namespace, d=self.catalog.d, n_units=self.catalog.n_units,
                                 n_items=self.n_items, cap=s.user_cap, capacity=s.tree_ticks,
                                 ratio=self.participation_ratio, b_clip=s.clips[0], item_clip=s.clips[1],
                                 hierarchy=hierarchy)
            #: the fold round (pipeline.state.foldround): the worker app sets which partitions this process owns
            self.fold_rounds = FoldRounds(self.folder)
        if s.hierarchy:
            self.statement = hierarchy_statement(s, self.mechanism, self.layout, self.participation_ratio)
        else:
            self.statement = privacy_statement(s, self.mechanism, self.baseline, self.item_mechanism)
        if self.folder is not None:
            if not s.hierarchy:  # (the hierarchy's statement is user level already)
                self.statement = user_level_statement(s, self.statement, self.participation_ratio, self.mechanism,
                                                      self.item_mechanism)
            self.statement = with_budget(self.statement, s.lifetime_budget, s.delta)  # the lifetime budget (ledger.py)
            self.folder.budget = LifetimeBudget.of(self.statement, self.participation_ratio)
        self.statement.setdefault("relation", s.relation)  # every statement names its neighbouring relation

    def participation_ratio(self, k: int) -> float:
        """``B(k) / B(cap)`` of the released statistics (the largest over the bandit's and the items' mechanisms)."""
        cache = self.__dict__.setdefault("_ratio_cache", {})
        if k not in cache:
            cap = self.settings.user_cap
            mechs = [m for m in (self.mechanism, self.item_mechanism) if m is not None]
            if not mechs:  # noise off: the same structure as the default mechanism decides nothing; count plainly
                cache[k] = min(k, cap) ** 2 / cap**2
            else:
                cache[k] = max(participation_bound(m, min(k, cap)) / participation_bound(m, cap) for m in mechs)
        out: float = cache[k]
        return out

    def make_mechanism(self, units: np.ndarray) -> Mechanism:
        """The mechanism over the statistics of ``units`` (a mask; all units in global mode, a site's own units in
        federated mode): calibrated to their largest sensitivity; user-space noise only on their blocks."""
        s = self.settings
        V = (self.V @ sp.diags(units.astype(np.float64))).tocsr() if sp.issparse(self.V) else self.V * units[None, :]
        l1 = float(np.asarray(abs(V).sum(axis=0)).max())  # the masked columns are zero

        def build(scale: float) -> Mechanism:
            scale *= replace_sensitivity(s.clips[0], signed=True)  # neighbours replace a clipped contribution
            return make_mechanism(
                s.mechanism, dim=self.catalog.n_units * self.catalog.d,
                sensitivity=scale * float(sensitivities(self.V)[units].max()), epsilon=s.epsilons()[0], delta=s.delta,
                horizon=s.tree_ticks, seed=self.store.noise_seed(),
                sensitivity_l1=scale * l1 * math.sqrt(self.catalog.d),
                mixing=V, block_dim=self.catalog.d)  # `mixing` is used by the user-space ("user-*") mechanisms

        return build(self._user_scale(build(1.0)))

    def make_hierarchy_mechanism(self) -> Mechanism:
        """One ``blt-exact`` release of the hierarchy's weighted blocks: per tick their sensitivity is 1 (the
        layout's weights), so a user capped at ``user_cap`` ticks gets the settings' ``(epsilon, delta)``."""
        s = self.settings

        def build(scale: float) -> Mechanism:
            return make_mechanism(HIERARCHY_MECHANISM, dim=self.layout.dim, sensitivity=scale, epsilon=s.epsilon,
                                  delta=s.delta, horizon=s.tree_ticks, seed=self.store.noise_seed(),
                                  stream=HIERARCHY_STREAM)

        return build(self._user_scale(build(1.0)))

    def _user_scale(self, event_level: Mechanism) -> float:
        """User level: the factor that makes one tick's calibration cover a user's ``user_cap`` ticks (else 1)."""
        if not self.settings.user_level:
            return 1.0
        return participation_factor(event_level, self.settings.user_cap)

    def recover(self) -> int:
        """Publish a release that was persisted but not yet published (after a crash)."""
        return self.store.publish()

    def tick(self, *, force: bool = False) -> int | None:
        """Release the statistics as of now; ``None`` if nothing changed since the last release (replace relation
        only: under add/remove every tick releases, the schedule being public)."""
        self.recover()
        c = self.catalog
        fold: dict[str, int] = {}
        t_fold = time.perf_counter()
        if self.folder is not None:  # user level: this tick's per-user contributions, clipped and capped
            fold = self.fold_rounds.fold(self.settings.partitions, self.store.pending_version() + 1)
        #: what this tick folded and its wall time (the leader's tick log, pipeline.release.timers)
        self.last_fold = {**fold, "fold_s": round(time.perf_counter() - t_fold, 6)}
        if self.settings.hierarchy:
            return self._tick_hierarchy(fold, force)
        stats, item_sums, offsets = self.store.snapshot_items(self.settings.partitions, c.n_units, c.d, self.n_items)
        if unchanged(self.store, int(stats.count.sum()), force=force):
            if fold.get("over_budget") or fold.get("dropped"):  # no release, but the ledger's counters moved
                self._ledger_entry(max(1, self.store.pending_version()), fold)  # (the metrics' figures)
            return None
        version = self.store.pending_version() + 1
        if self.baseline is not None:
            return self._tick_baseline(self.baseline, stats.gram, stats.b, stats.count, version, offsets)
        state = None
        if self.mechanism is not None:
            state = self.store.load_noise_state(self.mechanism) or self.mechanism.init_state()
        released, state = self.releaser.release(stats, state, version)
        event = json.dumps(event_to_dict(released.event))
        items = self._release_items(item_sums, int(stats.count.sum())) if self.n_items else None
        ledger = None if self.folder is None else self._ledger_entry(version, fold)
        return persist_and_publish(self.store, state, released, event, offsets, items, ledger)

    def _tick_hierarchy(self, fold: dict[str, int], force: bool) -> int | None:
        """The hierarchy's release: the weighted blocks' exact sum over partitions, one step of its mechanism
        (state persisted before the release is published, never redrawn)."""
        c, s = self.catalog, self.settings
        stats, exact, offsets = self.store.snapshot_hierarchy(s.partitions, c.n_units, c.d, self.layout.dim)
        count = int(stats.count.sum())
        # add/remove: one release per tick whatever arrived (the schedule is public; skipping a tick with nothing
        # new would publish whether anyone took part in it)
        if unchanged(self.store, count, force=force or s.add_remove):
            if fold.get("over_budget") or fold.get("dropped"):
                self._ledger_entry(max(1, self.store.pending_version()), fold)
            return None
        version = self.store.pending_version() + 1
        state = None
        std = 0.0
        y = exact
        event: Any = {"kind": "none"}
        if self.mechanism is not None:
            state = self.store.load_noise_state(self.mechanism) or self.mechanism.init_state()
            y, state, ev = self.mechanism.step_to(state, exact)
            std = noise_std(self.mechanism, state)
            event = event_to_dict(ev)
        released = ReleasedHierarchy.from_vector(self.layout, y, std=std, version=version)
        ledger = None if self.folder is None else self._ledger_entry(version, fold)
        # add/remove: the released hash carries the release's own noisy count; the exact one is the operator's
        public_count = max(0, round(released.count)) if s.add_remove else None
        return persist_and_publish(self.store, state, released, json.dumps(event), offsets, None, ledger, count=count,
                                   public_count=public_count)

    def _ledger_entry(self, version: int, fold: dict[str, int]) -> str:
        """What the release's user-level ledger says (persisted and published with the release)."""
        from ..config.metrics import ledger_figures

        s = self.settings
        st = self.statement
        epoch = (version - 1) // s.tree_ticks
        t0 = time.perf_counter()
        figures = ledger_figures(self.client.hgetall, s.namespace, s.partitions, epoch=epoch, cap=s.user_cap,
                                 mu_cap=st.get("mu_at_cap"), delta=s.delta,
                                 ratio=self.participation_ratio if st.get("private") else None,
                                 budget=None if self.folder is None else self.folder.budget)
        self.last_figures = figures
        getattr(self, "last_fold", {})["figures_s"] = round(time.perf_counter() - t0, 6)
        finite = [v for v in (figures["spent_max"], figures["spent_median"])]
        return json.dumps({"version": version, "epoch": epoch, "cap": s.user_cap,
                           "epsilon_at_cap": st.get("epsilon"), "delta": s.delta, "mu_at_cap": st.get("mu_at_cap"),
                           "users": figures["users"], "users_at_cap": figures["users_at_cap"],
                           "capped_events": figures["capped_events"],
                           "users_at_budget": figures["users_at_budget"], "budget_events": figures["budget_events"],
                           "spent_max": finite[0] if math.isfinite(finite[0]) else None,
                           "spent_median": finite[1] if math.isfinite(finite[1]) else None, **fold})

    def _release_items(self, sums: np.ndarray, total: int) -> tuple[TreeState | None, dict[str, bytes]]:
        """One tick of the item sums: noisy prefix sums (never redrawn), persisted with the release."""
        state: TreeState | None = None
        std = 0.0
        if self.item_mechanism is not None:
            state = self.store.load_item_noise_state(self.item_mechanism) or self.item_mechanism.init_state()
            sums, state, _ = self.item_mechanism.step_to(state, sums)
            std = noise_std(self.item_mechanism, state)
        return state, ReleasedItems(sums, total=total, noise_std=std).to_mapping()

    def _tick_baseline(self, policy: PerUserLinUCB, gram: np.ndarray, b: np.ndarray, count: np.ndarray,
                       version: int, offsets: list[int]) -> int:
        """Per-unit release: restore the stored state if another run wrote it, release, persist, then publish."""
        store = self.baseline_store
        stored = store.stored_version()
        if stored != self._baseline_version:  # a restart, or another leader released since
            self._baseline_version = store.load(policy)
        try:
            models = policy.release_from_stats(gram, b, count)
            store.persist(policy.stream_state(models.advanced), models, version=version,
                          event=event_to_dict(policy.mechanisms[0].event), offsets=offsets)
        except BaseException:
            self._baseline_version = -1  # the in-memory policy may be ahead of Redis: reload next tick
            raise
        self._baseline_version = version
        self.store.publish()
        return version


@dataclass
class SolveStage:
    """Leader-only: released statistics → serving models."""

    settings: Settings
    client: redis.Redis
    statement: dict[str, Any]
    #: The worker's catalog (an open one grows as items are added); ``None``: loaded from the settings when needed.
    catalog: Catalog | None = None

    def __post_init__(self) -> None:
        self.keys = PublicKeys(self.settings.namespace)
        self._prior: np.ndarray | None = None
        if self.settings.hierarchy and self.catalog is None:
            from ..data.catalog import load_catalog

            self.catalog = load_catalog(self.settings)

    def _solve(self, released: ReleasedStats) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
        """:func:`models.streaming.solve` with the settings' ridge and public prior, and what to say of them."""
        s = self.settings
        extra = {"lambda": repr(s.lambda_ + s.noise_ridge * released.noise_std)}
        if not s.prior_strength:
            return (*solve(released, lambda_=s.lambda_, noise_ridge=s.noise_ridge), extra)
        if self._prior is None or self._prior.shape != (released.gram.shape[1],):
            # the catalog the settings name (its items at start; items added live are not in it): public data only
            from ..data.catalog import load_catalog

            self._prior = public_prior(np.asarray(load_catalog(s).feature_matrix), s.prior_reward)
        theta, M = solve(released, lambda_=s.lambda_, noise_ridge=s.noise_ridge, prior=self._prior,
                         prior_strength=s.prior_strength)
        return theta, M, {**extra, "prior_strength": repr(s.prior_strength), "prior_reward": repr(s.prior_reward)}

    def run(self) -> int | None:
        """Solve the latest release if it is newer than the served models; return the new version."""
        raw = self.client.hgetall(self.keys.released)
        if not raw:
            return None
        version = int(raw[b"version"])
        served = self.client.hget(self.keys.model_meta, "version")
        if served is not None and int(served) >= version:
            return None
        s = self.settings
        t0 = time.perf_counter()
        width: np.ndarray | None = None
        extra: dict[str, str] = {}
        if s.baseline is not None:
            # the release is already every unit's serving model (post-processing of released values only)
            models = ServingModels.from_mapping(raw)
            theta, M, width, count = models.theta, models.conf, models.width, models.count
            extra = {"width": "per-unit", **widths_summary(width)}
        elif is_hierarchy(raw):
            return self._run_hierarchy(ReleasedHierarchy.from_mapping(raw), raw, version, t0)
        else:
            released = ReleasedStats.from_mapping(raw)
            if s.hierarchy and s.mode == "local":  # the devices' population-wide sums, read as the hierarchy's
                return self._run_hierarchy(local_as_hierarchy(released, ReleasedItems.from_mapping(raw)), raw,
                                           version, t0)
            if released.structure in SPARSE_STRUCTURES:
                return self._run_sparse(released, version, raw, t0)
            theta, M, extra = self._solve(released)
            count = released.count
        items = None if s.baseline is not None else ReleasedItems.from_mapping(raw)
        self._write(version, theta, M, width, count, (time.perf_counter() - t0) * 1e3, extra,
                    (raw.get(b"event") or b'{"kind": "none"}').decode(), items)
        return version

    def _run_hierarchy(self, rel: ReleasedHierarchy, raw: dict[bytes, bytes], version: int, t0: float) -> int:
        """The hierarchy's serving models (:func:`models.streaming.hierarchy.solve_hierarchy`): post-processing of
        the released blocks and the public catalog; the item term is each item's departure from the content
        model, served with weight 1."""
        assert self.catalog is not None
        F = np.asarray(self.catalog.feature_matrix, dtype=np.float64)  # as of now: an open catalog grows
        model = solve_hierarchy(rel, F, n_units=self.catalog.n_units)
        count = np.array([int(raw.get(b"count") or 0)])
        term = {"pop": model.item_scores.astype("<f8").tobytes(), "weight": "1.0", "version": str(version),
                "noise_std": repr(rel.std_items), "total": str(int(count.sum())),
                "rule": "hierarchy: log(p(a) / p_pool(a)), the item's departure from the pooled content model"}
        extra = {"model": "hierarchy", "item_weight": "1.0",
                 **{f"hierarchy_{k}": repr(float(v)) for k, v in model.info.items()},
                 "noise_std_pool": repr(rel.std_pool), "noise_std_items": repr(rel.std_items),
                 "noise_std_units": repr(rel.std_units)}
        self._write(version, model.theta, model.M, None, count, (time.perf_counter() - t0) * 1e3, extra,
                    (raw.get(b"event") or b'{"kind": "none"}').decode(), term=term)
        return version

    def _run_sparse(self, released: ReleasedStats, version: int, raw: dict[bytes, bytes], t0: float) -> int:
        """Every-user release: matrix-free solve warm-started from this process's last solution; ``M`` only for
        the users with interactions (the others are served the public prior ``(lambda I)^{-1}``)."""
        s = self.settings
        active = np.flatnonzero(released.count > 0)
        out = solve_sparse(released, lambda_=s.lambda_, noise_ridge=s.noise_ridge,
                           x0=self.__dict__.get("_warm"), users=active)
        self._warm = out.theta_hat
        M = np.broadcast_to(out.prior, (released.count.shape[0], *out.prior.shape)).copy()
        M[out.users] = out.M
        extra = {"lambda": repr(out.lambda_), "solver": "conjugate gradients (block-Jacobi), warm-started",
                 "cg_iterations": str(out.iterations), "cg_residual": f"{out.residual:.3g}",
                 "width_users": str(len(active)), "M_prior": out.prior.astype("<f8").tobytes().hex()}
        self._write(version, out.theta, M, None, released.count, (time.perf_counter() - t0) * 1e3, extra,
                    (raw.get(b"event") or b'{"kind": "none"}').decode(), ReleasedItems.from_mapping(raw),
                    widths=out.users)
        return version

    def solve_released(self, released: ReleasedStats, version: int, event: str = '{"kind": "none"}') -> int:
        """Solve given statistics (e.g. a federated site's view) into this namespace's serving models."""
        t0 = time.perf_counter()
        theta, M, extra = self._solve(released)
        self._write(version, theta, M, None, released.count, (time.perf_counter() - t0) * 1e3, extra, event)
        return version

    def _write(self, version: int, theta: np.ndarray, M: np.ndarray, width: np.ndarray | None, count: np.ndarray,
               solve_ms: float, extra: dict[str, str], event: str, items: ReleasedItems | None = None,
               widths: np.ndarray | None = None, term: dict[str, Any] | None = None) -> None:
        """Publish the serving models; ``widths``: only these units get an ``M`` (the others have none and are
        served ``meta["M_prior"]``); ``None``: every unit's ``M``. ``term``: the item term's fields as they are
        (the hierarchy's), instead of the flat model's rule over ``items``."""
        s = self.settings
        item_model: dict[str, Any] | None = term
        if items is not None:  # the item term: post-processing of the released item sums only
            # local mode: released item sums exist only when devices send item reports; they are served with
            # item_weight (default 1) — the global mode's rule, applied to the sums of the devices' noisy messages
            setting = s.item_term_weight if s.mode != "local" else (1.0 if s.item_weight is None else s.item_weight)
            weight, pop = item_term(items, setting)
            item_model = {"pop": pop.astype("<f8").tobytes(), "weight": repr(weight), "version": str(version),
                          "noise_std": repr(items.noise_std), "total": str(items.total)}
            extra = {**extra, "item_weight": repr(weight)}
        meta = {
            "version": str(version), "algorithm": s.algorithm, "alpha": repr(s.alpha), "d": str(theta.shape[1]),
            "n_units": str(theta.shape[0]), "events": str(int(count.sum())),
            "solved_at_ms": str(int(time.time() * 1000)), "solve_ms": f"{solve_ms:.1f}",
            "privacy": json.dumps(self.statement),
            "event": event,  # what every release spends
            **extra,
        }
        with self.client.pipeline(transaction=True) as pipe:
            has_m = np.ones(theta.shape[0], dtype=bool)
            if widths is not None:
                has_m[:] = False
                has_m[widths] = True
            for u in range(theta.shape[0]):
                unit: dict[str, Any] = {"theta": theta[u].astype("<f8").tobytes(), "version": str(version)}
                if has_m[u]:  # (released counts never shrink: a unit never loses its M once it has one)
                    unit["M"] = M[u].astype("<f8").tobytes()
                if width is not None:
                    unit["width"] = repr(float(width[u]))  # the unit's own exploration width (repr: exact)
                pipe.hset(self.keys.model_unit(u), mapping=unit)
            if item_model is not None:
                pipe.hset(self.keys.model_items, mapping=item_model)
            pipe.hset(self.keys.model_meta, mapping=meta)
            faults.point("solve-before-write")
            pipe.execute()
