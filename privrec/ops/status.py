"""``privrec status``: what runs where, read from ``stack.json``, the PID handles and Redis."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis

from pipeline import services

from .relaunch import SUPERVISOR, read_report, supervisor_handle
from .stackfile import STACK_FILE, admin_redis_url, http_probe, read_stack, recorded_handles, running_processes, worker_status_key

__all__ = ["status"]

def status(state_dir: str | os.PathLike[str], *, probe: bool = True) -> dict[str, Any]:
    """What runs where in ``state_dir``, as a JSON-ready dict.

    Keys ``kafka`` (``host:port``), ``redis`` (``redis://…``), ``http`` (``http://host:port``)
    and ``processes`` (``{name: pid}`` of the processes that run) are a contract; the others
    are informational: ``running`` (every recorded process runs, and the supervisor if the stack
    has one), ``stopped`` (recorded processes that do not run), ``external``, ``namespace``,
    ``settings``, ``phase``; with a supervisor ``supervisor`` (``{"pid", "running", "policy",
    "log", "last"}``; not one of ``processes``), ``restarts`` (``{name: count}`` of its restarts)
    and ``given_up`` (``{name: why}``: processes it no longer restarts); after a repair by ``up``
    ``repairs``; and with ``probe`` the live view: ``model_version``, ``released_events``,
    ``workers`` (their Redis reports), ``outbox`` (events the web accepted that no worker has counted yet:
    :mod:`pipeline.serve.outbox`) and ``health`` (the ``/healthz`` answer).
    """
    state = Path(state_dir).resolve()
    stack = read_stack(state)
    out: dict[str, Any] = {"state_dir": str(state), "running": False, "kafka": None, "redis": None,
                           "http": None, "processes": {}, "stopped": {}}
    if stack is None:
        out["error"] = f"no stack recorded in {state} ({STACK_FILE} missing)"
        return out
    handles = recorded_handles(state, stack)
    running = running_processes(handles)
    out.update(kafka=stack.get("kafka"), redis=stack.get("redis"), http=stack.get("http"),
               page=(stack["http"] + "/") if stack.get("http") else None,
               processes=running, stopped={h.name: h.pid for h in handles if h.name not in running},
               running=bool(running) and len(running) == len(stack.get("processes", [])),
               phase=stack.get("phase"), external=stack.get("external"), namespace=stack.get("namespace"),
               started_at=stack.get("started_at"), settings=stack.get("settings"),
               logs={h.name: str(h.log_path) for h in handles})
    if stack.get("offsets_reset"):
        out["offsets_reset"] = stack["offsets_reset"]
    if stack.get("supervisor"):
        out.update(_supervision(state, stack))
        if not out["supervisor"]["running"]:
            out["running"] = False  # degraded: `privrec up` starts a new one
    if stack.get("repairs"):
        out["repairs"] = stack["repairs"]
    missing = [n for n in stack.get("processes", []) if n not in running and n not in out["stopped"]]
    out["stopped"].update(dict.fromkeys(missing))
    if probe and running:
        out.update(_probe_redis(stack))
        if stack.get("http"):
            answer = http_probe(stack["http"] + "/healthz")
            out["health"] = None if answer is None else {"http_status": answer[0], **answer[1]}
    return out


def _supervision(state: Path, stack: Mapping[str, Any]) -> dict[str, Any]:
    """The supervisor's process and report: ``supervisor``, ``restarts`` and ``given_up``."""
    h = supervisor_handle(state)
    running = h is not None and services.is_running(h)
    report = read_report(state)  # a dead supervisor's last report still tells what it did
    restarts: dict[str, int] = dict(report.get("restarts") or {})
    given_up: dict[str, str] = dict(report.get("given_up") or {})
    return {"supervisor": {"pid": h.pid if h else None, "running": running, "policy": stack.get("supervisor"),
                           "log": str(h.log_path) if h else str(state / f"{SUPERVISOR}.log"),
                           "last": report.get("last") or {}},
            "restarts": restarts, "given_up": given_up}


def _probe_redis(stack: Mapping[str, Any]) -> dict[str, Any]:
    from pipeline.config.keys import PublicKeys
    from pipeline.serve.outbox import OutboxKeys

    ns = stack["namespace"]
    keys = PublicKeys(ns)
    client = redis.Redis.from_url(admin_redis_url(stack), socket_timeout=2, socket_connect_timeout=2)
    try:
        with client.pipeline(transaction=False) as pipe:
            pipe.hget(keys.model_meta, "version")
            pipe.hget(keys.released, "version")
            pipe.hget(keys.released, "count")
            pipe.hget(keys.release_figures, "count")  # the exact figure under the add/remove relation
            pipe.hgetall(worker_status_key(ns))
            pipe.xlen(OutboxKeys(ns).stream)
            model_version, released_version, released_events, exact_events, reports, outbox = pipe.execute()
            released_events = exact_events if exact_events is not None else released_events
    except redis.RedisError as exc:
        client.close()
        return {"redis_error": f"{type(exc).__name__}: {exc}"}
    settings = stack.get("settings") or {}
    if settings.get("mode") == "federated":  # each site reports in its own namespace
        try:
            for i in range(int(settings.get("sites", 1))):
                reports.update(client.hgetall(worker_status_key(f"{ns}-site{i}")))
        except redis.RedisError:
            pass
    client.close()
    now_ms = time.time() * 1000
    workers = {}
    for name, raw in sorted(reports.items()):
        report = json.loads(raw)
        report["age_s"] = round((now_ms - report.get("at_ms", 0)) / 1000, 1)
        workers[name.decode()] = report
    return {"model_version": None if model_version is None else int(model_version),
            "released_version": None if released_version is None else int(released_version),
            "released_events": None if released_events is None else int(released_events),
            "outbox": int(outbox),
            "workers": workers}
