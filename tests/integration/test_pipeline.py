"""The streaming pipeline against a real Tansu broker and a real redis-server.

Workers run as real processes (``python -m pipeline.apps.worker``); events are
produced with kafka-python; results are compared with the offline ``models``
computation on the same events.
"""

from __future__ import annotations


import numpy as np
import pytest

from models.ground.linalg import ucb_scores
from models.streaming import ReleasedStats, Releaser, solve
from pipeline.serve.serving import Recommender
from pipeline.release.stages import projection
from pipeline.state.trusted import TrustedStore

from stacks import (Stack, Stream, assert_exact, assert_releases_deterministic, offline_stats, produce,
                    synthetic_events, wait_for)

pytestmark = pytest.mark.integration



@pytest.mark.parametrize("algorithm", ["linucb", "colin"])
def test_noise_off_stream_equals_offline_computation(stack: Stack, algorithm: str) -> None:
    stack.env.update({"PRIVREC_EPSILON": "inf", "PRIVREC_ALGORITHM": algorithm})
    stack.start_worker()
    catalog = stack.catalog()
    events = list(synthetic_events(catalog, 1500, seed=1))
    produced = produce(stack, events)
    wait_for(lambda: stack.released_count() == 1500, 60, "all 1500 events in a release")
    version = int(stack.released()[b"version"])
    wait_for(lambda: stack.model_version() >= version, 30, "the serving model of that release")

    s = stack.settings()
    exact = offline_stats(catalog, produced, s.partitions)
    streamed, offsets = TrustedStore(stack.client, s.namespace).snapshot(s.partitions, catalog.n_units, catalog.d)
    assert streamed.to_mapping() == exact.to_mapping()  # bit for bit

    released = ReleasedStats.from_mapping(stack.released())
    structure, V = projection(algorithm, catalog.W)
    offline_release, _ = Releaser(structure=structure, V=V, d=catalog.d, mechanism=None).release(exact, None)
    assert released.b_tilde.tobytes() == offline_release.b_tilde.tobytes()
    assert released.gram.tobytes() == exact.gram.tobytes()

    theta, M = solve(offline_release, lambda_=s.lambda_)
    rec = Recommender(stack.client, s.namespace, catalog)
    pool = [str(a) for a in range(20)]
    for user in catalog.users:
        got = rec.recommend(user, pool, k=5)
        unit = catalog.unit_of(user)
        mean, bonus = ucb_scores(theta[unit], M[unit], catalog.features_of(pool), s.alpha)
        order = np.argsort(-(mean + bonus), kind="stable")[:5]
        assert [it["item"] for it in got["items"]] == [pool[i] for i in order]
        assert [it["score"] for it in got["items"]] == [float((mean + bonus)[i]) for i in order]


def test_kill9_mid_stream_loses_nothing_and_redraws_nothing(stack: Stack) -> None:
    stack.env.update({"PRIVREC_EPSILON": "2", "PRIVREC_ALGORITHM": "colin"})
    worker = stack.start_worker()
    catalog = stack.catalog()
    events = list(synthetic_events(catalog, 4000, seed=2))

    stream = Stream(stack, events, rate=800)
    wait_for(lambda: 1000 < stack.released_count() < 3500, 30, "a release in the middle of the stream")
    stack.kill9(worker)
    before_crash = dict(stream.watcher.seen)
    stack.workers.remove(worker)
    stack.start_worker("worker-1")
    stream.join()
    wait_for(lambda: stack.released_count() == 4000, 90, "all 4000 events in a release after the restart")
    stream.watcher.stop()
    assert int(assert_exact(stack, catalog, stream.produced).count.sum()) == 4000  # nothing lost or doubled

    # Every published value, before and after the crash, is exactly what the mechanism gives for
    # the events that release covered (recomputed from the audit log and the secret seed).
    versions = assert_releases_deterministic(stack, catalog, stream.produced, stream.watcher, "colin")
    crash_version = max(before_crash)
    assert crash_version < versions[-1]
    assert len(before_crash) >= 2
