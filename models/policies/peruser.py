"""Shared skeleton of the per-user private LinUCB baselines (Shariff & Sheffet, DGS).

Each user ``u`` has its own LinUCB model and its own continual-release
mechanism. Releases happen every ``tick`` interactions (all users at once,
as in :class:`~models.policies.KroneckerUCB`); a user's mechanism advances
at a release only if that user had at least one interaction in the tick — a
count of public events, never of rewards. Between releases decisions use the
serving model of the last release.

One mechanism per user rather than one stacked mechanism: a user's data
enters only its own model, so per-user mechanisms compose in parallel
(event-level: one interaction touches one user's tree), each tree only counts
that user's own ticks (fewer levels than a global tree when ``tick < N``),
and the baselines' per-user constants (S&S's shift and widths, Wishart
padding, DGS's per-node sensitivities) depend on the user's own node counts.

Two ways to feed a baseline, one per caller (do not mix them on one object):

* offline, event by event: :meth:`PerUserLinUCB.update` and ``select``;
* streaming (the pipeline's release stage): :meth:`PerUserLinUCB.release_from_stats`
  takes the current exact per-unit prefix sums ``(gram, b, counts)``, advances
  the mechanism of every unit whose (public) count grew, and returns the
  per-unit :class:`ServingModels`. Its state round-trips through
  :meth:`~PerUserLinUCB.stream_state` / :meth:`~PerUserLinUCB.load_stream_state`,
  which can write only the units that advanced.

Examples
--------
Without noise, a streamed release is LinUCB's estimate ``(lambda I + G)^{-1} b``:

>>> import numpy as np
>>> from models.policies.dgs import DGSLinUCB
>>> pol = DGSLinUCB(d=2, n_users=2, epsilon=float("inf"), lambda_=1.0)
>>> gram = np.array([[[1.0, 0.0], [0.0, 0.0]], np.zeros((2, 2))])
>>> rel = pol.release_from_stats(gram, np.array([[1.0, 0.0], [0.0, 0.0]]), np.array([1, 0]))
>>> rel.theta.tolist(), rel.advanced.tolist(), rel.width.tolist()
([[0.5, 0.0], [0.0, 0.0]], [0], [0.3, 0.3])
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from models.ground.codec import decode_arrays, encode_arrays
from models.ground.linalg import check_interaction, sherman_morrison, ucb_scores_blas
from models.mechanisms import Mechanism, TreeState

FloatArray = NDArray[np.float64]

__all__ = ["PerUserLinUCB", "ServingModels"]


@dataclass(frozen=True, slots=True)
class ServingModels:
    """Per-unit serving models of one streamed release (public: post-processing of released values).

    A unit's UCB score of a candidate ``x`` is ``x^T theta_u + width_u sqrt(x^T C_u x)``
    (:func:`models.ground.linalg.ucb_scores` with ``alpha = width_u``).

    Attributes
    ----------
    theta
        ``(N, d)``: each unit's released estimate.
    conf
        ``(N, d, d)``: each unit's confidence matrix ``C_u`` (S&S: ``V_u^{-1}``
        of the noisy Gram; DGS and noise-free: ``(lambda I + G_u)^{-1}``).
    width
        ``(N,)``: each unit's exploration width (the baseline's own, or the
        constant ``alpha``).
    count
        ``(N,)``: interactions each unit's model covers (public counts).
    advanced
        Units whose mechanism advanced at this release (ascending).

    Examples
    --------
    >>> m = ServingModels(np.zeros((1, 2)), np.eye(2)[None], np.ones(1), np.array([3]), np.array([0]))
    >>> ServingModels.from_mapping(m.to_mapping()).to_mapping() == m.to_mapping()
    True
    """

    theta: FloatArray
    conf: FloatArray
    width: FloatArray
    count: NDArray[np.int64]
    advanced: NDArray[np.int64]

    SCHEMA = "privrec.ServingModels/1"

    def to_mapping(self) -> dict[str, bytes]:
        return encode_arrays({"theta": self.theta, "conf": self.conf, "width": self.width, "count": self.count,
                              "advanced": self.advanced}, schema=self.SCHEMA)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, bytes] | Mapping[bytes, bytes]) -> ServingModels:
        a, _ = decode_arrays(mapping, schema=cls.SCHEMA)  # type: ignore[arg-type]
        return cls(a["theta"].astype(np.float64), a["conf"].astype(np.float64), a["width"].astype(np.float64),
                   a["count"].astype(np.int64), a["advanced"].astype(np.int64))


class PerUserLinUCB:
    """Per-user LinUCB with tick-based private releases; subclasses define the release.

    Parameters
    ----------
    d, n_users
        Context dimension and number of users.
    lambda_
        Ridge weight ``lambda`` added to every user's Gram matrix.
    alpha
        Constant exploration width, or ``"theory"`` for the baseline's own width.
    epsilon, delta
        Privacy parameters (``epsilon = inf``: no noise).
    horizon
        Expected number of interactions in total; per-user trees are sized to
        ``ceil(horizon / n_users)`` interactions (longer streams roll over).
    tick
        Interactions per release.
    user_horizon
        Releases one user's tree is sized for (overrides the value derived
        from ``horizon`` and ``tick``; the streaming pipeline sets it from its
        tree size). Longer streams roll over into a new epoch.
    seed
        Secret seed of the keyed noise (user ``u`` uses stream ``1 + u``).
    context_bound, reward_bound
        ``L`` and ``B``: contexts are projected to ``||x|| <= L``, rewards
        clipped to ``[0, B]`` before they touch any statistic.
    """

    SCHEMA = "privrec.PerUserLinUCB/1"
    mechanisms: list[Mechanism]  # one per user, built by _build()

    def __init__(
        self,
        *,
        d: int,
        n_users: int,
        lambda_: float = 0.1,
        alpha: float | Literal["theory"] = 0.3,
        epsilon: float = math.inf,
        delta: float = 1e-5,
        horizon: int = 10_000,
        tick: int = 1,
        seed: int = 0,
        context_bound: float = 1.0,
        reward_bound: float = 1.0,
        user_horizon: int | None = None,
    ) -> None:
        if int(d) < 1:
            raise ValueError(f"`d` must be a positive integer, got {d}.")
        if int(n_users) < 1:
            raise ValueError(f"`n_users` must be a positive integer, got {n_users}.")
        if not (lambda_ > 0 and math.isfinite(lambda_)):
            raise ValueError(f"`lambda_` must be positive, got {lambda_}.")
        if alpha != "theory" and not (isinstance(alpha, (int, float)) and alpha >= 0 and math.isfinite(alpha)):
            raise ValueError(f"`alpha` must be a non-negative number or 'theory', got {alpha!r}.")
        if math.isnan(epsilon) or epsilon <= 0:
            raise ValueError(f"`epsilon` must be positive (inf for no noise), got {epsilon}.")
        if not 0.0 < delta < 1.0:
            raise ValueError(f"`delta` must be in (0, 1), got {delta}.")
        if int(horizon) < 1:
            raise ValueError(f"`horizon` must be positive, got {horizon}.")
        if int(tick) < 1:
            raise ValueError(f"`tick` must be a positive number of interactions, got {tick}.")
        if user_horizon is not None and int(user_horizon) < 1:
            raise ValueError(f"`user_horizon` must be a positive number of releases or None, got {user_horizon}.")
        if not (context_bound > 0 and reward_bound > 0):
            raise ValueError(f"`context_bound` and `reward_bound` must be positive, got {context_bound}, "
                             f"{reward_bound}.")
        self.d, self.n_users = int(d), int(n_users)
        self.lambda_ = float(lambda_)
        self.alpha = alpha
        self.epsilon, self.delta = float(epsilon), float(delta)
        self.horizon, self.tick, self.seed = int(horizon), int(tick), int(seed)
        self.context_bound, self.reward_bound = float(context_bound), float(reward_bound)
        self.private = not math.isinf(self.epsilon)
        #: ticks one user's tree covers: its share of the interactions, or of the releases if fewer
        self.user_horizon = max(1, min(-(-self.horizon // self.tick), -(-self.horizon // self.n_users)))
        if user_horizon is not None:
            self.user_horizon = int(user_horizon)
        self._build()
        self.reset()

    # ------------------------------------------------------------------ hooks

    def _build(self) -> None:
        """Construct the per-user mechanisms (``self.mechanisms``)."""
        raise NotImplementedError

    def _release_user(self, user: int) -> None:
        """Step ``user``'s mechanism with its pending statistics and refresh its serving model."""
        raise NotImplementedError

    def _extra_arrays(self) -> dict[str, FloatArray]:
        return {}

    def _load_extra(self, arrays: dict[str, NDArray[np.generic]]) -> None:
        return None

    # ------------------------------------------------------------------ state

    def reset(self) -> None:
        """Forget everything learned (keeps hyperparameters and the noise key)."""
        n, d = self.n_users, self.d
        self.ainv: FloatArray = np.tile(np.eye(d) / self.lambda_, (n, 1, 1))
        self.ainv_released: FloatArray = self.ainv if self.tick == 1 else self.ainv.copy()
        self.b_exact = np.zeros((n, d))
        self.pending = np.zeros((n, d))
        self.counts = np.zeros(n, dtype=np.int64)  # interactions per user (public)
        self.tick_counts = np.zeros(n, dtype=np.int64)  # interactions per user in the open tick (public)
        self.t = 0
        self.states: list[TreeState] = [m.init_state() for m in self.mechanisms]
        self.theta_released = np.zeros((n, d))
        self.conf_released = np.zeros((n, d, d))  # used only when not _conf_is_ainv()
        self.width_released = np.zeros(n)
        self.releases = 0
        self._reset_extra()
        for u in range(n):
            self._init_user(u)

    def _reset_extra(self) -> None:
        return None

    def _init_user(self, user: int) -> None:
        """The serving model before ``user``'s first release (default: ``theta = 0``, prior width)."""
        self.width_released[user] = float(self.alpha) if self.alpha != "theory" else 0.0

    # ------------------------------------------------------------------ decisions

    def serving_model(self, user: int) -> tuple[FloatArray, FloatArray, float]:
        """``(theta_u, C_u, width_u)`` of the last release; score ``x^T theta + width sqrt(x^T C x)``."""
        C = self.ainv_released[user] if self._conf_is_ainv() else self.conf_released[user]
        return self.theta_released[user], C, float(self.width_released[user])

    def scores(self, user: int, contexts: FloatArray) -> tuple[FloatArray, FloatArray]:
        self._check_user(user)
        theta, C, width = self.serving_model(user)
        return ucb_scores_blas(theta, C, contexts, width)

    def select(self, user: int, contexts: FloatArray) -> int:
        """Index of the arm with the highest UCB score; first on ties."""
        mean, bonus = self.scores(user, contexts)
        return int(np.argmax(mean + bonus))

    # ------------------------------------------------------------------ learning

    def update(self, user: int, context: FloatArray, reward: float) -> None:
        """Record that ``user`` was shown ``context`` and gave ``reward`` (clipped first)."""
        self._check_user(user)
        x, r = check_interaction(context, reward, self.d)
        norm = float(np.linalg.norm(x))
        if norm > self.context_bound:
            x = x * (self.context_bound / norm)
        r = min(max(r, 0.0), self.reward_bound)
        sherman_morrison(self.ainv[user], x)
        self.pending[user] += r * x
        self._accumulate(user, x, r)
        self.counts[user] += 1
        self.tick_counts[user] += 1
        self.t += 1
        if self.t % self.tick == 0:
            self.release()

    def _accumulate(self, user: int, x: FloatArray, r: float) -> None:
        return None

    def release(self) -> None:
        """Close the tick: fold pending statistics in and release the active users' models."""
        self.b_exact += self.pending
        if self.tick > 1:
            self.ainv_released = self.ainv.copy()
        for u in np.flatnonzero(self.tick_counts > 0):
            self._release_user(int(u))
        self.pending[:] = 0.0
        self.tick_counts[:] = 0
        self.releases += 1

    # ------------------------------------------------------------------ streaming

    def release_from_stats(self, gram: FloatArray, b: FloatArray, counts: NDArray[np.integer]) -> ServingModels:
        """One streamed release from the current exact prefix sums of every unit.

        A unit's mechanism advances (one leaf of its tree) exactly when its
        interaction count grew since its last release; the count is public,
        no value decides it. Every other unit keeps its mechanism state and
        its serving model. Nothing here clips: the caller's statistics must
        already come from contexts with ``||x|| <= context_bound`` and rewards
        in ``[0, reward_bound]`` (the pipeline's ingest guarantees both).

        Parameters
        ----------
        gram
            ``(N, d, d)``: ``G_u = sum x x^T`` over each unit's interactions so far.
        b
            ``(N, d)``: ``sum r x``.
        counts
            ``(N,)``: interactions per unit so far (never decreasing).

        Returns
        -------
        ServingModels
            Every unit's serving model after this release (new for the units
            that advanced, unchanged for the others).
        """
        n, d = self.n_users, self.d
        G = np.asarray(gram, dtype=np.float64)
        B = np.asarray(b, dtype=np.float64)
        c = np.asarray(counts)
        if G.shape != (n, d, d):
            raise ValueError(f"`gram` must have shape ({n}, {d}, {d}), got {G.shape}.")
        if B.shape != (n, d):
            raise ValueError(f"`b` must have shape ({n}, {d}), got {B.shape}.")
        if c.shape != (n,) or c.dtype.kind not in "iu":
            raise ValueError(f"`counts` must be an integer array of shape ({n},), got {c.dtype} {c.shape}.")
        c = c.astype(np.int64)
        if (c < self.counts).any():
            u = int(np.flatnonzero(c < self.counts)[0])
            raise ValueError(f"`counts` must never decrease: unit {u} had {int(self.counts[u])} interactions at its "
                             f"last release, got {int(c[u])}.")
        if self.ainv_released is self.ainv:  # the offline tick-1 alias: streamed models get their own array
            self.ainv_released = self.ainv.copy()
        advanced = np.flatnonzero(c > self.counts)
        self.counts[advanced] = c[advanced]
        for u in advanced.tolist():
            self._release_user_from_stats(u, G[u], B[u])
        self.t = int(c.sum())
        self.releases += 1
        return self.serving_models(advanced)

    def _release_user_from_stats(self, user: int, gram: FloatArray, b: FloatArray) -> None:
        """Step ``user``'s mechanism to its exact prefix ``(gram, b)`` and refresh its serving model."""
        raise NotImplementedError

    def serving_models(self, advanced: NDArray[np.integer] | None = None) -> ServingModels:
        """Every unit's current serving model (``advanced``: the units that moved, for the record)."""
        conf = self.ainv_released if self._conf_is_ainv() else self.conf_released
        moved = np.zeros(0, dtype=np.int64) if advanced is None else np.asarray(advanced, dtype=np.int64).reshape(-1)
        return ServingModels(self.theta_released.copy(), conf.copy(), self.width_released.copy(),
                             self.counts.copy(), moved)

    def stream_state(self, units: Iterable[int] | None = None) -> dict[str, bytes]:
        """The state :meth:`release_from_stats` continues from, as plain bytes.

        Shared entries (counts at each unit's last release, release number)
        plus, for each unit of ``units`` (default: all), its mechanism state
        (``u<k>/tree/...``, trusted: it holds the exact prefix) and its
        serving model (``u<k>/model/...``). Writing only the units that
        advanced over an earlier full mapping (a Redis hash) gives the same
        mapping as a full write.
        """
        out = encode_arrays({"counts": self.counts}, scalars={"releases": self.releases, "t": self.t,
                                                              **self._stream_scalars()},
                            schema=self.SCHEMA + "+stream")
        conf = self.ainv_released if self._conf_is_ainv() else self.conf_released
        for u in (range(self.n_users) if units is None else units):
            u = int(u)
            self._check_user(u)
            out.update({f"u{u}/tree/{k}": v for k, v in self.states[u].to_mapping().items()})
            row = encode_arrays({"theta": self.theta_released[u], "conf": conf[u],
                                 "width": self.width_released[u:u + 1]}, schema=self.SCHEMA + "+model")
            out.update({f"u{u}/model/{k}": v for k, v in row.items()})
        return out

    def load_stream_state(self, mapping: Mapping[str, bytes] | Mapping[bytes, bytes]) -> None:
        """Restore what :meth:`stream_state` wrote (bit-exactly) into this same-config policy.

        Units without entries never advanced: they keep their initial state.
        """
        m = {k.decode() if isinstance(k, bytes) else k: v for k, v in mapping.items()}
        shared = {k: v for k, v in m.items() if "/" not in k}
        arrays, scalars = decode_arrays(shared, schema=self.SCHEMA + "+stream")  # type: ignore[arg-type]
        counts = arrays["counts"].astype(np.int64)
        if counts.shape != (self.n_users,):
            raise ValueError(f"state has `counts` of shape {counts.shape}, expected ({self.n_users},).")
        self.reset()
        self.ainv_released = self.ainv.copy()
        self.counts = counts
        self.releases = int(scalars["releases"])  # type: ignore[arg-type]
        self.t = int(scalars["t"])  # type: ignore[arg-type]
        self._load_stream_scalars(scalars)
        per_unit: dict[int, dict[str, dict[str, bytes]]] = {}
        for k, v in m.items():
            if "/" in k:
                head, part, field = k.split("/", 2)
                per_unit.setdefault(int(head[1:]), {}).setdefault(part, {})[field] = v
        for u, parts in per_unit.items():
            self._check_user(u)
            self.states[u] = self.mechanisms[u].state_from_mapping(parts["tree"])
            row, _ = decode_arrays(parts["model"], schema=self.SCHEMA + "+model")  # type: ignore[arg-type]
            self.theta_released[u] = row["theta"]
            (self.ainv_released if self._conf_is_ainv() else self.conf_released)[u] = row["conf"]
            self.width_released[u] = float(row["width"][0])

    def _stream_scalars(self) -> dict[str, int | float | str | None]:
        return {}

    def _load_stream_scalars(self, scalars: Mapping[str, int | float | str | None]) -> None:
        return None

    # ------------------------------------------------------------------ codec

    def to_mapping(self) -> dict[str, bytes]:
        """All learned state as plain bytes (restored bit-exactly by :meth:`load_mapping`)."""
        arrays: dict[str, NDArray[np.generic]] = {
            "ainv": self.ainv, "b_exact": self.b_exact, "pending": self.pending, "counts": self.counts,
            "tick_counts": self.tick_counts, "theta_released": self.theta_released,
            "conf_released": self.conf_released, "width_released": self.width_released, **self._extra_arrays()}
        if self.tick > 1:
            arrays["ainv_released"] = self.ainv_released
        out = encode_arrays(arrays, scalars={"t": self.t, "releases": self.releases}, schema=self.SCHEMA)
        for u, s in enumerate(self.states):
            out.update({f"user{u}/{k}": v for k, v in s.to_mapping().items()})
        return out

    def load_mapping(self, mapping: dict[str, bytes]) -> None:
        """Restore the state written by :meth:`to_mapping` into this (same-config) policy."""
        own = {k: v for k, v in mapping.items() if "/" not in k}
        arrays, scalars = decode_arrays(own, schema=self.SCHEMA)  # type: ignore[arg-type]
        if arrays["ainv"].shape != self.ainv.shape:
            raise ValueError(f"state has `ainv` of shape {arrays['ainv'].shape}, expected {self.ainv.shape}.")
        self.ainv = arrays["ainv"].astype(np.float64)
        self.ainv_released = arrays["ainv_released"].astype(np.float64) if self.tick > 1 else self.ainv
        self.b_exact = arrays["b_exact"].astype(np.float64)
        self.pending = arrays["pending"].astype(np.float64)
        self.counts = arrays["counts"].astype(np.int64)
        self.tick_counts = arrays["tick_counts"].astype(np.int64)
        self.theta_released = arrays["theta_released"].astype(np.float64)
        self.conf_released = arrays["conf_released"].astype(np.float64)
        self.width_released = arrays["width_released"].astype(np.float64)
        self.t = int(scalars["t"])  # type: ignore[arg-type]
        self.releases = int(scalars["releases"])  # type: ignore[arg-type]
        self._load_extra(arrays)
        self.states = [m.state_from_mapping({k[len(f"user{u}/"):]: v for k, v in mapping.items()
                                             if k.startswith(f"user{u}/")})
                       for u, m in enumerate(self.mechanisms)]

    def _conf_is_ainv(self) -> bool:
        """Whether the serving confidence matrix is the exact ``(lambda I + G_u)^{-1}`` (public Gram)."""
        return True

    def _check_user(self, user: int) -> None:
        if not (isinstance(user, (int, np.integer)) and 0 <= user < self.n_users):
            raise ValueError(f"`user` must be an integer in [0, {self.n_users}), got {user!r}.")


def levels_ceil(n: int) -> int:
    """``m = 1 + ceil(log2 n)``: the tree levels both papers use (ERRATA O3: one more than needed, safe)."""
    return 1 + max(0, math.ceil(math.log2(max(1, n))))
