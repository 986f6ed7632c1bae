"""Start, inspect and stop a whole privrec stack: ``privrec up`` / ``status`` / ``down``.

A *stack* is what :func:`up` starts under one state directory, on loopback, on free
ports, each process tracked by PID through :mod:`pipeline.services`:

1. ``kafka`` — the embedded Tansu broker (memory-only), unless ``settings.kafka`` names
   an external one (``KAFKA_BOOTSTRAP`` / ``--kafka``);
2. ``redis`` — ``redis-server`` with AOF on, unless ``settings.redis_url`` names an
   external one (``REDIS_URL`` / ``--redis-url``);
3. the topics (``interactions`` with ``settings.partitions`` partitions, ``dead-letters``,
   ``recommendations``), created if missing;
4. ``worker-0`` … ``worker-{N-1}`` — faust workers (``python -m pipeline.worker``);
5. ``web`` — the HTTP API and page (``python -m pipeline.web``).

Everything lands in the state directory::

    STATE_DIR/
      stack.json                       # what up started, where, with which settings
      kafka.{pid,service.json,log}     # one triple per process (pipeline.services)
      redis.{pid,service.json,log}  redis/   # redis data (the AOF survives down/up)
      worker-0.{pid,service.json,log}  faust/
      web.{pid,service.json,log}
      .lock                            # held while up or down runs

:func:`up` checks everything it can before it starts anything (settings, worker count,
the catalog, a second stack on the same directory), waits until each process is ready
(a worker has registered in Redis with partitions assigned; the HTTP server answers
``/healthz``, where 503 "starting" is fine before the first model), and stops what it
started if a later step fails. :func:`down` stops exactly the processes ``stack.json``
lists, in reverse start order. :func:`status` reads ``stack.json``, the PID handles and
the public/ops keys in Redis.

Examples
--------
>>> sorted(child_env(Settings(epsilon=float("inf")), Path("/s"), base={})
...        .items())[:3]  # doctest: +NORMALIZE_WHITESPACE
[('OPENBLAS_NUM_THREADS', '1'), ('PRIVREC_ALGORITHM', 'linucb'), ('PRIVREC_ALPHA', '0.3')]
>>> child_env(Settings(epsilon=float("inf")), Path("/s"), base={})["PRIVREC_EPSILON"]
'inf'
>>> worker_status_key("demo")
'demo:ops:{demo:ops}:workers'

Limitations: Linux only (process identity comes from ``/proc``, see
:mod:`pipeline.services`). PID 1 on the project's machines does not reap orphans, so
processes stopped by another process than the ``up`` that started them stay zombies
until the machine restarts; they hold no port or memory, and :func:`status` and
:func:`down` count them as stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
from kafka.errors import KafkaError

from pipeline import services
from pipeline.services import ServiceError, ServiceHandle
from pipeline.settings import Settings, env_name

__all__ = [
    "AlreadyRunningError",
    "OpsError",
    "STACK_FILE",
    "TOPIC_PARTITIONS",
    "child_env",
    "default_state_dir",
    "down",
    "read_stack",
    "status",
    "up",
    "wait_workers",
    "worker_status_key",
]

#: The stack description written by :func:`up` (and removed by :func:`down`).
STACK_FILE = "stack.json"
#: Partitions of the topics other than ``interactions`` (whose count is a setting).
TOPIC_PARTITIONS = {"dead-letters": 1, "recommendations": 1}
#: Names of the processes, in start order (workers are ``worker-<i>``).
KAFKA, REDIS, WEB = "kafka", "redis", "web"
_LOCK_FILE = ".lock"
_POLL_SECONDS = 0.1
_STACK_SCHEMA = 1


class OpsError(RuntimeError):
    """``up``, ``status`` or ``down`` could not do what was asked; the message says why."""


class AlreadyRunningError(OpsError):
    """``up`` was refused: a stack recorded in the state directory still runs."""

    def __init__(self, state_dir: Path, running: Mapping[str, int]) -> None:
        procs = ", ".join(f"{n} pid {p}" for n, p in running.items())
        super().__init__(
            f"a stack is already running in {state_dir} ({procs}); "
            f"see `privrec status --state-dir {state_dir}`, stop it with "
            f"`privrec down --state-dir {state_dir}`, or use another --state-dir")
        self.state_dir = state_dir
        self.running = dict(running)


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``PRIVREC_STATE_DIR``, else ``.privrec`` in the current directory."""
    env = os.environ if environ is None else environ
    return Path(env.get("PRIVREC_STATE_DIR") or ".privrec")


