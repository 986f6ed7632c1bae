"""The supervisor and the repair of a degraded stack, against real processes (issue 12, "Supervision").

Real Tansu broker, redis-server, faust worker and web server started by :func:`privrec.ops.up` on a temp
state directory with the synthetic catalog and a short tick; processes are killed with SIGKILL. One stack
is shared by the restart and repair tests (a start costs ~6-9 s, a worker's group join after a kill ~6 s:
the dead member's session must time out); the limit and ``down`` test has a stack of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import services
from pipeline.config.settings import Settings
from privrec import ops
from privrec.ops.relaunch import SUPERVISOR
from privrec.ops.stackfile import read_tokens

from stacks import admin_url, alive, produce_synthetic as produce, released_events, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: A short backoff and poll, so a restart follows a kill within about a second.
POLICY = {"backoff_s": 0.2, "poll_s": 0.1}


def _settings(namespace: str) -> Settings:
    return Settings(d=5, n_users=6, n_arms=40, tick_seconds=0.3, namespace=namespace, user_cap=8)  # all learned


def _up(state: Path, namespace: str, **kw: Any) -> tuple[dict[str, Any], list[str]]:
    lines: list[str] = []
    info = ops.up(_settings(namespace), state, loglevel="WARNING", timeout=60, say=lines.append, **kw)
    return info, lines


def healthz(http: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{http}/healthz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def processes_of(state: Path) -> list[int]:
    """Live processes whose environment names ``state`` (workers, web, supervisor; not us)."""
    needle = f"PRIVREC_STATE_DIR={state}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def cli_status(state: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "privrec.cli", "status", "--state-dir", str(state), *extra],
                          capture_output=True, text=True, timeout=60)


def _new_pid(state: Path, name: str, old: int, timeout: float) -> int:
    def new() -> int | None:
        pid = ops.status(state, probe=False)["processes"].get(name)
        return pid if pid not in (None, old) else None

    pid: int = wait_for(new, timeout, f"{name} to be restarted")
    return pid


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("supervised") / "stack"
    info, lines = _up(state, "sup", supervise=POLICY)
    try:
        assert info["running"] and info["supervisor"]["running"], info
        assert any(line.startswith("supervisor pid") for line in lines), lines
        assert info["restarts"] == {} and info["given_up"] == {}
        yield state
    finally:
        ops.down(state)


def test_kill9_of_a_worker_is_restarted(stack: Path) -> None:
    before = ops.status(stack)
    old = before["processes"]["worker-0"]
    restarts = before["restarts"].get("worker-0", 0)
    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)
    new = _new_pid(stack, "worker-0", old, 10)
    assert time.monotonic() - t0 < 5 and alive(new)
    st = ops.status(stack)
    assert st["restarts"]["worker-0"] == restarts + 1 and st["given_up"] == {}
    assert st["supervisor"]["last"]["worker-0"]["old_pid"] == old
    assert st["supervisor"]["last"]["worker-0"]["new_pid"] == new
    # the new worker joins the group (the killed member's session times out first) and gets every partition
    wait_for(lambda: ops.status(stack)["workers"].get("worker-0", {}).get("pid") == new
             and ops.status(stack)["workers"]["worker-0"].get("partitions") == [0, 1, 2, 3], 40,
             "the restarted worker to own every partition")
    wait_for(lambda: healthz(st["http"]) == 200, 30, "/healthz 200")
    assert ops.status(stack)["running"] is True
    proc = cli_status(stack, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["restarts"]["worker-0"] == restarts + 1
    human = cli_status(stack)
    assert human.returncode == 0 and f"restarts: worker-0 {restarts + 1}" in human.stdout, human.stdout


def test_kill9_of_the_web_is_restarted_on_its_port(stack: Path) -> None:
    before = ops.status(stack)
    old, http = before["processes"]["web"], before["http"]
    os.kill(old, signal.SIGKILL)
    t0 = time.monotonic()
    new = _new_pid(stack, "web", old, 15)
    assert alive(new)
    want = before["restarts"].get("web", 0) + 1
    wait_for(lambda: ops.status(stack, probe=False)["restarts"].get("web") == want, 20,
             "the supervisor to count the restart (once /healthz answers)")
    assert time.monotonic() - t0 < 15
    assert healthz(http) in (200, 503)  # on the same address
    st = ops.status(stack)
    assert st["http"] == http and st["supervisor"]["last"]["web"]["new_pid"] == new
    assert st["running"] is True
    # the restarted server checks the same tokens (<state>/tokens.json): a user's token still opens their view
    tokens = read_tokens(stack)
    assert _view_status(http, "1", tokens.for_user("1")) in (200, 503)  # 503: no release yet, not a refusal
    assert _view_status(http, "1", tokens.operator) in (200, 503)
    assert _view_status(http, "1", tokens.for_user("2")) == 403


def _view_status(http: str, user: str, token: str | None) -> int:
    req = urllib.request.Request(f"{http}/budget?user={user}", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_up_repairs_a_degraded_stack_keeping_broker_and_redis(stack: Path) -> None:
    with pytest.raises(ops.AlreadyRunningError):  # everything runs: nothing to repair
        _up(stack, "sup", supervise=POLICY)
    before = ops.status(stack)
    restarts = before["restarts"]
    keeper = services.read_handles(stack)[SUPERVISOR]
    os.kill(keeper.pid, signal.SIGKILL)  # no supervisor: the worker stays dead
    old = before["processes"]["worker-0"]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: "worker-0" in ops.status(stack, probe=False)["stopped"], 10, "worker-0 to be seen dead")
    time.sleep(0.5)
    assert ops.status(stack, probe=False)["processes"].get("worker-0") is None
    proc = cli_status(stack)
    assert proc.returncode == 3 and "worker-0" in proc.stdout and "supervisor NOT RUNNING" in proc.stdout

    t0 = time.monotonic()
    info, lines = _up(stack, "sup", supervise=POLICY)
    took = time.monotonic() - t0
    text = "\n".join(lines)
    assert "repairing" in text and "worker-0" in text, text
    assert info["repaired"]["dead"] == ["worker-0"] and info["repaired"]["new_broker"] is False
    assert info["processes"]["kafka"] == before["processes"]["kafka"]
    assert info["processes"]["redis"] == before["processes"]["redis"]
    assert info["processes"]["web"] == before["processes"]["web"]
    assert info["processes"]["worker-0"] not in (None, old)
    assert info["workers"]["worker-0"]["pid"] == info["processes"]["worker-0"]
    assert info["running"] is True and info["supervisor"]["running"] and info["supervisor"]["pid"] != keeper.pid
    assert info["restarts"] == restarts  # the new supervisor carries the counts on; up's repair is not one
    assert info["repairs"][-1]["restarted"] == {"worker-0": info["processes"]["worker-0"]}
    assert took < 40
    wait_for(lambda: healthz(info["http"]) == 200, 30, "/healthz 200")


def test_up_after_the_broker_died_starts_a_new_one_and_resets_the_offsets(stack: Path) -> None:
    before = ops.status(stack)
    base = released_events(admin_url(stack), "sup")
    produce(before["kafka"], 120, seed=1)
    wait_for(lambda: released_events(admin_url(stack), "sup") == base + 120, 40, "120 events released")
    # no supervisor (it would repair the broker itself: test_outage.py): `privrec up` repairs
    os.kill(services.read_handles(stack)[SUPERVISOR].pid, signal.SIGKILL)
    os.kill(before["processes"]["kafka"], signal.SIGKILL)
    wait_for(lambda: "kafka" in ops.status(stack, probe=False)["stopped"], 10, "kafka to be seen dead")
    info, lines = _up(stack, "sup", supervise=POLICY)
    text = "\n".join(lines)
    assert "NEW embedded Tansu broker" in text and "offsets" in text and "were reset" in text, text
    assert info["repaired"]["new_broker"] is True and info["offsets_reset"]["events_kept"] >= base + 120
    assert info["processes"]["redis"] == before["processes"]["redis"]
    assert info["processes"]["kafka"] != before["processes"]["kafka"] and info["kafka"] == before["kafka"]
    assert info["processes"]["worker-0"] != before["processes"]["worker-0"]  # read the old log: started again
    assert info["processes"]["web"] == before["processes"]["web"]  # reconnects; its outbox kept the feedback
    assert info["running"] is True
    produce(info["kafka"], 80, seed=2)  # the new log starts at offset 0: nothing may be skipped
    wait_for(lambda: released_events(admin_url(stack), "sup") == base + 200, 40, "the new broker's 80 events released")


def test_limit_then_down_stops_everything_and_nothing_restarts(tmp_path: Path) -> None:
    state = tmp_path / "limited"
    try:
        info, _ = _up(state, "lim", supervise={**POLICY, "max_restarts": 1})
        web = info["processes"]["web"]
        os.kill(web, signal.SIGKILL)
        web2 = _new_pid(state, "web", web, 15)
        os.kill(web2, signal.SIGKILL)  # a second crash within the window: the limit is 1 restart
        wait_for(lambda: "web" in ops.status(state, probe=False)["given_up"], 10, "the supervisor to give up")
        time.sleep(0.5)
        st = ops.status(state)
        assert st["restarts"] == {"web": 1} and "web" in st["stopped"] and st["supervisor"]["running"]
        assert "crashed again after 1 restarts" in st["given_up"]["web"]
        proc = cli_status(state)
        assert proc.returncode == 3 and "GIVEN UP" in proc.stdout, proc.stdout

        # a worker killed right before down: the supervisor may be restarting it while down begins
        pids = {**st["processes"]}
        os.kill(pids["worker-0"], signal.SIGKILL)
        time.sleep(0.3)
    finally:
        lines: list[str] = []
        stopped = ops.down(state, say=lines.append)
    assert any("supervisor" in line for line in lines), lines
    assert "supervisor" not in dict(stopped)
    assert not alive(st["supervisor"]["pid"])
    time.sleep(1.5)  # nothing comes back
    assert processes_of(state) == []
    assert not any(alive(p) for p in pids.values())
    assert not list(state.glob("*.pid")) and not list(state.glob("*.service.json"))
    assert not (state / "stack.json").exists()
