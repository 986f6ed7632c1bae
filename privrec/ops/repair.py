"""``privrec up`` on a degraded stack: start again only what died, keep what runs.

A stack is *degraded* when some of the processes ``stack.json`` lists (or its supervisor) no longer run
while others do: a crashed worker, a web server the supervisor gave up on, a dead redis or broker.
:func:`repair` (called by :func:`~privrec.ops.up.up` under the state directory's lock) stops the
supervisor (so the two do not restart the same process), then starts again, with the settings
``stack.json`` recorded:

* a dead ``redis`` — on its port, from its AOF (the workers reconnect on their own);
* a dead ``kafka`` — a *new* memory-only broker on its port (no sooner than :data:`NEW_BROKER_AFTER_S` after the
  old one was seen dead, see :func:`start_new_broker`), whose log starts at offset 0: every worker is
  restarted too (its in-memory positions belong to the old log), the topics created again and the
  namespace's stored ingest offsets reset, exactly as ``up`` does for a new broker (otherwise the new log's
  first events would be skipped as "already counted"), where they stood in the old logs recorded for the web's
  outbox, which sends again what the old broker held and no worker had counted (:mod:`pipeline.serve.outbox`); the
  web server keeps running (its Kafka clients reconnect to the same address);
* the dead workers and web server, exactly as ``up`` started them
  (:func:`~privrec.ops.relaunch.relaunch`), waiting until every worker has partitions again;
* a new supervisor, which carries on the restart counts.

The live broker and redis are never replaced. Federated stacks are not repaired (``down``, then ``up``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import redis

from pipeline import services
from pipeline.config.kafkaconn import PRODUCE_TIMEOUT_MS
from pipeline.services import PortInUseError, ServiceHandle
from pipeline.config.settings import Settings

from .relaunch import (SUPERVISION_DEFAULTS, fallback_handle, relaunch, stack_settings, start_supervisor, stop_supervisor,
                       supervised)
from .stackfile import KAFKA, REDIS, WEB, OpsError, admin_redis_url, read_stack, recorded_handles, running_processes, settings_dict, worker_status_key, write_stack
from .workers import create_stack_topics, reset_after_new_broker, wait_workers

__all__ = ["check_same_settings", "repair", "start_new_broker", "NEW_BROKER_AFTER_S"]

#: Seconds between seeing the embedded broker dead and starting its replacement on the same port: the web server's
#: feedback producer retries a record batch the dead broker did not acknowledge until its first failed attempt
#: :data:`~pipeline.config.kafkaconn.PRODUCE_TIMEOUT_MS` after the batch was made, and a new broker listening
#: meanwhile would take the retry. Tansu acknowledges a produce to a topic it does not have yet (the repair creates the
#: topics a moment after the start) without keeping it, and the partition's log is damaged from then on: a record
#: produced later at an offset of that batch is acknowledged and never read — acknowledged feedback lost (issue 25).
#: The margin (5 s) covers a web server whose event loop stalls under load.
NEW_BROKER_AFTER_S = PRODUCE_TIMEOUT_MS / 1000 + 5.0


def check_same_settings(state: Path, stack: Mapping[str, Any], settings: Settings, workers: int) -> None:
    """Refuse to repair with other settings than the stack was started with (the repair uses the recorded ones)."""
    recorded = stack_settings(stack)
    external = stack.get("external") or {}
    wanted = settings
    if not external.get("kafka"):
        wanted = wanted.replace(kafka=recorded.kafka)
    if not external.get("redis"):
        wanted = wanted.replace(redis_url=recorded.redis_url)
    a, b = settings_dict(recorded), settings_dict(wanted)
    diff = {k: {"stack": a[k], "requested": b[k]} for k in sorted(a) if a[k] != b.get(k)}
    if int(stack.get("workers", workers)) != workers:
        diff["workers"] = {"stack": stack.get("workers"), "requested": workers}
    if diff:
        raise OpsError(f"the degraded stack in {state} was started with other settings than requested: {diff}; "
                       f"`privrec up` repairs it only with the same settings (it restarts the dead processes as "
                       f"they were), or stop it first with `privrec down --state-dir {state}`")


def _port(address: str) -> int:
    return int(address.rstrip("/").rpartition(":")[2].split("/")[0])


def start_new_broker(state: Path, address: str, *, dead_since: float, timeout: float,
                     note: Callable[[str], None]) -> ServiceHandle:
    """A new memory-only broker on ``address``'s port (another port if it is taken), started no sooner than
    :data:`NEW_BROKER_AFTER_S` after ``dead_since`` (``time.monotonic()`` when the old broker was seen dead), so that
    no produce begun against the old broker is taken by the new one.

    Parameters
    ----------
    state
        The stack's state directory (the broker's handle and log).
    address
        The dead broker's ``host:port``.
    dead_since
        When the dead broker was seen dead, on the ``time.monotonic()`` clock.
    timeout
        Seconds to wait for the new broker to answer.
    note
        Says what it waited.
    """
    wait = dead_since + NEW_BROKER_AFTER_S - time.monotonic()
    if wait > 0:
        note(f"waiting {wait:.1f} s before the new broker: clients' produce requests begun against the dead one are "
             f"given up by then ({NEW_BROKER_AFTER_S:g} s after it was seen dead)")
        time.sleep(wait)
    try:
        return services.start_broker(state, port=_port(address), timeout=timeout)
    except PortInUseError:
        return services.start_broker(state, timeout=timeout)


def repair(state: Path, stack: dict[str, Any], *, note: Callable[[str], None], timeout: float,
           by_supervisor: bool = False) -> dict[str, Any]:
    """Repair the degraded stack ``stack`` of ``state`` (the caller holds the lock); return what was done.

    ``by_supervisor``: the supervisor repairs a dead broker or redis itself (it is neither stopped nor
    started again)."""
    t0 = time.monotonic()

    def took() -> str:
        return f"[{time.monotonic() - t0:.1f} s]"

    names: list[str] = list(stack.get("processes", []))
    sup_pid = None if by_supervisor else stop_supervisor(state)
    if sup_pid is not None:
        note(f"supervisor pid {sup_pid} stopped while repairing (a new one starts at the end)")
    handles = {h.name: h for h in recorded_handles(state, stack)}  # after the supervisor: it may have restarted some
    running = running_processes(list(handles.values()))
    dead = [n for n in names if n not in running]
    note(f"repairing the stack in {state}: {', '.join(dead) or 'only the supervisor'} not running"
         + (f"; still running: {', '.join(f'{n} pid {p}' for n, p in running.items())}" if running else ""))
    settings = stack_settings(stack)
    external = stack.get("external") or {}
    restart = [n for n in dead if supervised(n)]
    done: dict[str, Any] = {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "dead": dead, "restarted": {},
                            "new_broker": False, "by": "supervisor" if by_supervisor else "privrec up"}

    def stop_clients(why: str, *, web: bool = True, grace: float = 10) -> None:
        which = [n for n in names if supervised(n) and (web or n != WEB)]
        live = [h for h in (handles[n] for n in which if n in running) if services.stop(h, grace_seconds=grace)]
        if live:
            note(f"stopped {', '.join(f'{h.name} (pid {h.pid})' for h in live)}: {why}")
        restart[:] = sorted(set(restart) | set(which), key=names.index)

    if REDIS in dead and not external.get("redis"):
        assert settings.redis_url is not None
        try:
            rds = services.start_redis(state, port=_port(settings.redis_url), timeout=timeout)
        except PortInUseError:
            rds = services.start_redis(state, timeout=timeout)
            stop_clients("redis came back on another port")
        settings = settings.replace(redis_url=rds.url)
        done["restarted"][REDIS] = rds.pid
        note(f"redis    {rds.url}  pid {rds.pid}  (again, from the AOF in {state / REDIS}) {took()}")
    if KAFKA in dead and not external.get("kafka"):
        assert settings.kafka is not None
        # the web server stays: its clients reconnect to the same address, and its outbox keeps the feedback
        # (3 s: a worker whose broker died may not get to its exit; it commits atomically, so a kill is safe)
        stop_clients("the broker is memory-only: they read the old broker's log", web=False, grace=3)
        kafka = start_new_broker(state, settings.kafka, dead_since=t0, timeout=timeout, note=note)
        settings = settings.replace(kafka=kafka.address)
        done["restarted"][KAFKA] = kafka.pid
        done["new_broker"] = True
        note(f"kafka    {kafka.address}  pid {kafka.pid}  (a NEW embedded Tansu broker, memory-only: its log "
             f"starts at offset 0; events the old one held and no worker had counted are lost) {took()}")
        create_stack_topics(settings, note)
    stack.update(kafka=settings.kafka, redis=settings.redis_url, settings=settings_dict(settings))
    assert settings.redis_url is not None
    client = redis.Redis.from_url(admin_redis_url(stack), socket_timeout=10)  # redis-users.json: the administrator
    try:
        if done["new_broker"]:
            before = stack.pop("offsets_reset", None)
            reset_after_new_broker(client, settings, stack, note)
            if "offsets_reset" not in stack:
                note(f"namespace {settings.namespace!r}: no stored ingest offsets to reset for the new broker")
                if before is not None:
                    stack["offsets_reset"] = before
            done["offsets_reset"] = True
        workers = [n for n in restart if n.startswith("worker-")]
        if workers:
            client.hdel(worker_status_key(settings.namespace), *workers)
        new: dict[str, ServiceHandle] = {}
        for name in restart:
            old = handles.get(name) or fallback_handle(state, stack, name)
            new[name] = relaunch(state, stack, old, timeout=timeout)
            done["restarted"][name] = new[name].pid
        all_workers = [new.get(n) or handles[n] for n in names if n.startswith("worker-")]
        if workers:
            assigned = wait_workers(client, settings.namespace, all_workers, settings.partitions, timeout)
            for n in workers:
                was = f" (was {handles[n].pid})" if n in handles else ""
                note(f"{n:<8} pid {new[n].pid}{was}  partitions {assigned[n]} {took()}")
        if "web" in new:
            was = f" (was {handles['web'].pid})" if "web" in handles else ""
            note(f"web      {new['web'].url}/  pid {new['web'].pid}{was} {took()}")
    finally:
        client.close()
    policy = stack.get("supervisor")
    if policy and not by_supervisor:
        sup = start_supervisor(state, {**SUPERVISION_DEFAULTS, **policy}, timeout=timeout)
        done["supervisor"] = sup.pid
        note(f"supervisor pid {sup.pid}  restarts crashed workers and web {took()}")
    done["seconds"] = round(time.monotonic() - t0, 1)
    stack.setdefault("repairs", []).append(done)
    write_stack(state, stack)
    assert read_stack(state) is not None
    return done