def worker_status_key(namespace: str) -> str:
    """Redis hash where each worker reports ``{"pid", "counted", "at_ms", "partitions"}``.

    Written by the ingest task (:mod:`pipeline.agents`) about once a second; the field is
    the worker id (``PRIVREC_WORKER_ID``).
    """
    return f"{namespace}:ops:{{{namespace}:ops}}:workers"


def _env_value(value: Any) -> str:
    # repr keeps floats exact (0.1 stays 0.1, inf stays inf) for the child's float().
    return repr(value) if isinstance(value, float) else str(value)


def child_env(settings: Settings, state_dir: Path, *, base: Mapping[str, str] | None = None,
              loglevel: str | None = None) -> dict[str, str]:
    """The environment of a worker or web process: ``base`` plus every setting spelled out.

    Every setting is written as its environment variable (``PRIVREC_*``, ``KAFKA_BOOTSTRAP``,
    ``REDIS_URL``), so the child rebuilds exactly ``settings`` whatever flags gave them;
    a setting that is ``None`` removes its variable.

    Parameters
    ----------
    settings
        The stack's settings, with ``kafka`` and ``redis_url`` resolved.
    state_dir
        Absolute state directory (``PRIVREC_STATE_DIR``: faust's data directory goes there).
    base
        Environment to extend; ``None`` is ours.
    loglevel
        ``PRIVREC_LOGLEVEL`` of the child, if given.
    """
    env = dict(os.environ if base is None else base)
    for f in dataclasses.fields(Settings):
        value = getattr(settings, f.name)
        if value is None:
            env.pop(env_name(f.name), None)
        else:
            env[env_name(f.name)] = _env_value(value)
    env["PRIVREC_STATE_DIR"] = str(state_dir)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if loglevel is not None:
        env["PRIVREC_LOGLEVEL"] = loglevel
    return env


# --- the stack file --------------------------------------------------------------------


def read_stack(state_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``stack.json`` of ``state_dir``, or ``None`` when there is none."""
    path = Path(state_dir) / STACK_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise OpsError(f"{path} is not valid JSON ({exc}); remove it if no stack runs") from None
    return data


def _write_stack(state_dir: Path, stack: Mapping[str, Any]) -> None:
    path = state_dir / STACK_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(stack, indent=2) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def _locked(state_dir: Path, what: str) -> Iterator[None]:
    """Hold the state directory's lock; refuse at once if another ``up``/``down`` holds it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    # Python opens files close-on-exec, so the services we spawn do not inherit the lock.
    with (state_dir / _LOCK_FILE).open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OpsError(f"another `privrec up` or `privrec down` is working on {state_dir}; "
                           f"wait for it, then retry {what}") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _recorded_handles(state_dir: Path, stack: Mapping[str, Any] | None) -> list[ServiceHandle]:
    """Handles of the processes ``stack.json`` lists, in start order (missing ones skipped)."""
    if not stack:
        return []
    handles = services.read_handles(state_dir)
    return [handles[n] for n in stack.get("processes", []) if n in handles]


def _running(handles: list[ServiceHandle]) -> dict[str, int]:
    return {h.name: h.pid for h in handles if services.is_running(h)}


# --- up --------------------------------------------------------------------------------


def _check_topic(address: str, topic: str, partitions: int) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=address, client_id="privrec-ops")
    try:
        (desc,) = admin.describe_topics([topic])
    finally:
        admin.close()
    found = len(desc.get("partitions") or [])
    if found != partitions:
        raise OpsError(
            f"topic {topic!r} on {address} has {found} partitions but setting `partitions` "
            f"(PRIVREC_PARTITIONS) is {partitions}; ingest offsets are kept per partition, so "
            f"they must agree: use --partitions {found} or another broker")


