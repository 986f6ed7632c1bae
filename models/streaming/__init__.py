"""The pipeline's math: exact statistics, private release, serving models.

The streaming pipeline splits one bandit into four stages (DESIGN §1); this
module is the pure part of each:

1. **ingest** — :class:`UnitStats` holds the exact sufficient statistics per
   model unit (``gram_u = sum x x^T``, ``b_u = sum r x``, ``count_u``);
   :meth:`UnitStats.add` folds in a batch of events with the same bits as
   adding them one by one, in order, so a batched stream and an offline
   replay agree exactly.
2. **release** — :class:`Releaser` turns exact statistics into released ones.
   The Gram matrices depend only on public contexts and are released as they
   are; the reward-dependent vector ``b_tilde = vec(B V^T)`` (``(V ⊗ I_d) b``)
   goes through a continual-release mechanism, one tick at a time.
3. **solve** — :func:`solve` turns released statistics into per-unit serving
   models ``(theta_u, M_u)`` (``d`` and ``d x d``).
4. **serve** — :func:`models.ground.linalg.ucb_scores` scores candidates from a
   serving model in ``O(K d^2)``.

Examples
--------
>>> import numpy as np
>>> stats = UnitStats.zeros(n_units=2, d=2)
>>> stats.add(np.array([0, 0, 1]), np.eye(2)[[0, 1, 0]], np.array([1.0, 0.0, 1.0]))
>>> stats.count.tolist()
[2, 1]
>>> rel = Releaser(structure="linucb", V=np.eye(2), d=2, mechanism=None)
>>> released = rel.release(stats, rel.init_state())[0]
>>> theta, M = solve(released, lambda_=1.0)
>>> theta[0].round(3).tolist()
[0.5, 0.0]
"""

from __future__ import annotations

from .release import ReleasedStats, Releaser
from .solve import solve
from .stats import UnitStats

__all__ = ["UnitStats", "ReleasedStats", "Releaser", "solve"]
