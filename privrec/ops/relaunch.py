"""Start one of a stack's processes again, exactly as ``privrec up`` started it (supervisor and repair).

A worker or the web server is started again from what the state directory recorded: its command line,
address and URL from its handle (``<name>.service.json``), its environment rebuilt from the settings in
``stack.json`` (:func:`~privrec.ops.stackfile.child_env`, as :mod:`privrec.ops.up` builds it). The web
server comes back on the same port, so ``stack.json``'s ``http`` stays true.

The supervisor's own files: ``supervisor.{pid,service.json,log}`` (a tracked process like the others, but
not one of ``stack.json``'s ``processes``: it is the stack's keeper, not part of the service) and
``supervisor.json`` (its report: restarts per process, the processes it gave up on; see
:mod:`privrec.ops.supervise`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline import services
from pipeline.services import ServiceHandle
from pipeline.config.settings import Settings

from .stackfile import WEB, child_env, http_probe, read_tokens

__all__ = ["SUPERVISOR", "SUPERVISOR_FILE", "SUPERVISION_DEFAULTS", "fallback_handle", "process_env", "read_report",
           "relaunch", "stack_settings", "start_supervisor", "stop_supervisor", "supervised", "supervisor_handle",
           "write_report"]

#: Name of the supervisor's tracked process (its PID, handle and log files).
SUPERVISOR = "supervisor"
#: The supervisor's report in the state directory.
SUPERVISOR_FILE = "supervisor.json"
#: Restart policy: at most ``max_restarts`` in ``window_s`` seconds (then the supervisor gives up on that
#: process), waiting ``backoff_s * 2**k`` before the (k+1)-th restart within the window, at most ``max_backoff_s``.
SUPERVISION_DEFAULTS: dict[str, float] = {"max_restarts": 5, "window_s": 60.0, "backoff_s": 0.5,
                                          "max_backoff_s": 30.0, "poll_s": 0.25}


def supervised(name: str) -> bool:
    """Whether the supervisor restarts the process ``name`` by itself: the workers and the web server.

    Not the broker and redis: a dead one is repaired as ``privrec up`` repairs it (a new memory-only broker needs
    the offsets reset and every client restarted; :mod:`privrec.ops.supervise`); not the federated sites and
    coordinator.
    """
    return name.startswith("worker-") or name in (WEB, "shuffler")


def stack_settings(stack: Mapping[str, Any]) -> Settings:
    """The settings ``stack.json`` recorded (``kafka`` and ``redis_url`` resolved), nothing from our environment."""
    return Settings.from_mapping(stack.get("settings") or {}, environ={})


def process_env(stack: Mapping[str, Any], state: Path, name: str) -> dict[str, str]:
    """The environment ``privrec up`` gave the worker or web server ``name`` (its own Redis user's URL)."""
    from .esa import role_env
    from .redis_users import role_of, role_redis_url

    settings = stack_settings(stack).replace(redis_url=role_redis_url(stack, role_of(name)))
    env = child_env(settings, state, loglevel=stack.get("loglevel"))
    env.update(role_env(state, name))  # local mode's separate shuffler: the worker's key, the web's public file
    tokens = read_tokens(state) if name == WEB else None
    if tokens is not None:  # the tokens privrec up gave the web server (privrec.ops.stackfile.stack_tokens)
        env.update(tokens.env())
    if name.startswith("worker-"):
        env["PRIVREC_WORKER_ID"] = name
    return env


def relaunch(state: Path, stack: Mapping[str, Any], handle: ServiceHandle, *, timeout: float = 60.0) -> ServiceHandle:
    """Start ``handle``'s process again (same command line, address and environment); return the new handle.

    A worker is returned once launched (its group join takes seconds; ``privrec status`` shows its
    report); the web server once it listens on its port and answers ``/healthz``.

    Raises
    ------
    ServiceError
        The process exited before it was ready, or was not ready in ``timeout`` seconds.
    """
    ready = None
    if handle.name in (WEB, "shuffler") and handle.url:
        url = handle.url

        def ready() -> bool:
            return http_probe(f"{url}/healthz") is not None

    return services.start_process(handle.name, handle.argv, state, address=handle.address, url=handle.url,
                                  env=process_env(stack, state, handle.name), ready=ready, timeout=timeout)


def read_report(state: Path) -> dict[str, Any]:
    """The supervisor's report (``{}`` when there is none or it is unreadable)."""
    try:
        data: dict[str, Any] = json.loads((state / SUPERVISOR_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data


def write_report(state: Path, report: Mapping[str, Any]) -> None:
    path = state / SUPERVISOR_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)


def start_supervisor(state: Path, policy: Mapping[str, float], *, timeout: float = 30.0) -> ServiceHandle:
    """Start ``python -m privrec.ops.supervise`` on ``state`` (its own session); ready once it has reported."""
    argv = [sys.executable, "-m", "privrec.ops.supervise", "--state-dir", str(state)]
    for key, value in policy.items():
        argv += [f"--{key.replace('_', '-')}", repr(value) if isinstance(value, float) else str(value)]
    env = {**os.environ, "PRIVREC_STATE_DIR": str(state)}

    def ready() -> bool:
        pid = (state / f"{SUPERVISOR}.pid").read_text().strip() if (state / f"{SUPERVISOR}.pid").exists() else ""
        return bool(pid) and str(read_report(state).get("pid")) == pid

    return services.start_process(SUPERVISOR, argv, state, env=env, ready=ready, timeout=timeout)


def supervisor_handle(state: Path) -> ServiceHandle | None:
    """The supervisor's recorded handle (running or not), ``None`` when none is recorded."""
    return services.read_handles(state).get(SUPERVISOR)


def stop_supervisor(state: Path, *, grace_seconds: float = 10.0) -> int | None:
    """Stop the stack's supervisor (it finishes a restart under way first); return its PID if it ran."""
    h = supervisor_handle(state)
    if h is None:
        return None
    return h.pid if services.stop(h, grace_seconds=grace_seconds) else None


def fallback_handle(state: Path, stack: Mapping[str, Any], name: str) -> ServiceHandle:
    """A handle to relaunch ``name`` from when its files are gone (a start that failed removes them)."""
    if name.startswith("worker-"):
        return ServiceHandle(name=name, pid=0, address="", url="", log_path=state / f"{name}.log",
                             argv=(sys.executable, "-m", "pipeline.apps.worker"), exe="", start_ticks=0)
    if name == WEB and stack.get("http"):
        url = str(stack["http"])
        address = url.split("://", 1)[1]
        host, _, port = address.rpartition(":")
        bind = str(stack.get("http_host") or host)
        return ServiceHandle(name=name, pid=0, address=address, url=url, log_path=state / f"{name}.log",
                             argv=(sys.executable, "-m", "pipeline.apps.web", "--host", bind, "--port", port), exe="",
                             start_ticks=0)
    raise ValueError(f"no way to start {name!r} again: its handle file is gone")