def _check_namespace(client: redis.Redis, settings: Settings, fingerprint: str) -> dict[str, Any] | None:
    """Refuse settings that differ from those the namespace was created with (read-only).

    The worker enforces the same rule when it starts (``TrustedStore.ensure_config``);
    checking here fails before any worker runs, with the same information.
    """
    from pipeline.trusted import TrustedKeys

    raw = client.get(TrustedKeys(settings.namespace).config)
    if raw is None:
        return None
    stored: dict[str, Any] = json.loads(raw)
    wanted = json.loads(json.dumps(settings.model_config() | {"catalog_fingerprint": fingerprint},
                                   sort_keys=True))
    if stored != wanted:
        diff = {k: {"stored": stored.get(k), "requested": wanted.get(k)}
                for k in sorted(set(stored) | set(wanted)) if stored.get(k) != wanted.get(k)}
        raise OpsError(
            f"namespace {settings.namespace!r} in {settings.redis_url} was created with other "
            f"model/privacy settings: {json.dumps(diff)}; start with the stored settings, "
            f"or use another --namespace")
    return stored


def _reset_offsets(client: redis.Redis, settings: Settings) -> tuple[int, list[int | None]]:
    """Forget the namespace's stored ingest offsets (see :meth:`pipeline.trusted.TrustedStore.reset_offsets`).

    Called only right after starting the embedded broker, which is memory-only.
    """
    from pipeline.trusted import TrustedStore

    return TrustedStore(client, settings.namespace).reset_offsets(settings.partitions)


