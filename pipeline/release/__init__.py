"""Flow, steps 2 and 3: the leader's release of noisy statistics, then the solve of serving models.

Modules
-------
stages            the release and solve stages as plain classes: mechanism state persisted
                  before publishing, released noise never redrawn
statements        the privacy statement of a release: its statistics, relation, guarantee and scope
timers            the leader-only tick: one release per ``tick_seconds``, then a solve
baseline_release  the same for the per-unit baselines (Shariff & Sheffet, DGS)
"""

__all__ = ["baseline_release", "stages", "statements", "timers"]
