"""Serving reads only released/model keys; malformed events go to dead-letters with a reason."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pipeline import services
from pipeline.config.keys import PublicKeys, partition_of
from pipeline.serve.serving import BadRequest, Recommender
from pipeline.state.trusted import TrustedStore

from stacks import Stack, open_stack, shown_as_served, synthetic_events, wait_for

pytestmark = pytest.mark.integration

_ns = itertools.count()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, redis_server: services.ServiceHandle) -> Iterator[Stack]:
    """One worker for the module, fed with good events and one of each kind of malformed event."""
    tmp = tmp_path_factory.mktemp("stack")
    with open_stack(tmp, redis_server.url, f"sd{next(_ns)}", env={"PRIVREC_EPSILON": "1"}) as st:
        st.start_worker()
        yield st


MALFORMED: dict[str, bytes] = {
    "not JSON": b"{not json",
    "not a JSON object": b"[1, 2, 3]",
    "missing field": json.dumps({"event_id": "m1", "user": "1", "arm": "2"}).encode(),
    "unknown user": json.dumps({"event_id": "m2", "user": "nobody", "arm": "2", "reward": 1}).encode(),
    "unknown arm": json.dumps({"event_id": "m3", "user": "1", "arm": "no-such-arm", "reward": 1}).encode(),
    "context has": json.dumps({"event_id": "m4", "user": "1", "arm": "2", "reward": 1,
                               "context": [0.1, 0.2]}).encode(),
    "not finite": b'{"event_id": "m5", "user": "1", "arm": "2", "reward": NaN}',
    "context has NaN": b'{"event_id": "m6", "user": "1", "arm": "2", "reward": 1, "context": [1, Infinity, 0, 0, 0]}',
    "outside [0, 1]": json.dumps({"event_id": "m7", "user": "1", "arm": "2", "reward": 1.5}).encode(),
    "must be a number": json.dumps({"event_id": "m8", "user": "1", "arm": "2", "reward": "yes"}).encode(),
    "invalid utf-8": b"\xff\xfe\x00garbage",
    # a good event keyed by another user lands on a partition that is not its user's: one user's cap must not be
    # split over partitions (the message below is sent with key "1", whose partition is not user 2's)
    "partition mismatch": json.dumps({"event_id": "m9", "user": "2", "arm": "2", "reward": 1}).encode(),
}


def test_malformed_events_land_in_dead_letters_and_good_ones_are_counted(running: Stack) -> None:
    catalog = running.catalog()
    good = [json.dumps(e).encode() for e in shown_as_served(running, list(synthetic_events(catalog, 300, seed=5)))]
    values: list[bytes] = []
    bad = list(MALFORMED.items())
    for i, g in enumerate(good):  # interleave: every 25th message is malformed
        values.append(g)
        if i % 25 == 0 and bad:
            values.append(bad.pop()[1])
    prod = running.producer()
    assert partition_of("1", 4) != partition_of("2", 4)  # what the "partition mismatch" case needs
    for v in values:
        try:  # the contract: the key is the event's user (malformed ones: any key)
            key = str(json.loads(v)["user"]).encode() if v != MALFORMED["partition mismatch"] else b"1"
        except (ValueError, KeyError, TypeError):
            key = b"1"
        prod.send("interactions", key=key, value=v)
    prod.flush()
    prod.close()
    wait_for(lambda: running.released_count() >= 300, 60, "the 300 good events in a release")
    assert running.released_count() == 300
    letters = running.dead_letters(len(MALFORMED))
    assert len(letters) == len(MALFORMED)
    reasons = [d["reason"] for d in letters]
    for kind in MALFORMED:
        if kind == "invalid utf-8":
            assert any(d["original_encoding"] == "base64" and "not JSON" in d["reason"] for d in letters)
        else:
            assert any(kind in r for r in reasons), (kind, reasons)
    for d in letters:
        assert d["topic"] == "interactions" and d["partition"] >= 0 and d["offset"] >= 0
    counts = TrustedStore(running.client, running.namespace).deadletter_counts(4)
    assert sum(counts.values()) == len(MALFORMED)


def test_serving_reads_only_released_and_model_keys(running: Stack) -> None:
    wait_for(lambda: running.model_version() > 0, 60, "a serving model")
    url = running.redis_url
    monitor_client = redis.Redis.from_url(url)
    seen: list[tuple[str, str]] = []  # (client "host:port", command)
    ready = threading.Event()
    done = threading.Event()

    def monitor() -> None:
        with monitor_client.monitor() as m:
            ready.set()
            for cmd in m.listen():
                seen.append((f"{cmd.get('client_address')}:{cmd.get('client_port')}", cmd["command"]))
                if done.is_set() and "PING-END" in cmd["command"]:
                    break

    t = threading.Thread(target=monitor, daemon=True)
    t.start()
    ready.wait(5)
    client = redis.Redis.from_url(url, single_connection_client=True)
    me = client.client_info()["addr"]
    rec = Recommender(client, running.namespace, running.catalog())
    for user in running.catalog().users:
        rec.recommend(user, None, k=3)
        rec.recommend(user, ["1", "2", "3"], k=2)
    rec._cache.clear()  # force cache misses too
    rec.recommend("0", None, k=1)
    with pytest.raises(BadRequest):
        rec.recommend("nobody", None, k=1)
    done.set()
    client.echo("PING-END")
    t.join(timeout=10)
    connection = ("HELLO", "CLIENT", "ECHO", "PING", "SELECT", "AUTH")  # no keys
    ours = [c for addr, c in seen if addr == me and c.split()[0].strip('"').upper() not in connection]
    keys = PublicKeys(running.namespace)
    allowed = tuple(p[:-1] for p in keys.patterns())
    touched = [part.strip('"') for c in ours for part in c.split()[1:2]]
    assert touched, "the monitor saw no serving reads"
    for key in touched:
        assert key.startswith(allowed), f"serving read {key!r}"
    assert not any(":trusted:" in k or ":noise:" in k for k in touched)
    # the item term (off here: a synthetic catalog) is looked up once per model version, not per request
    versions = {rec.meta()["version"]}
    assert touched.count(keys.model_items) <= 2 * len(versions) + 1 < 2 * len(running.catalog().users) + 1


def test_serving_module_cannot_reach_trusted_keys() -> None:
    code = ("import sys, pipeline.serve.serving\n"
            "print('pipeline.state.trusted' in sys.modules, hasattr(pipeline.serve.serving, 'TrustedKeys'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.stdout.split() == ["False", "False"]