def _http_probe(url: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]] | None:
    """``(status, json body)`` of ``GET url``; ``None`` if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            body = {}
        return exc.code, body
    except (OSError, ValueError):
        return None


def wait_workers(client: redis.Redis, namespace: str, workers: list[ServiceHandle], partitions: int,
                  timeout: float) -> dict[str, list[int]]:
    """Wait until every worker has registered and their partitions cover the topic exactly once."""
    key = worker_status_key(namespace)
    deadline = time.monotonic() + timeout
    while True:
        for h in workers:
            if not services.is_running(h):
                raise OpsError(f"{h.name} (pid {h.pid}) exited while starting; {h.log_path}:\n"
                               f"{services.tail(h.log_path)}")
        raw = client.hmget(key, [h.name for h in workers])
        assigned: dict[str, list[int]] = {}
        for h, value in zip(workers, raw):
            if value is None:
                continue
            report = json.loads(value)
            if report.get("pid") == h.pid and report.get("partitions"):
                assigned[h.name] = sorted(report["partitions"])
        owned = [p for ps in assigned.values() for p in ps]
        if len(assigned) == len(workers) and sorted(owned) == list(range(partitions)):
            return assigned
        if time.monotonic() > deadline:
            missing = [h.name for h in workers if h.name not in assigned]
            h = next((w for w in workers if w.name in missing), workers[0])
            raise OpsError(f"workers not ready after {timeout:g} s (registered with partitions: {assigned}; "
                           f"waiting for {missing or 'a rebalance to settle'}); {h.log_path}:\n"
                           f"{services.tail(h.log_path)}")
        time.sleep(_POLL_SECONDS)


def _port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound right now (checked before starting anything)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host or "0.0.0.0", port))
        except OSError:
            return False
    return True


def _start_web(state_dir: Path, env: dict[str, str], host: str, port: int, timeout: float) -> ServiceHandle:
    probe_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    attempts = 1 if port else 5
    for attempt in range(attempts):
        p = port or services.free_port(probe_host)
        url = f"http://{probe_host}:{p}"
        try:
            return services.start_process(
                WEB, [sys.executable, "-m", "pipeline.web", "--host", host, "--port", str(p)], state_dir,
                address=f"{probe_host}:{p}", url=url, env=env, timeout=timeout,
                ready=lambda: _http_probe(f"{url}/healthz") is not None)
        except services.PortInUseError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def up(settings: Settings, state_dir: str | os.PathLike[str], *, workers: int = 1, http_port: int = 0,
       http_host: str = services.LOOPBACK, loglevel: str | None = None, timeout: float = 120.0,
       say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Start a stack in ``state_dir`` and wait until it is ready; return :func:`status`.

    Parameters
    ----------
    settings
        Pipeline settings (already validated by :class:`~pipeline.settings.Settings`).
        ``settings.kafka`` / ``settings.redis_url`` name external services, which are then
        used and not started.
    state_dir
        Directory for ``stack.json``, PID files, logs and redis data; created if missing.
    workers
        Number of faust workers, between 1 and ``settings.partitions`` (a worker without a
        partition would never be ready).
    http_port
        Port of the HTTP server; ``0`` picks a free one.
    http_host
        Bind address of the HTTP server (loopback by default).
    loglevel
        ``PRIVREC_LOGLEVEL`` of workers and web (``None``: theirs, INFO).
    timeout
        Seconds to wait for each step to be ready.
    say
        Called with one line per step (progress); ``None`` is silent.

    Returns
    -------
    dict
        :func:`status` of the started stack.

    Raises
    ------
    OpsError
        Before anything starts: a bad ``workers`` count, a catalog that cannot be loaded, a
        stack already running in ``state_dir`` (:class:`AlreadyRunningError`). After: a
        service or process that fails or is not ready in time, external services that do
        not answer, a topic with another partition count, a namespace created with other
        model settings. Whatever this call started is stopped before it raises.
    """
    note = say or (lambda _line: None)
    state = Path(state_dir).resolve()
    if not 1 <= workers <= settings.partitions:
        raise OpsError(f"`--workers` must be between 1 and the partition count ({settings.partitions}, "
                       f"setting `partitions`), got {workers}.")
    if not 0 <= http_port < 65536:
        raise OpsError(f"`--http-port` must be a port number (0 = a free one), got {http_port}.")
    if http_port and not _port_free(http_host, http_port):
        raise OpsError(f"`--http-port` {http_port} is already in use on {http_host}; pick another port, "
                       f"or 0 for a free one.")
    if state.exists() and not state.is_dir():
        raise OpsError(f"state directory {state} exists and is not a directory")
    from pipeline.catalog import load_catalog
    from pipeline.settings import SettingsError

    try:  # a bad data directory or catalog setting fails here, before anything starts
        catalog = load_catalog(settings)
    except SettingsError:  # e.g. `default_pool` names an arm the catalog lacks: exit 2, as for any setting
        raise
    except (OSError, ValueError) as exc:
        raise OpsError(f"cannot load the {settings.catalog!r} catalog (setting `catalog`): {exc}") from exc

    with _locked(state, "`privrec up`"):
        previous = read_stack(state)
        old = _recorded_handles(state, previous)
        alive = _running(old)
        if alive:
            raise AlreadyRunningError(state, alive)
        for h in old:  # a stack that died without `down` (crash, reboot): forget its files
            services.stop(h)
        if previous is not None:
            note(f"previous stack in {state} was not running; cleaned up its files")
            (state / STACK_FILE).unlink(missing_ok=True)
        note(f"starting a stack in {state} (namespace {settings.namespace!r}, {workers} worker(s))")
        t0 = time.monotonic()

        def took() -> str:
            return f"[{time.monotonic() - t0:.1f} s]"

        external = {"kafka": settings.kafka is not None, "redis": settings.redis_url is not None}
        stack: dict[str, Any] = {
            "schema": _STACK_SCHEMA, "state_dir": str(state), "namespace": settings.namespace,
            "external": external, "kafka": settings.kafka, "redis": settings.redis_url, "http": None,
            "workers": workers, "processes": [], "phase": "starting",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "up_pid": os.getpid(),
            "settings": _settings_dict(settings),
        }
        started: list[ServiceHandle] = []

        def record(name: str) -> None:
            # recorded *before* the launch, so `down` finds a process even if up dies mid-start
            stack["processes"].append(name)
            _write_stack(state, stack)

        try:
            _write_stack(state, stack)
            if external["kafka"]:
                if not services.kafka_ready(settings.kafka or "", timeout=5.0):
                    raise OpsError(f"Kafka at {settings.kafka} (setting `kafka`, KAFKA_BOOTSTRAP / --kafka) does "
                                   f"not answer a metadata request")
                note(f"kafka    {settings.kafka} (external)")
            else:
                record(KAFKA)
                kafka = services.start_broker(state, timeout=timeout)
                started.append(kafka)
                settings = settings.replace(kafka=kafka.address)
                note(f"kafka    {kafka.address}  pid {kafka.pid}  (embedded Tansu, memory-only) {took()}")
            if external["redis"]:
                if not services.redis_ready(settings.redis_url or "", timeout=5.0):
                    raise OpsError(f"Redis at {settings.redis_url} (setting `redis_url`, REDIS_URL / --redis-url) "
                                   f"does not answer PING")
                note(f"redis    {settings.redis_url} (external)")
            else:
                record(REDIS)
                rds = services.start_redis(state, timeout=timeout)
                started.append(rds)
                settings = settings.replace(redis_url=rds.url)
                note(f"redis    {rds.url}  pid {rds.pid}  (AOF in {state / REDIS}) {took()}")
            stack.update(kafka=settings.kafka, redis=settings.redis_url, settings=_settings_dict(settings))
            _write_stack(state, stack)
            assert settings.kafka is not None and settings.redis_url is not None

            topics = {"interactions": settings.partitions, **TOPIC_PARTITIONS}
            created = services.create_topics(settings.kafka, topics)
            _check_topic(settings.kafka, "interactions", settings.partitions)
            listed = ", ".join(f"{t} ({n})" for t, n in topics.items())
            kept = [t for t in topics if t not in created]
            note(f"topics   {listed}" + (f"; already there: {', '.join(kept)}" if kept else ""))

            client = redis.Redis.from_url(settings.redis_url, socket_timeout=10)
            try:
                _check_namespace(client, settings, catalog.fingerprint)
                if not external["kafka"]:
                    counted, old_offsets = _reset_offsets(client, settings)
                    if any(o is not None for o in old_offsets):
                        stack["offsets_reset"] = {"previous": old_offsets, "events_kept": counted}
                        note(f"namespace {settings.namespace!r} keeps {counted} events counted by an earlier "
                             f"run; the new (memory-only) broker's log starts at offset 0, so the stored "
                             f"ingest offsets {old_offsets} were reset")
                env = child_env(settings, state, loglevel=loglevel)
                wk: list[ServiceHandle] = []
                names = [f"worker-{i}" for i in range(workers)]
                client.hdel(worker_status_key(settings.namespace), *names)
                for name in names:
                    record(name)
                    h = services.start_process(name, [sys.executable, "-m", "pipeline.worker"], state,
                                               env={**env, "PRIVREC_WORKER_ID": name}, timeout=timeout)
                    started.append(h)
                    wk.append(h)
                assigned = wait_workers(client, settings.namespace, wk, settings.partitions, timeout)
                for h in wk:
                    note(f"{h.name:<8} pid {h.pid}  partitions {assigned[h.name]} {took()}")
            finally:
                client.close()

            record(WEB)
            web = _start_web(state, env, http_host, http_port, timeout)
            started.append(web)
            stack["http"] = web.url
            note(f"web      {web.url}/  pid {web.pid} {took()}")
            stack["phase"] = "running"
            _write_stack(state, stack)
        except BaseException as exc:
            for h in reversed(started):
                with contextlib.suppress(Exception):
                    services.stop(h, grace_seconds=5)
            (state / STACK_FILE).unlink(missing_ok=True)
            if isinstance(exc, ServiceError):
                raise OpsError(str(exc)) from exc
            if isinstance(exc, (OSError, redis.RedisError, KafkaError)) and not isinstance(exc, OpsError):
                raise OpsError(f"{type(exc).__name__}: {exc}") from exc
            raise
    return status(state)


