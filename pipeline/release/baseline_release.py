"""Release of the per-unit baselines (Shariff & Sheffet, DGS): trusted state and the pending release.

The baselines (``--algorithm ss-*`` / ``dgs-*``; :data:`pipeline.config.settings.BASELINE_ALGORITHMS`)
keep one mechanism per model unit (:class:`models.policies.peruser.PerUserLinUCB`). Each
release tick feeds the exact per-unit prefix sums to
:meth:`~models.policies.peruser.PerUserLinUCB.release_from_stats`; the units whose public
interaction count grew advance, and the result is every unit's serving model
(:class:`~models.policies.peruser.ServingModels`: ``theta_u``, ``C_u``, ``width_u``).

Trusted keys (the layout of :mod:`pipeline.state.trusted`, same hash tag, so one
MULTI/EXEC writes both):

* ``{ns}:noise:{ns:rel}:state`` — hash: the baseline's stream state
  (``u<k>/tree/*``: unit ``k``'s mechanism state with its exact prefix and node
  noise; ``u<k>/model/*``: its serving model; shared ``meta`` / ``a:counts``)
  plus ``release_version``. A tick writes the shared fields and the units
  that advanced, never the others.
* ``{ns}:noise:{ns:rel}:pending`` — the release (``ServingModels`` mapping plus
  ``version``, ``count``, ``event``, ``offsets``) until it is published by
  :meth:`pipeline.state.trusted.TrustedStore.publish`, like every other algorithm's.

The secret noise seed is the namespace's (``{ns}:trusted:{ns:rel}:secret``);
unit ``k``'s noise is keyed by ``(seed, stream 1 + k, epoch, level, index)``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import redis

from models.policies.peruser import PerUserLinUCB, ServingModels
from models.policies.baselines import make_baseline
from models.policies.dgs import pool_lambda_0

from ..data.catalog import Catalog
from ..config.settings import Settings
from ..state.trusted import TrustedKeys

__all__ = ["build_baseline", "BaselineStateStore", "widths_summary", "CONTEXT_BOUND", "REWARD_BOUND"]

#: The bounds ingest enforces (contexts clipped to norm 1, rewards rejected outside [0, 1]).
CONTEXT_BOUND = 1.0
REWARD_BOUND = 1.0

_VERSION_FIELD = "release_version"


def build_baseline(settings: Settings, catalog: Catalog, seed: int) -> PerUserLinUCB:
    """The baseline of ``settings.algorithm`` over the catalog's units, keyed by the secret ``seed``.

    Each unit's tree is sized for ``2**tree_levels - 1`` of its own releases.
    S&S use their own width (Prop. 4, ``alpha="theory"``); DGS the constant
    ``alpha`` and ``lambda_0`` from the catalog's public arm features (spec
    D.9 option 2, as in ``privrec experiment mechanisms``).
    """
    name = settings.baseline
    if name is None:
        raise ValueError(f"`settings.algorithm` must be a baseline, got {settings.algorithm!r}.")
    options: dict[str, Any] = {}
    alpha: float | str = "theory"
    if name.startswith("DGS-"):
        alpha = settings.alpha
        options["lambda_0"] = pool_lambda_0(catalog.feature_matrix)
    return make_baseline(name, d=catalog.d, n_users=catalog.n_units, lambda_=settings.lambda_,
                         alpha=alpha,  # type: ignore[arg-type]
                         epsilon=settings.epsilon, delta=settings.delta, seed=seed,
                         user_horizon=settings.tree_ticks, context_bound=CONTEXT_BOUND, reward_bound=REWARD_BOUND,
                         **options)


class BaselineStateStore:
    """Trusted reads and writes of a baseline's stream state and its pending release."""

    def __init__(self, client: redis.Redis, ns: str) -> None:
        self.r = client
        self.keys = TrustedKeys(ns)

    def stored_version(self) -> int | None:
        """Version of the release the stored state belongs to (``None``: nothing stored yet)."""
        raw = self.r.hget(self.keys.noise_state, _VERSION_FIELD)
        return None if raw is None else int(raw)

    def load(self, policy: PerUserLinUCB) -> int | None:
        """Restore ``policy`` from the stored state (a fresh policy if none); return the state's version."""
        raw = self.r.hgetall(self.keys.noise_state)
        if not raw:
            policy.reset()
            return None
        policy.load_stream_state(raw)  # type: ignore[arg-type]
        return int(raw[_VERSION_FIELD.encode()])

    def persist(self, state: dict[str, bytes], release: ServingModels, *, version: int, event: dict[str, Any],
                offsets: list[int]) -> None:
        """Write the new state (the advanced units' fields) and the pending release in one transaction.

        Called *before* publishing: a crash afterwards leaves a pending
        release that is published as it is, never recomputed with new noise.
        """
        mapping: dict[str, Any] = dict(release.to_mapping())
        mapping.update({"version": str(version), "count": str(int(release.count.sum())),
                        "event": json.dumps(event), "offsets": json.dumps(offsets)})
        fields: dict[str, bytes] = {**state, _VERSION_FIELD: str(version).encode()}
        with self.r.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.noise_state, mapping=fields)  # type: ignore[arg-type]
            pipe.delete(self.keys.pending)
            pipe.hset(self.keys.pending, mapping=mapping)  # type: ignore[arg-type]
            pipe.execute()


def widths_summary(width: np.ndarray) -> dict[str, str]:
    """Model-meta fields describing per-unit widths (min, median, max)."""
    w = np.asarray(width, dtype=np.float64)
    return {"width_min": repr(float(w.min())), "width_median": repr(float(np.median(w))),
            "width_max": repr(float(w.max()))} if len(w) and bool(np.isfinite(w).all()) else {}
