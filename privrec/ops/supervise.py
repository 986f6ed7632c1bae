"""The stack's supervisor: restart a crashed worker or web server, repair a dead broker or redis, with backoff
and a limit.

``privrec up`` starts it as a tracked process of its own (``python -m privrec.ops.supervise --state-dir
DIR``, in its own session, like the others); ``privrec down`` stops it first, so it never restarts what
``down`` stops. Every ``--poll-s`` seconds it checks the processes ``stack.json`` lists that it supervises
(:func:`~privrec.ops.relaunch.supervised`: the workers and the web server) by PID and start time
(:func:`pipeline.services.is_running`). A process found dead is started again exactly as ``up`` started it
(:func:`~privrec.ops.relaunch.relaunch`) after ``backoff_s * 2**k`` seconds, ``k`` being its restarts in
the last ``window_s`` seconds (0.5 s, 1 s, 2 s, ... at most ``max_backoff_s``). After ``max_restarts``
restarts in ``window_s`` seconds it gives up on that process (a crash loop: its log says why) and says so
in its report; ``privrec up`` on the stack starts it again and a new supervisor.

A dead embedded broker or redis-server (:data:`REPAIRED`; not an external one) is repaired as ``privrec up``
repairs a degraded stack — :func:`privrec.ops.repair.repair`, under the state directory's lock, without
stopping this supervisor: redis-server again on its port from its AOF; a new memory-only broker on its port,
the topics, the offsets reset and the workers restarted (the web server keeps running: its outbox holds the
feedback, :mod:`pipeline.serve.outbox`). The same backoff and limit apply, per service; each repair is counted in
the report's ``restarts`` and ``last``, in ``stack.json``'s ``repairs`` (``"by": "supervisor"``) and in
Redis (:attr:`pipeline.config.keys.PublicKeys.stack_repairs`: the web's ``privrec_stack_repairs_total``).

The report, ``DIR/supervisor.json``, written after every change::

    {"pid": 4242, "policy": {...}, "restarts": {"worker-0": 1},
     "given_up": {"web": "6th crash within 60 s (5 restarts allowed): ..."},
     "last": {"worker-0": {"at": "...", "old_pid": 10, "new_pid": 11, "exit": "killed by signal 9"}}}

``privrec status`` shows it. Restart counts survive a repair (``privrec up`` on a degraded stack starts a
new supervisor, which carries them on); a new stack starts from none.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline import services
from pipeline.services import ServiceError, ServiceHandle

from .relaunch import SUPERVISION_DEFAULTS, read_report, relaunch, supervised, write_report
from .stackfile import KAFKA, REDIS, OpsError, admin_redis_url, locked, read_stack

__all__ = ["RestartPolicy", "main", "supervise", "REPAIRED"]

#: The services the supervisor repairs as ``privrec up`` does (:func:`~privrec.ops.repair.repair`), not one by one.
REPAIRED = (KAFKA, REDIS)



class RestartPolicy:
    """When to restart a dead process, and when to give up on it (pure: the clock is passed in).

    >>> p = RestartPolicy(max_restarts=2, window_s=60, backoff_s=0.5, max_backoff_s=30)
    >>> p.decide("w", died_at=0.0, now=0.1)
    ('wait', 0.5)
    >>> p.decide("w", died_at=0.0, now=0.5)
    ('restart', 0.5)
    >>> p.restarted("w", 0.5); p.decide("w", died_at=1.0, now=1.5)
    ('wait', 1.0)
    >>> p.restarted("w", 2.0); p.decide("w", died_at=3.0, now=3.0)[0]
    'give up'
    >>> p.decide("w", died_at=70.0, now=72.0)  # the window has moved on: 2 restarts older than 60 s
    ('restart', 0.5)
    """

    def __init__(self, *, max_restarts: int, window_s: float, backoff_s: float, max_backoff_s: float) -> None:
        self.max_restarts, self.window_s = max_restarts, window_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self._times: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)

    def recent(self, name: str, now: float) -> int:
        """Restarts of ``name`` in the last ``window_s`` seconds."""
        times = self._times[name]
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return len(times)

    def delay(self, name: str, now: float) -> float:
        return float(min(self.backoff_s * 2 ** self.recent(name, now), self.max_backoff_s))

    def decide(self, name: str, *, died_at: float, now: float) -> tuple[str, Any]:
        """``('restart', delay)``, ``('wait', delay)`` (not yet: backoff) or ``('give up', reason)``."""
        k = self.recent(name, now)
        if k >= self.max_restarts:
            return "give up", (f"crashed again after {k} restarts within {self.window_s:g} s "
                               f"(limit {self.max_restarts})")
        delay = self.delay(name, now)
        return ("restart" if now - died_at >= delay else "wait"), delay

    def restarted(self, name: str, at: float) -> None:
        self._times[name].append(at)


def _exit_of(pid: int) -> str | None:
    """How our child ``pid`` exited (reaping it), ``None`` while it runs or when it is not our child."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if done == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    return f"exit code {code}" if code >= 0 else f"killed by signal {-code}"