def _settings_dict(settings: Settings) -> dict[str, Any]:
    out = dataclasses.asdict(settings)
    # JSON has no inf: keep epsilon readable and exact as a string when it is not finite
    for k, v in out.items():
        if isinstance(v, float) and v in (float("inf"), float("-inf")):
            out[k] = repr(v)
    return out


# --- status ----------------------------------------------------------------------------


def status(state_dir: str | os.PathLike[str], *, probe: bool = True) -> dict[str, Any]:
    """What runs where in ``state_dir``, as a JSON-ready dict.

    Keys ``kafka`` (``host:port``), ``redis`` (``redis://…``), ``http`` (``http://host:port``)
    and ``processes`` (``{name: pid}`` of the processes that run) are a contract; the others
    are informational: ``running`` (every recorded process runs), ``stopped`` (recorded
    processes that do not run), ``external``, ``namespace``, ``settings``, ``phase``, and
    with ``probe`` the live view: ``model_version``, ``released_events``, ``workers``
    (their Redis reports) and ``health`` (the ``/healthz`` answer).
    """
    state = Path(state_dir).resolve()
    stack = read_stack(state)
    out: dict[str, Any] = {"state_dir": str(state), "running": False, "kafka": None, "redis": None,
                           "http": None, "processes": {}, "stopped": {}}
    if stack is None:
        out["error"] = f"no stack recorded in {state} ({STACK_FILE} missing)"
        return out
    handles = _recorded_handles(state, stack)
    running = _running(handles)
    out.update(kafka=stack.get("kafka"), redis=stack.get("redis"), http=stack.get("http"),
               page=(stack["http"] + "/") if stack.get("http") else None,
               processes=running, stopped={h.name: h.pid for h in handles if h.name not in running},
               running=bool(running) and len(running) == len(stack.get("processes", [])),
               phase=stack.get("phase"), external=stack.get("external"), namespace=stack.get("namespace"),
               started_at=stack.get("started_at"), settings=stack.get("settings"),
               logs={h.name: str(h.log_path) for h in handles})
    if stack.get("offsets_reset"):
        out["offsets_reset"] = stack["offsets_reset"]
    missing = [n for n in stack.get("processes", []) if n not in running and n not in out["stopped"]]
    out["stopped"].update(dict.fromkeys(missing))
    if probe and running:
        out.update(_probe_redis(stack))
        if stack.get("http"):
            answer = _http_probe(stack["http"] + "/healthz")
            out["health"] = None if answer is None else {"http_status": answer[0], **answer[1]}
    return out


