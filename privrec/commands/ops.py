"""``privrec up`` / ``status`` / ``down``: run a whole stack on this machine (see :mod:`privrec.ops`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

#: Exit codes of ``privrec status``.
STATUS_RUNNING, STATUS_NOTHING, STATUS_DEGRADED = 0, 1, 3


def _state_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                   help="where PID files, logs, redis data and stack.json live "
                        "(env PRIVREC_STATE_DIR; default .privrec in the current directory)")


def _http_port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {value!r}") from None
    if not 0 <= port < 65536:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535] (0 = a free port), got {port}")
    return port


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n


def register(sub: Any) -> None:
    from pipeline.config.settings import add_arguments

    u = sub.add_parser(
        "up", help="start broker, redis, workers and the HTTP server on loopback; wait until ready",
        description="Start a privrec stack on loopback, on free ports, with PID files under --state-dir: the "
                    "embedded Tansu broker (memory-only) and redis-server (AOF on) unless --kafka / --redis-url "
                    "(KAFKA_BOOTSTRAP / REDIS_URL) name external ones, the topics, --workers faust workers and "
                    "the HTTP server. Waits until every worker has partitions and /healthz answers, then prints "
                    "where everything runs. Settings come from the flags below, then PRIVREC_* variables, "
                    "then defaults; invalid settings fail before anything starts. Refuses to start a second "
                    "stack on the same state directory; on a degraded one (some of its processes died) it "
                    "starts again only the dead ones, with the settings the stack was started with.")
    _state_dir_arg(u)
    u.add_argument("--workers", type=_positive, default=1, help="faust workers (default 1; at most --partitions)")
    u.add_argument("--http-port", type=_http_port, default=None, metavar="PORT",
                   help="port of the HTTP server (env PRIVREC_HTTP_PORT; default 0 = a free port)")
    u.add_argument("--http-host", default=None, metavar="HOST",
                   help="bind address of the HTTP server (env PRIVREC_HTTP_HOST; default 127.0.0.1)")
    u.add_argument("--loglevel", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="log level of workers and web (env PRIVREC_LOGLEVEL; default INFO)")
    u.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each step (default 120)")
    u.add_argument("--no-supervise", dest="supervise", action="store_false",
                   help="start no supervisor (by default one restarts a crashed worker or web server, with "
                        "exponential backoff, at most 5 times in 60 s each)")
    u.add_argument("--json", action="store_true", help="print the status as JSON instead of text")
    u.add_argument("--no-acl", dest="no_acl", action="store_true",
                   help="run without Redis ACL users: every process connects as redis_url's user, so serving could "
                        "read trusted state (/budget says so); by default each process class has its own user")
    u.add_argument("--redis-admin-url", default=None, metavar="URL",
                   help="external Redis: an administrator's URL, used once to create the stack's users (not stored; "
                        "without it the users must exist, and up prints the ACL lines to apply)")
    from models.local.config import DEFAULT_VARIANT, VARIANTS

    u.add_argument("--local-variant", choices=list(VARIANTS), default=None, metavar="NAME",
                   help=f"local mode's protocol by name (models.local.config.VARIANTS): {', '.join(VARIANTS)}; sets "
                        f"the local settings it stands for, which explicit flags override (default: "
                        f"{DEFAULT_VARIANT}, the one that learns; docs/local-protocol.md)")
    settings_group = u.add_argument_group("pipeline settings (flags win over the environment)")
    add_arguments(settings_group)  # an argument group takes add_argument like a parser
    u.set_defaults(func=_up)

    s = sub.add_parser("status", help="show what runs where (--json for machines)",
                       description="Show the stack of --state-dir: processes and PIDs, addresses, settings, "
                                   "model version, released events, worker reports. Exit code 0 when every "
                                   "process runs, 3 when some have stopped, 1 when nothing runs.")
    _state_dir_arg(s)
    s.add_argument("--json", action="store_true",
                   help='print {"kafka", "redis", "http", "processes": {name: pid}, ...} as JSON')
    s.set_defaults(func=_status)

    d = sub.add_parser("down", help="stop exactly what `privrec up` started, in reverse order",
                       description="Stop the processes recorded in --state-dir/stack.json (web, workers, "
                                   "redis, broker: reverse start order), by PID, and remove their PID files. "
                                   "Redis data and logs stay. Stopping nothing is not an error.")
    _state_dir_arg(d)
    d.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                   help="seconds between SIGTERM and SIGKILL (default 10)")
    d.set_defaults(func=_down)


def _resolve_state_dir(args: argparse.Namespace) -> Path:
    from privrec.ops import default_state_dir

    return args.state_dir if args.state_dir is not None else default_state_dir()


def _err(command: str, message: str) -> int:
    print(f"privrec {command}: error: {message}", file=sys.stderr)
    return 1


def _settings_of_variant(flags: dict[str, Any]) -> Any:
    """The stack's settings from ``privrec up``'s flags, ``--local-variant NAME`` spelled out as the settings it stands
    for (explicit flags win). The default variant is left to the settings' own resolution (its batch grows to what
    the blanket can calibrate at the run's epsilon, and ``privrec up`` makes a small catalog its codebook), then
    checked: a run that cannot be the variant asked for is refused, naming ``local_variant``."""
    from models.local.config import VARIANTS, variant_of
    from pipeline.config.settings import Settings, SettingsError

    name = flags.pop("local_variant", None)
    variant = None if name is None else VARIANTS[name]
    if variant is not None and variant.research:
        flags = {**variant.settings, **{k: v for k, v in flags.items() if v is not None}}
    settings = Settings.from_mapping(flags)
    if variant is not None:
        if settings.mode != "local":
            raise SettingsError("local_variant", f"applies to local mode only (--mode local), got mode "
                                                 f"{settings.mode!r}.")
        got = variant_of(settings.local_config(settings.d))
        if got != variant.name:
            raise SettingsError("local_variant", f"{variant.name!r} cannot run with these settings: they make "
                                                 f"{got!r} (a synthetic world of fewer users than a batch, event "
                                                 f"level or epsilon = inf keep the per-user tree or plain reports).")
    return settings


def _up(args: argparse.Namespace) -> int:
    from pipeline.config.settings import Settings
    from privrec import ops

    settings = _settings_of_variant(vars(args))  # SettingsError (a ValueError): exit 2, nothing started
    port = args.http_port
    if port is None:
        port = _http_port(os.environ.get("PRIVREC_HTTP_PORT", "0"))
    host = args.http_host or os.environ.get("PRIVREC_HTTP_HOST") or "127.0.0.1"
    state_dir = _resolve_state_dir(args)
    say = None if args.json else (lambda line: print(f"  {line}", flush=True))
    try:
        info = ops.up(settings, state_dir, workers=args.workers, http_port=port, http_host=host,
                      loglevel=args.loglevel, timeout=args.timeout, say=say, supervise=args.supervise,
                      no_acl=args.no_acl, redis_admin_url=args.redis_admin_url)
    except ops.OpsError as exc:
        return _err("up", str(exc))
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        repaired = info.get("repaired")
        if repaired:
            what = ", ".join(f"{n} (pid {p})" for n, p in repaired["restarted"].items()) or "the supervisor"
            print(f"privrec up: repaired: started again {what}"
                  + ("; a new broker, ingest offsets reset" if repaired["new_broker"] else "")
                  + f". page: {info['page']}")
        else:
            print(f"privrec up: ready. page: {info['page']}")
        print(f"  status: privrec status --state-dir {state_dir}    stop: privrec down --state-dir {state_dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from privrec import ops

    try:
        info = ops.status(_resolve_state_dir(args))
    except ops.OpsError as exc:
        return _err("status", str(exc))
    code = STATUS_RUNNING if info["running"] else (STATUS_DEGRADED if info["processes"] else STATUS_NOTHING)
    if args.json:
        print(json.dumps(info, indent=2))
        return code
    if "error" in info:
        print(f"privrec status: nothing runs: {info['error']}")
        return code
    state = {STATUS_RUNNING: "running", STATUS_DEGRADED: "DEGRADED", STATUS_NOTHING: "stopped"}[code]
    print(f"privrec status: {state} — {info['state_dir']} (namespace {info['namespace']!r}, "
          f"started {info['started_at']})")
    ext = info.get("external") or {}
    where = {"kafka": f"{info['kafka']}{' (external)' if ext.get('kafka') else ''}",
             "redis": f"{info['redis']}{' (external)' if ext.get('redis') else ''}",
             "web": f"{info['http']}/" if info["http"] else ""}
    for name, pid in info["processes"].items():
        print(f"  {name:<9} pid {pid:<8} {where.get(name, '')}")
    for name, pid in info["stopped"].items():
        print(f"  {name:<9} NOT RUNNING (pid {pid}); log: {info['logs'].get(name, '-')}")
    sup = info.get("supervisor")
    if sup:
        restarts = ", ".join(f"{n} {c}" for n, c in info["restarts"].items()) or "none"
        if sup["running"]:
            print(f"  supervisor pid {sup['pid']:<8} restarts: {restarts}")
        else:
            print(f"  supervisor NOT RUNNING (pid {sup['pid']}); restarts: {restarts}; log: {sup['log']}; "
                  f"`privrec up` starts a new one")
        for name, why in info["given_up"].items():
            print(f"  {name:<9} GIVEN UP by the supervisor: {why}; `privrec up` starts it again")
    if info.get("repairs"):
        last = info["repairs"][-1]
        print(f"  last repair: {last.get('at')} by {last.get('by', 'privrec up')}, {', '.join(last['dead'])} dead, "
              f"restarted {', '.join(last['restarted']) or 'nothing'}"
              + (f" in {last['seconds']} s" if "seconds" in last else ""))
    for name in ("kafka", "redis"):
        if ext.get(name):
            print(f"  {name:<9} external     {where[name]}")
    if "model_version" in info:
        print(f"  model version {info['model_version']}, released version {info['released_version']}, "
              f"released events {info['released_events']}"
              + (f", {info['outbox']} accepted events not yet counted (outbox)" if info.get("outbox") else ""))
        for wid, rep in info.get("workers", {}).items():
            if "counted" in rep:
                print(f"  {wid}: counted {rep.get('counted')} events, partitions {rep.get('partitions')}, "
                      f"reported {rep.get('age_s')} s ago")
            else:  # a process without ingest (the federated coordinator)
                print(f"  {wid}: reported {rep.get('age_s')} s ago")
    if info.get("health"):
        print(f"  /healthz: {info['health'].get('status')} {info['health'].get('model_version', '')}".rstrip())
    if "redis_error" in info:
        print(f"  redis: {info['redis_error']}")
    return code


def _down(args: argparse.Namespace) -> int:
    from privrec import ops

    state_dir = _resolve_state_dir(args)
    try:
        stopped = ops.down(state_dir, grace_seconds=args.grace, say=lambda line: print(f"  {line}", flush=True))
    except ops.OpsError as exc:
        return _err("down", str(exc))
    if stopped:
        print(f"privrec down: stopped {', '.join(f'{n} (pid {p})' for n, p in stopped)} in {state_dir.resolve()}")
    else:
        print(f"privrec down: nothing was running in {state_dir.resolve()}")
    return 0