def supervise(state: Path, policy: RestartPolicy, *, poll_s: float = 0.25, should_stop: Callable[[], bool],
              log: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
    """Watch ``state``'s stack until ``should_stop()`` or its ``stack.json`` is gone."""
    previous = read_report(state)
    report: dict[str, Any] = {
        "pid": os.getpid(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "policy": {"max_restarts": policy.max_restarts, "window_s": policy.window_s, "backoff_s": policy.backoff_s,
                   "max_backoff_s": policy.max_backoff_s},
        "restarts": dict(previous.get("restarts") or {}), "given_up": {}, "last": dict(previous.get("last") or {}),
    }
    write_report(state, report)
    known: dict[str, ServiceHandle] = {}  # last handle seen per process (a failed start removes its files)
    died: dict[str, float] = {}
    exits: dict[str, str] = {}
    while not should_stop():
        try:
            stack = read_stack(state)
        except OpsError:
            stack = {}
        if stack is None:
            log("stack.json is gone (privrec down?): exiting")
            return
        if stack.get("phase") != "running":
            time.sleep(poll_s)
            continue
        handles = services.read_handles(state)
        if _repair_services(state, stack, handles, known, policy, report, died, log, clock):
            continue  # the stack changed: read it again
        for name in stack.get("processes", []):
            if not supervised(name) or name in report["given_up"] or should_stop():
                continue
            h = handles.get(name) or known.get(name)
            if h is None:
                continue
            known[name] = h
            how = _exit_of(h.pid)
            if how is not None:
                exits[name] = how
            detail = _due(state, name, h, policy=policy, report=report, died=died, log=log, clock=clock,
                          how=exits.get(name, "exit status unknown"), then="`privrec up` restarts it")
            if detail is None:
                continue
            now = clock()
            policy.restarted(name, now)
            report["restarts"][name] = report["restarts"].get(name, 0) + 1
            entry = {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "old_pid": h.pid, "backoff_s": detail,
                     "exit": exits.pop(name, "exit status unknown")}
            try:
                new = relaunch(state, stack, h)
            except (ServiceError, OSError) as exc:
                entry["error"] = str(exc).splitlines()[0]
                log(f"restart {report['restarts'][name]} of {name} failed: {exc}")
                died[name] = clock()
            else:
                known[name] = new
                died.pop(name, None)
                entry["new_pid"] = new.pid
                log(f"restarted {name}: pid {h.pid} -> {new.pid} (restart {report['restarts'][name]}, "
                    f"after {detail:g} s backoff)")
            report["last"][name] = entry
            write_report(state, report)
        time.sleep(poll_s)
    log("stopping (SIGTERM)")


def _due(state: Path, name: str, h: ServiceHandle, *, policy: RestartPolicy, report: dict[str, Any],
         died: dict[str, float], log: Callable[[str], None], clock: Callable[[], float], how: str,
         then: str) -> float | None:
    """The backoff waited if the process ``name`` (``h``) is dead and due for a restart now; ``None`` while it
    runs, waits out its backoff, or once given up on (said in the report and the log, with ``then``)."""
    if services.is_running(h):
        died.pop(name, None)
        return None
    now = clock()
    if name not in died:
        died[name] = now
        log(f"{name} (pid {h.pid}) is not running ({how})")
    action, detail = policy.decide(name, died_at=died[name], now=now)
    if action == "wait":
        return None
    if action == "give up":
        report["given_up"][name] = f"{detail}; last pid {h.pid}, log {h.log_path}"
        log(f"giving up on {name}: {detail}; {then}")
        write_report(state, report)
        return None
    return float(detail)


def _repair_services(state: Path, stack: dict[str, Any], handles: dict[str, ServiceHandle],
                     known: dict[str, ServiceHandle], policy: RestartPolicy, report: dict[str, Any],
                     died: dict[str, float], log: Callable[[str], None], clock: Callable[[], float]) -> bool:
    """A dead embedded broker or redis-server: repair the stack as ``privrec up`` does, with the restart policy's
    backoff and limit. Returns whether a repair ran."""
    from .repair import repair

    external = stack.get("external") or {}
    dead: list[str] = []
    for name in REPAIRED:
        if name not in stack.get("processes", []) or external.get(name) or name in report["given_up"]:
            continue
        h = handles.get(name) or known.get(name)
        if h is None:
            continue
        known[name] = h
        if _due(state, name, h, policy=policy, report=report, died=died, log=log, clock=clock, how="exit status unknown",
                then="`privrec up` repairs it") is not None:
            dead.append(name)
    if not dead:
        return False
    now = clock()
    entries = {}
    for name in dead:
        policy.restarted(name, now)
        report["restarts"][name] = report["restarts"].get(name, 0) + 1
        entries[name] = {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "old_pid": known[name].pid, "repair": True}
    t0 = time.monotonic()
    try:
        with locked(state, "the supervisor's repair"):
            current = read_stack(state)
            if current is None:
                return True
            done = repair(state, current, note=lambda line: log(f"repair: {line}"), timeout=120, by_supervisor=True)
    except (OpsError, ServiceError, OSError) as exc:
        log(f"repair of {', '.join(dead)} failed: {str(exc).splitlines()[0]}")
        for name in dead:
            entries[name]["error"] = str(exc).splitlines()[0]
            died[name] = clock()
    else:
        took = round(time.monotonic() - t0, 1)
        for name in dead:
            died.pop(name, None)
            known.pop(name, None)
            entries[name].update(new_pid=done["restarted"].get(name), seconds=took)
        log(f"repaired the stack ({', '.join(dead)} dead) in {took} s: restarted {done['restarted']}")
        _count_repairs(current, dead, log)
    for name in dead:
        report["last"][name] = entries[name]
    write_report(state, report)
    return True


def _count_repairs(stack: dict[str, Any], names: list[str], log: Callable[[str], None]) -> None:
    import redis

    from pipeline.config.keys import PublicKeys

    try:
        client = redis.Redis.from_url(admin_redis_url(stack), socket_timeout=5)
        try:
            for name in names:
                client.hincrby(PublicKeys(str(stack["namespace"])).stack_repairs, name, 1)  # the web's counter
        finally:
            client.close()
    except (redis.RedisError, KeyError) as exc:
        log(f"repairs not counted in Redis: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    d = SUPERVISION_DEFAULTS
    p = argparse.ArgumentParser(prog="python -m privrec.ops.supervise", description=__doc__.split("\n\n")[0])
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--max-restarts", type=int, default=int(d["max_restarts"]))
    p.add_argument("--window-s", type=float, default=d["window_s"])
    p.add_argument("--backoff-s", type=float, default=d["backoff_s"])
    p.add_argument("--max-backoff-s", type=float, default=d["max_backoff_s"])
    p.add_argument("--poll-s", type=float, default=d["poll_s"])
    args = p.parse_args(argv)
    stop = False

    def on_signal(_sig: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def log(line: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} supervisor: {line}", flush=True)

    policy = RestartPolicy(max_restarts=args.max_restarts, window_s=args.window_s, backoff_s=args.backoff_s,
                           max_backoff_s=args.max_backoff_s)
    state = args.state_dir.resolve()
    log(f"watching {state} (at most {args.max_restarts} restarts in {args.window_s:g} s per process)")
    supervise(state, policy, poll_s=args.poll_s, should_stop=lambda: stop, log=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
