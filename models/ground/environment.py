"""The collaborative paper's synthetic environment, with a regret oracle.

Setting (spec collaborative-dp-bandits §8; choices where the paper is silent
follow the spec's recommendations and are listed by :meth:`settings`):

* ``N`` users with ``theta_i ~ U(0,1)^d`` L2-normalised;
* ``W``: ``w_ij ∝ <theta_i, theta_j>``, off-diagonal entries below the
  ``w_quantile`` of the off-diagonal similarities removed (spec G11: median),
  columns normalised; ``w_quantile=0`` is fully connected (near-uniform);
* ``K`` arms ``x_a ~ U(0,1)^d`` L2-normalised (``Lx = 1``); each round shows
  ``n_shown`` arms drawn without replacement;
* reward ``x^T theta_eff_u + N(0, reward_std^2)`` with
  ``theta_eff_u = Theta W[:, u]`` (the ``kron`` / Vec form, ERRATA §2),
  clipped to ``[0, 1]`` when ``clip_rewards`` (the DP sensitivities assume
  rewards in ``[0, 1]``; spec G5);
* users arrive round-robin, ``T`` counts interactions (spec G13, G14).

All randomness is drawn up front from the seed, so every algorithm run on the
same environment sees the same users, shown arms and reward noise (common
random numbers): differences between algorithms are paired.

Examples
--------
>>> env = SyntheticEnvironment(n_users=3, d=4, n_arms=20, n_shown=5, horizon=6, seed=0)
>>> r = env.round(0)
>>> r.user, r.contexts.shape
(0, (5, 4))
>>> bool(env.regret(0, int(r.means.argmax())) == 0.0)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .graphs import similarity_w

__all__ = ["SyntheticEnvironment", "Round"]

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Round:
    """One interaction: who arrives, what is shown, and what each choice would pay."""

    t: int
    user: int
    arm_ids: NDArray[np.int64]
    contexts: FloatArray
    means: FloatArray
    rewards: FloatArray


class SyntheticEnvironment:
    """Seeded synthetic collaborative-bandit environment (see module docstring).

    Parameters
    ----------
    n_users, d, n_arms, n_shown
        ``N``, context dimension, pool size ``K`` and arms shown per round.
    reward_std
        Std of the Gaussian reward noise (spec G10: 0.1).
    w_quantile
        Off-diagonal similarity quantile below which edges are removed.
    horizon
        Number of interactions ``T`` to pre-draw.
    seed
        Seed of every random draw of the environment.
    clip_rewards
        Clip observed rewards to ``[0, 1]``.
    """

    def __init__(
        self,
        *,
        n_users: int = 10,
        d: int = 25,
        n_arms: int = 1000,
        n_shown: int = 10,
        reward_std: float = 0.1,
        w_quantile: float = 0.5,
        horizon: int = 10_000,
        seed: int = 0,
        clip_rewards: bool = True,
    ) -> None:
        for name, v in (("n_users", n_users), ("d", d), ("n_arms", n_arms), ("n_shown", n_shown),
                        ("horizon", horizon)):
            if int(v) < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {v}.")
        if n_shown > n_arms:
            raise ValueError(f"`n_shown` ({n_shown}) must not exceed `n_arms` ({n_arms}).")
        if reward_std < 0:
            raise ValueError(f"`reward_std` must be non-negative, got {reward_std}.")
        self.n_users, self.d, self.n_arms, self.n_shown = int(n_users), int(d), int(n_arms), int(n_shown)
        self.reward_std, self.w_quantile = float(reward_std), float(w_quantile)
        self.horizon, self.seed, self.clip_rewards = int(horizon), int(seed), bool(clip_rewards)

        s_theta, s_arms, s_shown, s_noise = np.random.SeedSequence(seed).spawn(4)
        theta = np.random.default_rng(s_theta).random((self.n_users, self.d))
        self.theta: FloatArray = theta / np.linalg.norm(theta, axis=1, keepdims=True)
        self.W: FloatArray = similarity_w(self.theta, self.w_quantile)
        self.theta_eff: FloatArray = self.W.T @ self.theta  # row u = sum_j W[j,u] theta_j
        arms = np.random.default_rng(s_arms).random((self.n_arms, self.d))
        self.arms: FloatArray = arms / np.linalg.norm(arms, axis=1, keepdims=True)
        self.users: NDArray[np.int64] = np.arange(self.horizon, dtype=np.int64) % self.n_users
        self.shown: NDArray[np.int64] = _sample_without_replacement(
            np.random.default_rng(s_shown), self.horizon, self.n_arms, self.n_shown)
        self.noise: FloatArray = np.random.default_rng(s_noise).standard_normal(
            (self.horizon, self.n_shown)) * self.reward_std
        self.means: FloatArray = np.einsum("tkd,td->tk", self.arms[self.shown], self.theta_eff[self.users])
        rewards = self.means + self.noise
        self.rewards: FloatArray = np.clip(rewards, 0.0, 1.0) if self.clip_rewards else rewards
        self._best = self.means.max(axis=1)

    def round(self, t: int) -> Round:
        """The ``t``-th interaction (0-based)."""
        ids = self.shown[t]
        return Round(t, int(self.users[t]), ids, self.arms[ids], self.means[t], self.rewards[t])

    def regret(self, t: int, choice: int) -> float:
        """Pseudo-regret of showing position ``choice`` of round ``t``."""
        return float(self._best[t] - self.means[t, choice])

    def random_regret(self) -> FloatArray:
        """Exact expected per-round regret of the uniformly random policy."""
        out: FloatArray = self._best - self.means.mean(axis=1)
        return out

    def settings(self) -> dict[str, Any]:
        """Every parameter, for experiment reports."""
        return {
            "n_users": self.n_users, "d": self.d, "n_arms": self.n_arms, "n_shown": self.n_shown,
            "reward_std": self.reward_std, "w_quantile": self.w_quantile, "horizon": self.horizon,
            "clip_rewards": self.clip_rewards, "user_order": "round-robin",
            "theta": "U(0,1)^d, L2-normalised", "arms": "U(0,1)^d, L2-normalised (Lx = 1)",
            "W": "w_ij ∝ <theta_i, theta_j>, off-diagonal below the quantile removed, columns normalised",
        }


def _sample_without_replacement(rng: np.random.Generator, rows: int, n: int, k: int) -> NDArray[np.int64]:
    """``rows`` independent uniform ``k``-subsets of ``range(n)`` (random order), chunked."""
    out = np.empty((rows, k), dtype=np.int64)
    chunk = max(1, 4_000_000 // n)
    for start in range(0, rows, chunk):
        m = min(chunk, rows - start)
        keys = rng.random((m, n))
        idx = np.argpartition(keys, k - 1, axis=1)[:, :k]
        order = np.argsort(np.take_along_axis(keys, idx, axis=1), axis=1)
        out[start:start + m] = np.take_along_axis(idx, order, axis=1)
    return out
