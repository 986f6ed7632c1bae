"""LinUCB, CoLin and GOB.Lin, non-private and private, as one Kronecker family.

Every algorithm is ridge regression on ``x_tilde = kron(V[:, u], x)`` with
UCB arm choice (spec collaborative-dp-bandits §2, §5):

    A = lambda_ I + sum x_tilde x_tilde^T,   b = sum x_tilde r,
    score(x) = x^T theta_u + alpha * sqrt(x^T C_u x),

with ``theta_u = (V[:,u]^T ⊗ I_d) A^{-1} b`` and
``C_u = (V[:,u]^T ⊗ I_d) A^{-1} (V[:,u] ⊗ I_d)`` (ERRATA §3). ``V = I``
(LinUCB) keeps ``A`` block-diagonal: one ``d x d`` inverse per user.
Otherwise ``A^{-1}`` is ``dN x dN`` and updated by Sherman–Morrison; a
decision costs ``O(N^2 d^2 + K d^2)`` instead of ``O(K (dN)^2)``.

Privacy (spec §3, §4): ``A`` depends only on public contexts and is used
exactly. ``b`` depends on rewards and is used only through a continual-release
mechanism:

* ``privacy="global"``: one server-side tree over the ``dN`` vector ``b``
  with sensitivity ``max_u Lx ||V[:, u]||_2``;
* ``privacy="local"``: one tree per user over that user's own ``b_u`` (its
  full ``dN`` vector; spec G20) with sensitivity ``Lx ||V[:, u]||_2``; the
  server sums the users' latest releases.

Releases happen every ``tick`` interactions; between ticks decisions use the
statistics of the last release (the Gram snapshot and the released ``b``),
exactly as the streaming pipeline's serving models do.

Examples
--------
>>> import numpy as np
>>> from models.ground.graphs import uniform_w
>>> from models.policies import make_policy
>>> pol = make_policy("CoLin", d=2, W=uniform_w(3), seed=0)
>>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
>>> pol.select(0, X)
0
>>> pol.update(0, X[1], 1.0)
>>> pol.select(1, X)
1
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray
from scipy.linalg.blas import dger

from models.ground.codec import decode_arrays, encode_arrays
from models.ground.graphs import sensitivities
from models.ground.linalg import check_interaction, sherman_morrison, ucb_scores_blas
from models.mechanisms import Mechanism, TreeState, make_mechanism, noise_std

__all__ = ["Policy", "KroneckerUCB", "RandomPolicy", "PrivacyConfig", "PrivacyMode"]

FloatArray = NDArray[np.float64]
PrivacyMode = Literal["none", "global", "local"]


class Policy(Protocol):
    """A contextual bandit policy over per-round candidate sets."""

    def select(self, user: int, contexts: FloatArray) -> int: ...

    def update(self, user: int, context: FloatArray, reward: float) -> None: ...


@dataclass(frozen=True, slots=True)
class PrivacyConfig:
    """How ``b`` is released.

    Attributes
    ----------
    mode
        ``"none"``, ``"global"`` (trusted server adds the noise) or
        ``"local"`` (each user perturbs its own statistic).
    mechanism
        A name from :data:`models.mechanisms.MECHANISMS`.
    epsilon, delta
        Privacy parameters (``delta`` only for Gaussian mechanisms);
        ``epsilon = inf`` switches noise off.
    horizon
        Expected number of interactions ``T``; sizes the trees
        (``levels = bitlength(ceil(T / tick))``; per-user trees use
        ``ceil(T / N)`` interactions). Longer streams roll over to new epochs.
    tick
        Interactions per release.
    seed
        Secret seed of the mechanisms' keyed noise.
    sensitivity_scale
        Global mode: multiplies the event-level sensitivity the mechanism is calibrated to (user-level
        privacy: the participation factor of :mod:`models.mechanisms.participation`).
    """

    mode: PrivacyMode = "none"
    mechanism: str = "paper"
    epsilon: float = math.inf
    delta: float = 1e-5
    horizon: int = 10_000
    tick: int = 1
    seed: int = 0
    sensitivity_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in ("none", "global", "local"):
            raise ValueError(f"`mode` must be 'none', 'global' or 'local', got {self.mode!r}.")
        if int(self.tick) < 1:
            raise ValueError(f"`tick` must be a positive number of interactions, got {self.tick}.")
        if int(self.horizon) < 1:
            raise ValueError(f"`horizon` must be positive, got {self.horizon}.")
        if math.isnan(self.epsilon) or self.epsilon <= 0:
            raise ValueError(f"`epsilon` must be positive (inf for no noise), got {self.epsilon}.")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"`delta` must be in (0, 1), got {self.delta}.")


class KroneckerUCB:
    """UCB on ``kron(V[:, u], x)``: LinUCB (``V = I``), CoLin (``V = W``), GOB.Lin (``V = G^{-1/2}``).

    Parameters
    ----------
    d
        Context dimension.
    V
        ``N x N`` user-mixing matrix; the identity gives independent per-user
        models stored block-diagonally.
    lambda_
        Ridge weight ``lambda``.
    alpha
        Exploration width: a constant, or ``"theory"`` for the papers'
        confidence widths with the noise term corrected by ERRATA O1
        (a smoke test only: it is worse than random play, feasibility §0).
    privacy
        How ``b`` is released (:class:`PrivacyConfig`).
    context_bound
        ``Lx``: contexts are assumed to satisfy ``||x||_2 <= Lx``.
    theory_delta
        Failure probability in the theory widths (spec G8: 0.1).
    noise_ridge
        ``kappa``: with a global mechanism, the served model uses the ridge
        ``lambda_t = lambda_ + kappa * s_t``, where ``s_t`` is the largest
        per-coordinate noise std of the current release
        (:func:`models.mechanisms.noise_std`). ``s_t`` depends only on the
        calibration and the tick count, so this is post-processing; it damps
        the noise where the Gram matrix is still small (the role of Shariff &
        Sheffet's noise shift). ``0`` (default) keeps ``lambda_`` fixed; with
        noise off ``s_t = 0`` and nothing changes.
    """

    def __init__(
        self,
        *,
        d: int,
        V: FloatArray,
        lambda_: float = 0.1,
        alpha: float | Literal["theory"] = 0.3,
        privacy: PrivacyConfig | None = None,
        context_bound: float = 1.0,
        theory_delta: float = 0.1,
        noise_ridge: float = 0.0,
    ) -> None:
        V = np.asarray(V, dtype=np.float64)
        if int(d) < 1:
            raise ValueError(f"`d` must be a positive integer, got {d}.")
        if V.ndim != 2 or V.shape[0] != V.shape[1] or V.shape[0] < 1:
            raise ValueError(f"`V` must be a square N x N matrix, got shape {V.shape}.")
        if not np.isfinite(V).all():
            raise ValueError("`V` must be finite.")
        zero = np.flatnonzero(np.linalg.norm(V, axis=0) == 0)
        if zero.size:
            raise ValueError(f"`V` has zero column(s) {zero.tolist()}.")
        if not (lambda_ > 0 and math.isfinite(lambda_)):
            raise ValueError(f"`lambda_` must be positive, got {lambda_}.")
        if alpha != "theory" and not (isinstance(alpha, (int, float)) and alpha >= 0 and math.isfinite(alpha)):
            raise ValueError(f"`alpha` must be a non-negative number or 'theory', got {alpha!r}.")
        if not context_bound > 0:
            raise ValueError(f"`context_bound` must be positive, got {context_bound}.")
        if not 0 < theory_delta < 1:
            raise ValueError(f"`theory_delta` must be in (0, 1), got {theory_delta}.")
        if not (noise_ridge >= 0 and math.isfinite(noise_ridge)):
            raise ValueError(f"`noise_ridge` must be a non-negative number, got {noise_ridge}.")
        self.noise_ridge = float(noise_ridge)
        self.d = int(d)
        self.V = V
        self.n_users = V.shape[0]
        self.lambda_ = float(lambda_)
        self.alpha = alpha
        self.privacy = privacy or PrivacyConfig()
        self.context_bound = float(context_bound)
        self.theory_delta = float(theory_delta)
        self.block = bool(np.array_equal(V, np.eye(self.n_users)))
        self.dim = self.d * self.n_users
        self.user_sensitivity: FloatArray = sensitivities(V, self.context_bound)
        self.tick = int(self.privacy.tick)
        self._vnorm2: list[float] = (np.linalg.norm(V, axis=0) ** 2).tolist()
        self._build_mechanisms()
        self.reset()

    # ------------------------------------------------------------------ set-up

    def _build_mechanisms(self) -> None:
        p = self.privacy
        self.mechanism: Mechanism | None = None
        self.user_mechanisms: list[Mechanism] = []
        ticks = -(-p.horizon // p.tick)
        if p.mode == "global":
            self.mechanism = make_mechanism(
                p.mechanism, dim=self.dim, sensitivity=p.sensitivity_scale * float(self.user_sensitivity.max()),
                epsilon=p.epsilon,
                delta=p.delta, horizon=ticks, seed=p.seed, stream=0,
                sensitivity_l1=p.sensitivity_scale * self._l1_sensitivity(None))
        elif p.mode == "local":
            per_user = min(ticks, -(-p.horizon // self.n_users))
            self.user_mechanisms = [
                make_mechanism(p.mechanism, dim=self._user_dim, sensitivity=float(self.user_sensitivity[u]),
                               epsilon=p.epsilon, delta=p.delta, horizon=per_user, seed=p.seed, stream=1 + u,
                               sensitivity_l1=self._l1_sensitivity(u))
                for u in range(self.n_users)]

    @property
    def _user_dim(self) -> int:
        # A local LinUCB user's statistic is its own d-block (the rest is identically zero).
        return self.d if self.block else self.dim

    def _l1_sensitivity(self, user: int | None) -> float:
        """``max ||x_tilde||_1`` for ``||x||_2 <= Lx``: ``sqrt(d) Lx ||V[:,u]||_1``."""
        l1 = np.abs(self.V).sum(axis=0) * math.sqrt(self.d) * self.context_bound
        return float(l1.max() if user is None else l1[user])

    def reset(self) -> None:
        """Forget everything learned (keeps the hyperparameters and the noise key)."""
        n, d = self.n_users, self.d
        if self.block:
            self.ainv: FloatArray = np.tile(np.eye(d) / self.lambda_, (n, 1, 1))
        else:
            self.ainv = np.eye(self.dim) / self.lambda_
        self.t = 0
        self.vnorm2_sum = 0.0
        self.pending = np.zeros(self.dim)
        self.b_exact = np.zeros(self.dim)
        self.b_released = np.zeros(self.dim)
        self.ainv_released = self.ainv if self.tick == 1 else self.ainv.copy()
        self.lambda_released = self.lambda_
        # exact Gram of the x_tilde (public data), kept only to re-solve with a noise-scaled ridge
        self.gram: FloatArray | None = np.zeros_like(self.ainv) if self._ridge_active else None
        self.mech_state: TreeState | None = self.mechanism.init_state() if self.mechanism else None
        self.user_states: list[TreeState] = [m.init_state() for m in self.user_mechanisms]
        self.user_pending = np.zeros((n, self._user_dim)) if self.user_mechanisms else np.zeros((0, 0))
        # interactions per user in the open tick: whether a user's tree advances must depend on
        # this public count only — never on the values (a zero reward gives a zero increment)
        self.user_tick_counts = np.zeros(n, dtype=np.int64)
        self.user_eta = np.zeros((n, self.dim)) if self.user_mechanisms else np.zeros((0, 0))
        self._cache: dict[int, tuple[FloatArray, FloatArray]] = {}

    # ------------------------------------------------------------------ decisions

    def serving_model(self, user: int) -> tuple[FloatArray, FloatArray]:
        """``(theta_u, C_u)`` from the last release: the whole per-user serving model."""
        hit = self._cache.get(user)
        if hit is not None:
            return hit
        ainv, b = self.ainv_released, self.b_released
        d = self.d
        if self.block:
            C = ainv[user]
            theta = C.dot(b[user * d:(user + 1) * d])
        else:
            v = self.V[:, user]
            # Qt = (v^T ⊗ I_d) A^{-1}, shape (d, dN): a weighted sum of A^{-1}'s row blocks,
            # one contiguous gemv (A^{-1} is symmetric, so Qt = Q^T with Q = A^{-1} (v ⊗ I_d)).
            Qt = (v @ ainv.reshape(self.n_users, d * self.dim)).reshape(d, self.dim)
            C = Qt.reshape(d, self.n_users, d).transpose(0, 2, 1) @ v
            theta = Qt @ b
        if self.tick > 1:
            self._cache[user] = (theta, C)
        return theta, C

    def scores(self, user: int, contexts: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``(mean, bonus)`` per candidate; the UCB score is their sum."""
        self._check_user(user)
        theta, C = self.serving_model(user)
        return ucb_scores_blas(theta, C, contexts, self.current_alpha())

    def select(self, user: int, contexts: FloatArray) -> int:
        """Index (into ``contexts``) of the arm with the highest UCB score; first on ties."""
        mean, bonus = self.scores(user, contexts)
        mean += bonus
        return int(mean.argmax())

    # ------------------------------------------------------------------ learning

    def update(self, user: int, context: FloatArray, reward: float, *, gram: bool = True) -> None:
        """Record that ``user`` was shown ``context`` and gave ``reward``.

        ``gram=False`` adds ``r x`` to the reward statistic only (an organic listen: the item was the user's
        choice, so its context must not enter the public Gram matrix).
        """
        self._check_user(user)
        x, r = check_interaction(context, reward, self.d)
        d = self.d
        if self.block:
            if gram:
                sherman_morrison(self.ainv[user], x)
                if self.gram is not None:
                    dger(1.0, x, x, a=self.gram[user].T, overwrite_a=1)
            sl = slice(user * d, (user + 1) * d)
            self.pending[sl] += r * x
            if self.user_mechanisms:
                self.user_pending[user] += r * x
                self.user_tick_counts[user] += 1
        else:
            xt = (self.V[:, user, None] * x).ravel()  # = kron(V[:, user], x)
            if gram:
                sherman_morrison(self.ainv, xt)
                if self.gram is not None:
                    dger(1.0, xt, xt, a=self.gram.T, overwrite_a=1)
            z = r * xt
            self.pending += z
            if self.user_mechanisms:
                self.user_pending[user] += z
                self.user_tick_counts[user] += 1
        self.t += 1
        self.vnorm2_sum += self._vnorm2[user]
        if self.t % self.tick == 0:
            self.release()

    def release(self) -> None:
        """Publish the statistics accumulated since the last tick (one tick)."""
        if self.mechanism is None and not self.user_mechanisms and not self._ridge_active:
            # no noise: the release is the exact sum, kept in place (no mechanism holds the arrays)
            self.b_exact += self.pending
            self.b_released = self.b_exact
            self.pending.fill(0.0)
            if self.tick > 1:
                self.ainv_released = self.ainv.copy()
                self._cache.clear()
            return
        self.b_exact = self.b_exact + self.pending
        if self.mechanism is not None and self.mech_state is not None:
            released, self.mech_state, _ = self.mechanism.step(self.mech_state, self.pending)
            self.b_released = released
        elif self.user_mechanisms:
            d = self.d
            for u in np.flatnonzero(self.user_tick_counts > 0):
                m = self.user_mechanisms[u]
                _, self.user_states[u], _ = m.step(self.user_states[u], self.user_pending[u])
                eta = m.noise(self.user_states[u])
                if self.block:
                    self.user_eta[u, u * d:(u + 1) * d] = eta
                else:
                    self.user_eta[u] = eta
            self.user_pending[:] = 0.0
            self.user_tick_counts[:] = 0
            # = sum over users of their latest noisy b_u (exactly b when noise is off)
            self.b_released = self.b_exact + self.user_eta.sum(axis=0)
        else:
            self.b_released = self.b_exact
        self.pending = np.zeros(self.dim)
        lam = self.lambda_
        if self.gram is not None and self.mechanism is not None and self.mech_state is not None:
            lam += self.noise_ridge * noise_std(self.mechanism, self.mech_state)
        if lam != self.lambda_:
            self.ainv_released = _ridge_inverse(self.gram, lam)  # type: ignore[arg-type]
            self._cache.clear()
        elif self.tick > 1:
            self.ainv_released = self.ainv.copy()
            self._cache.clear()
        self.lambda_released = lam

    @property
    def _ridge_active(self) -> bool:
        return self.noise_ridge > 0 and self.privacy.mode == "global" and not math.isinf(self.privacy.epsilon)

    # ------------------------------------------------------------------ widths

    def current_alpha(self) -> float:
        """The exploration width in force now."""
        if self.alpha != "theory":
            return float(self.alpha)
        lam, dn, dl = self.lambda_, self.dim, self.theory_delta
        # Lemma 2 (fixed: -2 log delta inside the root), S = sqrt(N) for unit theta_i
        base = math.sqrt(dn * math.log(1 + self.vnorm2_sum / (lam * dn)) - 2 * math.log(dl))
        base += math.sqrt(lam) * math.sqrt(self.n_users)
        return base + self._noise_bound() / math.sqrt(lam)

    def _noise_bound(self) -> float:
        """High-probability bound on ``||eta||_2`` (ERRATA O1), ``zeta = theory_delta``."""
        zeta = self.theory_delta
        if self.mechanism is not None and self.mech_state is not None:
            return _tree_noise_bound(self.mechanism, self.mech_state.step, self.dim, zeta)
        total = 0.0
        for m, s in zip(self.user_mechanisms, self.user_states):
            total += _tree_noise_bound(m, s.step, self.dim, zeta) ** 2
        return math.sqrt(total)

    # ------------------------------------------------------------------ state

    SCHEMA = "privrec.KroneckerUCB/1"

    def to_mapping(self) -> dict[str, bytes]:
        """All learned state as plain bytes (restored bit-exactly by :meth:`load_mapping`)."""
        arrays: dict[str, NDArray[np.generic]] = {
            "ainv": self.ainv, "pending": self.pending, "b_exact": self.b_exact, "b_released": self.b_released,
            "user_pending": self.user_pending, "user_eta": self.user_eta, "user_tick_counts": self.user_tick_counts,
        }
        if self.ainv_released is not self.ainv:
            arrays["ainv_released"] = self.ainv_released
        if self.gram is not None:
            arrays["gram"] = self.gram
        out = encode_arrays(arrays, scalars={"t": self.t, "vnorm2_sum": self.vnorm2_sum,
                                             "lambda_released": self.lambda_released}, schema=self.SCHEMA)
        if self.mech_state is not None:
            out.update({f"global/{k}": v for k, v in self.mech_state.to_mapping().items()})
        for u, s in enumerate(self.user_states):
            out.update({f"user{u}/{k}": v for k, v in s.to_mapping().items()})
        return out

    def load_mapping(self, mapping: dict[str, bytes]) -> None:
        """Restore the state written by :meth:`to_mapping` into this (same-config) policy."""
        own = {k: v for k, v in mapping.items() if "/" not in k}
        arrays, scalars = decode_arrays(own, schema=self.SCHEMA)  # type: ignore[arg-type]
        if arrays["ainv"].shape != self.ainv.shape:
            raise ValueError(f"state has `ainv` of shape {arrays['ainv'].shape}, expected {self.ainv.shape}.")
        self.ainv = arrays["ainv"].astype(np.float64)
        self.pending = arrays["pending"].astype(np.float64)
        self.b_exact = arrays["b_exact"].astype(np.float64)
        self.b_released = arrays["b_released"].astype(np.float64)
        self.user_pending = arrays["user_pending"].astype(np.float64)
        self.user_tick_counts = arrays["user_tick_counts"].astype(np.int64)
        self.user_eta = arrays["user_eta"].astype(np.float64)
        self.ainv_released = arrays["ainv_released"].astype(np.float64) if "ainv_released" in arrays else self.ainv
        if self.gram is not None:
            self.gram = arrays["gram"].astype(np.float64)
        self.lambda_released = float(scalars["lambda_released"])  # type: ignore[arg-type]
        self.t = int(scalars["t"])  # type: ignore[arg-type]
        self.vnorm2_sum = float(scalars["vnorm2_sum"])  # type: ignore[arg-type]
        if self.mechanism is not None:
            self.mech_state = self.mechanism.state_from_mapping(_sub(mapping, "global/"))
        self.user_states = [m.state_from_mapping(_sub(mapping, f"user{u}/")) for u, m in enumerate(self.user_mechanisms)]
        self._cache.clear()

    def _check_user(self, user: int) -> None:
        if type(user) is int and 0 <= user < self.n_users:  # the common case, without isinstance's tuple
            return
        if not (isinstance(user, (int, np.integer)) and 0 <= user < self.n_users):
            raise ValueError(f"`user` must be an integer in [0, {self.n_users}), got {user!r}.")


class RandomPolicy:
    """Uniformly random choice, keyed by ``(seed, t)`` so that it needs no RNG state."""

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = int(seed)
        self.t = 0

    def select(self, user: int, contexts: FloatArray) -> int:
        g = np.random.Generator(np.random.Philox(key=[self.seed, 0], counter=[0, self.t, 0, 0]))
        return int(g.integers(len(contexts)))

    def update(self, user: int, context: FloatArray, reward: float) -> None:
        self.t += 1


def _sub(mapping: dict[str, bytes], prefix: str) -> dict[str, bytes]:
    return {k[len(prefix):]: v for k, v in mapping.items() if k.startswith(prefix)}




def _ridge_inverse(gram: FloatArray, lam: float) -> FloatArray:
    """``(gram + lam I)^{-1}`` for one ``(n, n)`` or a stack ``(N, n, n)`` of symmetric PSD matrices."""
    n = gram.shape[-1]
    out: FloatArray = np.asarray(np.linalg.inv(gram + lam * np.eye(n)), dtype=np.float64)
    return out


def _tree_noise_bound(mech: Mechanism, step: int, dim: int, zeta: float) -> float:
    k = max(1, bin(step).count("1"))
    scale = float(getattr(mech, "scale", 0.0))
    if scale == 0:
        return 0.0
    if getattr(mech, "noise_kind", "gaussian") == "gaussian":
        return scale * math.sqrt(k) * (math.sqrt(dim) + math.sqrt(2 * math.log(1 / zeta)))
    return math.sqrt(dim) * k * scale * math.log(k * dim / zeta)
