"""The release and solve stages (leader-only), as plain classes the faust timers call.

Release (the privacy boundary of global mode): take a consistent snapshot of
the exact statistics, feed it to the continual-release mechanism as one
tick, **persist the new mechanism state together with the release, then
publish** the release. A crash between the two leaves a pending release that
:meth:`ReleaseStage.recover` publishes as it is: released noise is never
redrawn (and, with keyed noise, could not differ anyway).

Solve: turn the latest released statistics into per-unit serving models
``(theta_u, M_u)`` with a version, written atomically.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from models.accounting import describe, event_to_dict
from models.graphs import adjacency_from_w, goblin_projection, sensitivities
from models.mechanisms import MECHANISMS, Mechanism, make_mechanism
from models.streaming import ReleasedStats, Releaser, solve

from .catalog import Catalog
from .keys import PublicKeys
from .settings import Settings
from .trusted import TrustedStore

__all__ = ["ReleaseStage", "SolveStage", "projection", "privacy_statement"]


def projection(algorithm: str, W: np.ndarray) -> tuple[str, np.ndarray]:
    """``(structure, V)`` of an algorithm over a catalog's ``W``."""
    if algorithm == "linucb":
        return "linucb", np.eye(W.shape[0])
    if algorithm == "colin":
        return "kron", np.asarray(W, dtype=np.float64)
    return "kron", goblin_projection(adjacency_from_w(W))


def privacy_statement(settings: Settings, mechanism: Mechanism | None) -> dict[str, Any]:
    """What the released statistics guarantee, stated plainly."""
    if mechanism is None:
        return {"private": False, "guarantee": "none: epsilon = inf, statistics are released without noise"}
    g = describe(mechanism.event, settings.delta)
    return {
        "private": True,
        "mechanism": settings.mechanism,
        "mechanism_about": MECHANISMS[settings.mechanism],
        "epsilon": g.epsilon,
        "delta": g.delta,
        "valid": g.valid,
        "note": g.note,
        "neighbours": "event level, replace-one: two streams differing in the reward of one interaction "
                      "(rewards in [0, 1], contexts clipped to norm 1)",
        "scope": "every release ever published from this namespace, per interaction; a user with k "
                 "interactions is covered at group level k",
    }


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
        dim = self.catalog.n_units * self.catalog.d
        self.mechanism: Mechanism | None = None
        if s.private:
            self.mechanism = make_mechanism(
                s.mechanism, dim=dim, sensitivity=float(sensitivities(self.V).max()), epsilon=s.epsilon,
                delta=s.delta, horizon=s.tree_ticks, seed=self.store.noise_seed(),
                sensitivity_l1=float(np.abs(self.V).sum(axis=0).max() * math.sqrt(self.catalog.d)),
                mixing=self.V, block_dim=self.catalog.d)  # used by the user-space ("user-*") mechanisms
        self.releaser = Releaser(structure=self.structure, V=self.V, d=self.catalog.d, mechanism=self.mechanism)
        self.statement = privacy_statement(s, self.mechanism)

    def recover(self) -> int:
        """Publish a release that was persisted but not yet published (after a crash)."""
        return self.store.publish()

    def tick(self, *, force: bool = False) -> int | None:
        """Release the statistics as of now; ``None`` if nothing changed since the last release."""
        self.recover()
        c = self.catalog
        stats, offsets = self.store.snapshot(self.settings.partitions, c.n_units, c.d)
        last = self.client.hget(self.store.keys.pending, "count")
        if not force and last is not None and int(last) == int(stats.count.sum()):
            return None
        state = None
        if self.mechanism is not None:
            state = self.store.load_noise_state(self.mechanism) or self.mechanism.init_state()
        version = self.store.pending_version() + 1
        released, state = self.releaser.release(stats, state, version)
        event = json.dumps(event_to_dict(released.event))
        self.store.persist_release(state, released, event, offsets)
        self.store.publish()
        return version


@dataclass
class SolveStage:
    """Leader-only: released statistics → serving models."""

    settings: Settings
    client: redis.Redis
    statement: dict[str, Any]

    def __post_init__(self) -> None:
        self.keys = PublicKeys(self.settings.namespace)

    def run(self) -> int | None:
        """Solve the latest release if it is newer than the served models; return the new version."""
        raw = self.client.hgetall(self.keys.released)
        if not raw:
            return None
        version = int(raw[b"version"])
        served = self.client.hget(self.keys.model_meta, "version")
        if served is not None and int(served) >= version:
            return None
        released = ReleasedStats.from_mapping(raw)
        t0 = time.perf_counter()
        theta, M = solve(released, lambda_=self.settings.lambda_)
        solve_ms = (time.perf_counter() - t0) * 1e3
        s = self.settings
        meta = {
            "version": str(version), "algorithm": s.algorithm, "alpha": repr(s.alpha), "d": str(theta.shape[1]),
            "n_units": str(theta.shape[0]), "events": str(int(released.count.sum())),
            "solved_at_ms": str(int(time.time() * 1000)), "solve_ms": f"{solve_ms:.1f}",
            "privacy": json.dumps(self.statement),
            "event": (raw.get(b"event") or b'{"kind": "none"}').decode(),  # what every release spends
        }
        with self.client.pipeline(transaction=True) as pipe:
            for u in range(theta.shape[0]):
                pipe.hset(self.keys.model_unit(u), mapping={
                    "theta": theta[u].astype("<f8").tobytes(), "M": M[u].astype("<f8").tobytes(),
                    "version": str(version)})
            pipe.hset(self.keys.model_meta, mapping=meta)
            pipe.execute()
        return version