def _probe_redis(stack: Mapping[str, Any]) -> dict[str, Any]:
    from pipeline.keys import PublicKeys

    ns = stack["namespace"]
    keys = PublicKeys(ns)
    client = redis.Redis.from_url(stack["redis"], socket_timeout=2, socket_connect_timeout=2)
    try:
        with client.pipeline(transaction=False) as pipe:
            pipe.hget(keys.model_meta, "version")
            pipe.hget(keys.released, "version")
            pipe.hget(keys.released, "count")
            pipe.hgetall(worker_status_key(ns))
            model_version, released_version, released_events, reports = pipe.execute()
    except redis.RedisError as exc:
        return {"redis_error": f"{type(exc).__name__}: {exc}"}
    finally:
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
            "workers": workers}


# --- down ------------------------------------------------------------------------------


def down(state_dir: str | os.PathLike[str], *, grace_seconds: float = 10.0) -> list[tuple[str, int]]:
    """Stop what ``up`` started in ``state_dir``, last started first; return ``(name, pid)`` stopped.

    Only processes ``stack.json`` lists are touched, each only if :mod:`pipeline.services`
    recognises it as the process it started (same executable and start time). Workers
    stop together (each takes about a second to leave its consumer groups); the web server
    stops before them and the broker and redis after them. ``stack.json`` and the PID
    files are removed; the redis data (``redis/``) and logs stay.
    """
    state = Path(state_dir).resolve()
    if not state.is_dir():
        return []
    with _locked(state, "`privrec down`"):
        stack = read_stack(state)
        handles = _recorded_handles(state, stack)
        stopped: list[tuple[str, int]] = []
        groups: list[list[ServiceHandle]] = []
        for h in reversed(handles):  # consecutive workers form one group, stopped in parallel
            if h.name.startswith("worker-") and groups and groups[-1][0].name.startswith("worker-"):
                groups[-1].append(h)
            else:
                groups.append([h])
        for group in groups:
            with ThreadPoolExecutor(max_workers=len(group)) as pool:
                results = list(pool.map(lambda h: services.stop(h, grace_seconds=grace_seconds), group))
            stopped += [(h.name, h.pid) for h, was in zip(group, results) if was]
        (state / STACK_FILE).unlink(missing_ok=True)
        return stopped
