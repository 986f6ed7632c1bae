"""The item term in the running pipeline, against the real broker and redis-server.

Noise off: the released item sums equal the exact sums of the produced feedback and listens, and the
served popularity is the feature of those sums. Noise on: the released item sums are the exact sums
plus the item mechanism's keyed noise (recomputed here from the namespace's secret), persisted before
they are published, and a worker restart changes nothing already published.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from models.ground.items import ReleasedItems, popularity_feature
from models.mechanisms import make_mechanism
from models.mechanisms.participation import replace_sensitivity
from pipeline.config.keys import PublicKeys
from pipeline.data.records import parse_interaction
from pipeline.release.stages import ITEM_MECHANISM, ITEM_STREAM, ITEM_THRESHOLD_STDS, item_term
from pipeline.state.trusted import TrustedKeys

from stacks import Stack, produce, wait_for

pytestmark = pytest.mark.integration

STACK = {"env": {"PRIVREC_ITEM_WEIGHT": "1.0"}}  # the `stack` fixture's (conftest.py)


def _events(stack: Stack, n: int, seed: int) -> list[dict[str, Any]]:
    """Feedback on catalog arms and organic listens, mixed."""
    rng = random.Random(seed)
    cat = stack.catalog()
    out = []
    for i in range(n):
        ev: dict[str, Any] = {"event_id": f"it{seed}-{i}", "user": str(rng.randrange(cat.n_units)),
                              "arm": str(rng.randrange(12)), "reward": float(rng.randrange(2)), "ts": 1.7e12 + i}
        if i % 3 == 0:
            ev.update(kind="listen", reward=1.0)
        out.append(ev)
    return out


def _exact_sums(stack: Stack, events: list[dict[str, Any]], n_items: int) -> np.ndarray:
    cat = stack.catalog()
    sums = np.zeros(n_items)
    for ev in events:
        sums[cat.arm_row(ev["arm"])] += ev["reward"]
    return sums


def test_noise_off_released_item_sums_are_exact_and_served(stack: Stack) -> None:
    stack.env["PRIVREC_EPSILON"] = "inf"
    stack.start_worker()
    events = _events(stack, 300, seed=1)
    produce(stack, events)
    wait_for(lambda: stack.released_count() == 300, 60, "all 300 events in a release")
    keys = PublicKeys(stack.namespace)
    raw = stack.client.hgetall(keys.released)
    items = ReleasedItems.from_mapping(raw)
    assert items is not None and items.noise_std == 0.0 and items.total == 300
    exact = _exact_sums(stack, events, stack.settings().n_arms)
    np.testing.assert_array_equal(items.sums, exact)
    version = int(raw[b"version"])
    wait_for(lambda: stack.model_version() >= version, 30, "the model of that release")
    model = stack.client.hgetall(keys.model_items)
    pop = np.frombuffer(model[b"pop"], dtype="<f8")
    np.testing.assert_array_equal(pop, popularity_feature(exact, total=300))
    assert float(model[b"weight"]) == 1.0
    # the listens counted in the bandit statistic with weight 0.2 (noise off): check one unit's b exactly
    cat = stack.catalog()
    from models.streaming import UnitStats
    from pipeline.state.trusted import TrustedStore

    s = stack.settings()
    streamed, _ = TrustedStore(stack.client, s.namespace).snapshot(s.partitions, cat.n_units, cat.d)
    b = np.zeros_like(streamed.b)
    for ev in events:
        u, x, r, _ = parse_interaction(json.dumps(ev).encode(), cat)
        w = np.sqrt(0.2) if ev.get("kind") == "listen" else 1.0
        b[u] += (w * r) * (w * x)
    np.testing.assert_allclose(streamed.b, b, atol=1e-12)
    assert isinstance(streamed, UnitStats)


def test_private_item_sums_carry_the_keyed_noise_and_survive_a_restart(stack: Stack) -> None:
    stack.env["PRIVREC_EPSILON"] = "2.0"
    worker = stack.start_worker()
    events = _events(stack, 200, seed=2)
    produce(stack, events)
    wait_for(lambda: stack.released_count() == 200, 60, "all 200 events in a release")
    keys = PublicKeys(stack.namespace)
    raw = stack.client.hgetall(keys.released)
    items = ReleasedItems.from_mapping(raw)
    assert items is not None and items.noise_std > 0
    s = stack.settings()
    exact = _exact_sums(stack, events, s.n_arms)
    # recompute the noise: the item mechanism keyed by the namespace's secret, stepped once per release
    seed = int(stack.client.get(TrustedKeys(s.namespace).secret))
    # replace neighbours: two nonnegative clipped item vectors differ by sqrt(2) x item_clip
    mech = make_mechanism(ITEM_MECHANISM, dim=s.n_arms, sensitivity=replace_sensitivity(s.clips[1], signed=False),
                          epsilon=s.epsilons()[1], delta=s.delta,
                          horizon=s.tree_ticks, seed=seed, stream=ITEM_STREAM)
    state = mech.init_state()
    for _ in range(int(raw[b"version"])):
        _, state, _ = mech.step(state, np.zeros(s.n_arms))
    np.testing.assert_allclose(items.sums - exact, mech.noise(state), atol=1e-9)
    # the served item term is post-processing of the release only
    weight, pop = item_term(items, s.item_term_weight)
    assert weight == pytest.approx(1.0 / (1.0 + (items.noise_std / 2.0) ** 2))
    assert np.all(pop[items.sums <= ITEM_THRESHOLD_STDS * items.noise_std] == 0)
    before = {k: v for k, v in stack.client.hgetall(keys.released).items()}
    stack.kill9(worker)
    stack.start_worker("worker-1")
    wait_for(lambda: stack.client.hget(keys.released, "version") is not None, 10, "the release after restart")
    after = stack.client.hgetall(keys.released)
    if after[b"version"] == before[b"version"]:
        assert after == before  # nothing new to release: the published release is untouched
    produce(stack, _events(stack, 30, seed=3))
    wait_for(lambda: stack.released_count() == 230, 60, "the new events in a release")
    again = ReleasedItems.from_mapping(stack.client.hgetall(keys.released))
    assert again is not None
    # the restarted worker continued the same keyed noise (no redraw): recompute at the new version
    version = int(stack.client.hget(keys.released, "version"))
    state = mech.init_state()
    for _ in range(version):
        _, state, _ = mech.step(state, np.zeros(s.n_arms))
    exact2 = exact + _exact_sums(stack, _events(stack, 30, seed=3), s.n_arms)
    np.testing.assert_allclose(again.sums - exact2, mech.noise(state), atol=1e-9)
