"""``privrec up``: check everything, start the broker, Redis, topics, workers and web, wait until ready."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from kafka.errors import KafkaError

from pipeline import services
from pipeline.services import ServiceError, ServiceHandle
from pipeline.config.settings import Settings

from . import redis_users
from .relaunch import SUPERVISION_DEFAULTS, SUPERVISOR_FILE, start_supervisor, supervisor_handle
from .repair import check_same_settings, repair
from .stackfile import (KAFKA, REDIS, STACK_FILE, STACK_SCHEMA, WEB, AlreadyRunningError, OpsError, child_env, http_probe, locked, read_stack, recorded_handles,
                        running_processes, settings_dict, stack_tokens, TOKENS_FILE, worker_status_key, write_stack)
from .esa import forget_shuffler, role_env, start_shuffler, uses_shuffler
from .status import status
from .workers import check_namespace, create_stack_topics, reset_after_new_broker, wait_workers

__all__ = ["up", "wait_workers"]

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
                WEB, [sys.executable, "-m", "pipeline.apps.web", "--host", host, "--port", str(p)], state_dir,
                address=f"{probe_host}:{p}", url=url, env=env, timeout=timeout,
                ready=lambda: http_probe(f"{url}/healthz") is not None)
        except services.PortInUseError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _start_workers(settings: Settings, state: Path, *, catalog: Any, external: dict[str, bool], stack: dict[str, Any],
                   workers: int, record: Callable[[str], None], started: list[ServiceHandle],
                   note: Callable[[str], None], took: Callable[[], str], loglevel: str | None,
                   timeout: float, urls: dict[str, str]) -> dict[str, str]:
    """Global mode: check the namespace, reset offsets after a new broker, start the workers; the web's env.

    ``urls``: each role's Redis URL (:func:`privrec.ops.redis_users.enable`): the workers connect as ``worker``,
    the web as ``web``, this function as ``admin``.
    """
    assert settings.redis_url is not None
    client = redis.Redis.from_url(urls["admin"], socket_timeout=10)
    try:
        check_namespace(client, settings, catalog.fingerprint)
        if not external["kafka"]:
            reset_after_new_broker(client, settings, stack, note)
        if uses_shuffler(settings):  # the shuffler first: the workers need the analyzer's key, the web its URL
            start_shuffler(settings, state, urls=urls, record=record, started=started, note=note, took=took,
                           loglevel=loglevel, timeout=timeout)
        else:
            forget_shuffler(state)
        env = child_env(settings.replace(redis_url=urls.get("worker", settings.redis_url)), state, loglevel=loglevel)
        env.update(role_env(state, "worker-0"))
        wk: list[ServiceHandle] = []
        names = [f"worker-{i}" for i in range(workers)]
        client.hdel(worker_status_key(settings.namespace), *names)
        for name in names:
            record(name)
            h = services.start_process(name, [sys.executable, "-m", "pipeline.apps.worker"], state,
                                       env={**env, "PRIVREC_WORKER_ID": name}, timeout=timeout)
            started.append(h)
            wk.append(h)
        assigned = wait_workers(client, settings.namespace, wk, settings.partitions, timeout)
        for h in wk:
            note(f"{h.name:<8} pid {h.pid}  partitions {assigned[h.name]} {took()}")
    finally:
        client.close()
    return {**child_env(settings.replace(redis_url=urls.get("web", settings.redis_url)), state, loglevel=loglevel),
            **role_env(state, WEB)}


#: Local mode's default makes the codebook the catalog itself (the item term) up to this many items: a device then
#: seals about ``p (K + 1) + 1`` messages per report (docs/local-protocol.md; at the default batch of 150 users,
#: cap 2: ~290 at K = 2,000 and ~580 at K = 4,096 at epsilon 2, ~950 and ~1,950 at epsilon 1, where a batch
#: holds 225 users). Above it, 64 k-means codewords carry the listens and the item level is lost: on a held-out
#: tagged catalog of 2,000 items (seed 1) the twin earned 0.96 / 0.96 / 1.79x random play at epsilon 1 / 2 / 4
#: with 64 codewords and 3.62 / 4.53 / 5.34x with the catalog as the codebook (docs/experiments.md).
MAX_CATALOG_CODEBOOK = 4096


def catalog_is_codebook(n_items: int) -> bool:
    """Whether local mode's default makes a catalog of ``n_items`` items its own codebook (:data:`MAX_CATALOG_CODEBOOK`;
    else 64 k-means codewords, and no item's count is estimated)."""
    return n_items <= MAX_CATALOG_CODEBOOK


def up(settings: Settings, state_dir: str | os.PathLike[str], *, workers: int = 1, http_port: int = 0,
       http_host: str = services.LOOPBACK, loglevel: str | None = None, timeout: float = 120.0,
       say: Callable[[str], None] | None = None, supervise: bool | dict[str, float] = True, no_acl: bool = False,
       redis_admin_url: str | None = None) -> dict[str, Any]:
    """Start a stack in ``state_dir`` and wait until it is ready; return :func:`status`.

    Parameters
    ----------
    settings
        Pipeline settings (already validated by :class:`~pipeline.config.settings.Settings`).
        ``settings.kafka`` / ``settings.redis_url`` name external services, which are then
        used and not started.
    state_dir
        Directory for ``stack.json``, ``tokens.json`` (the web server's token secret and operator token, 0600;
        kept across restarts, ``PRIVREC_TOKEN_SECRET`` / ``PRIVREC_OPERATOR_TOKEN`` override them), PID files,
        logs and redis data; created if missing.
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
    supervise
        Start the supervisor (:mod:`privrec.ops.supervise`), which restarts a crashed worker or web
        server; a dict overrides its policy (``max_restarts``, ``window_s``, ``backoff_s``,
        ``max_backoff_s``, ``poll_s``; defaults ``SUPERVISION_DEFAULTS``). Not in federated mode.
    no_acl
        Run without Redis ACL users (:mod:`privrec.ops.redis_users`): every process connects as ``redis_url``'s
        user and serving could read trusted state (``/budget`` says so). By default each process class has
        its own user with only the keys and commands it needs.
    redis_admin_url
        External Redis: an administrator's URL, used only to create the stack's users (not stored).
        Without it the users must exist (``privrec up`` prints the ``ACL SETUSER`` lines otherwise).

    Returns
    -------
    dict
        :func:`status` of the started stack. On a *degraded* stack (some of its processes died while
        others run) nothing new is started: the dead processes are started again with the settings
        ``stack.json`` recorded (:func:`privrec.ops.repair.repair`), and the status has ``repaired``.

    Raises
    ------
    OpsError
        Before anything starts: a bad ``workers`` count, a catalog that cannot be loaded, a
        stack already running in ``state_dir`` (:class:`AlreadyRunningError`). After: a
        service or process that fails or is not ready in time, external services that do
        not answer, a topic with another partition count, a namespace created with other
        model settings. Whatever this call started is stopped before it raises. A degraded stack
        asked to be repaired with other settings, or a federated one (not repaired).
    """
    note = say or (lambda _line: None)
    state = Path(state_dir).resolve()
    if not 1 <= workers <= settings.partitions:
        raise OpsError(f"`--workers` must be between 1 and the partition count ({settings.partitions}, "
                       f"setting `partitions`), got {workers}.")
    if not 0 <= http_port < 65536:
        raise OpsError(f"`--http-port` must be a port number (0 = a free one), got {http_port}.")
    if state.exists() and not state.is_dir():
        raise OpsError(f"state directory {state} exists and is not a directory")
    if http_port and not (state / STACK_FILE).exists() and not _port_free(http_host, http_port):
        raise OpsError(f"`--http-port` {http_port} is already in use on {http_host}; pick another port, "
                       f"or 0 for a free one.")  # with a stack recorded: checked below, unless it is repaired
    from pipeline.data.catalog import load_catalog
    from pipeline.config.settings import SettingsError

    try:  # a bad data directory or catalog setting fails here, before anything starts
        catalog = load_catalog(settings)
    except SettingsError:  # e.g. `default_pool` names an arm the catalog lacks: exit 2, as for any setting
        raise
    except (OSError, ValueError) as exc:
        raise OpsError(f"cannot load the {settings.catalog!r} catalog (setting `catalog`): {exc}") from exc
    if settings.mode == "local" and getattr(settings, "local_defaulted", False) \
            and catalog_is_codebook(len(catalog.feature_matrix)):
        # local mode's default on a catalog small enough: the codebook is the catalog itself, so the messages' histogram
        # is also the item term (docs/local-protocol.md); every process gets these values (child_env spells them out)
        settings = settings.replace(local_codewords=len(catalog.feature_matrix), local_item_term=1)
        note(f"  local    the catalog's {settings.local_codewords} items are the codebook (the item term)")
    if settings.mode == "local" and settings.local_item_term:  # the codebook is the catalog: one codeword per item
        from pipeline.modes.local.local_http import catalog_codebook

        catalog_codebook(catalog, settings.local_codewords, True)  # SettingsError naming local_codewords
    if settings.mode == "local" and settings.shuffle_batch and settings.local_codewords:
        if settings.shuffle_batch > len(catalog.users):  # population-wide batches: distinct users of every unit
            raise OpsError(f"`shuffle_batch` {settings.shuffle_batch} exceeds the {len(catalog.users)} users of the "
                           f"{settings.catalog!r} catalog: a population-wide batch holds distinct users, so none "
                           f"could ever close (a population this small has no one to hide among: "
                           f"--local-algorithm tree keeps each user's reports on their device's own tree)")
        n_items = len(catalog.feature_matrix)
        if not settings.local_item_term and settings.local_codewords > n_items:
            raise SettingsError("local_codewords", f"{settings.local_codewords} codewords of a catalog of {n_items} "
                                                   f"items: at most {n_items} (each codeword is a k-means centroid of "
                                                   f"the items' contexts)")
    elif settings.mode == "local" and settings.shuffle_batch:
        from collections import Counter

        per_unit = Counter(catalog.unit_of(u) for u in catalog.users)
        if settings.shuffle_batch > max(per_unit.values()):
            raise OpsError(f"`shuffle_batch` {settings.shuffle_batch} exceeds the most users any model unit has "
                           f"({max(per_unit.values())} in the {settings.catalog!r} catalog): a batch holds distinct "
                           f"users of one unit, so none could ever close (with one user per unit there is no one to "
                           f"hide among; use a catalog whose units pool users, e.g. --catalog lastfm)")

    with locked(state, "`privrec up`"):
        previous = read_stack(state)
        old = recorded_handles(state, previous)
        alive = running_processes(old)
        keeper = supervisor_handle(state)
        if alive and previous is not None:
            dead = [n for n in previous.get("processes", []) if n not in alive]
            keeper_dead = bool(previous.get("supervisor")) and not (keeper and services.is_running(keeper))
            if (not dead and not keeper_dead) or previous.get("phase") != "running" \
                    or (previous.get("settings") or {}).get("mode") == "federated":
                raise AlreadyRunningError(state, alive)  # nothing to repair (or not repairable: down, then up)
            check_same_settings(state, previous, settings, workers)
            try:
                done = repair(state, previous, note=note, timeout=timeout)
            except ServiceError as exc:
                raise OpsError(f"repair failed: {exc}") from exc
            except (OSError, redis.RedisError, KafkaError) as exc:
                if isinstance(exc, OpsError):
                    raise
                raise OpsError(f"repair failed: {type(exc).__name__}: {exc}") from exc
            return {**status(state), "repaired": done}
        if http_port and not _port_free(http_host, http_port):
            raise OpsError(f"`--http-port` {http_port} is already in use on {http_host}; pick another port, "
                           f"or 0 for a free one.")
        for h in old + ([keeper] if keeper else []):  # a stack that died without `down` (crash, reboot)
            services.stop(h)
        (state / SUPERVISOR_FILE).unlink(missing_ok=True)  # a new stack: no restarts yet
        if previous is not None:
            note(f"previous stack in {state} was not running; cleaned up its files")
            (state / STACK_FILE).unlink(missing_ok=True)
        note(f"starting a stack in {state} (namespace {settings.namespace!r}, {workers} worker(s))")
        t0 = time.monotonic()

        def took() -> str:
            return f"[{time.monotonic() - t0:.1f} s]"

        external = {"kafka": settings.kafka is not None, "redis": settings.redis_url is not None}
        stack: dict[str, Any] = {
            "schema": STACK_SCHEMA, "state_dir": str(state), "namespace": settings.namespace,
            "external": external, "kafka": settings.kafka, "redis": settings.redis_url, "http": None,
            "workers": workers, "processes": [], "phase": "starting",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "up_pid": os.getpid(),
            "settings": settings_dict(settings), "loglevel": loglevel, "http_host": http_host,
        }
        started: list[ServiceHandle] = []

        def record(name: str) -> None:
            # recorded *before* the launch, so `down` finds a process even if up dies mid-start
            stack["processes"].append(name)
            write_stack(state, stack)

        try:
            write_stack(state, stack)
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
            plan = redis_users.prepare(settings, state, external=external["redis"], no_acl=no_acl)
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
            stack.update(kafka=settings.kafka, redis=settings.redis_url, settings=settings_dict(settings))
            write_stack(state, stack)
            assert settings.kafka is not None and settings.redis_url is not None
            urls = redis_users.enable(settings, plan, stack, external=external["redis"], admin_url=redis_admin_url,
                                      note=note)
            write_stack(state, stack)

            create_stack_topics(settings, note)

            if settings.mode == "federated":
                # one worker per site, a coordinator (star), Redis ACL users (privrec/ops/federated.py)
                from .federated import start_federated

                env = start_federated(settings, state, catalog=catalog, external=external, stack=stack,
                                      record=record, started=started, note=note, took=took, loglevel=loglevel,
                                      timeout=timeout, urls=urls)
            else:
                env = _start_workers(settings, state, catalog=catalog, external=external, stack=stack, workers=workers,
                                     record=record, started=started, note=note, took=took, loglevel=loglevel,
                                     timeout=timeout, urls=urls)

            record(WEB)
            # the user tokens' secret and the operator token, made once per stack (<state>/tokens.json, 0600):
            # the web server's environment alone gets them (pipeline.serve.auth)
            env = {**env, **stack_tokens(state).env()}
            web = _start_web(state, env, http_host, http_port, timeout)
            started.append(web)
            stack["http"] = web.url
            note(f"web      {web.url}/  pid {web.pid} {took()}")
            note(f"tokens   {state / TOKENS_FILE} (0600): per-user views need the user's token (`privrec token "
                 f"--user U`) or the operator's")
            if supervise and settings.mode != "federated":
                policy = {**SUPERVISION_DEFAULTS, **(supervise if isinstance(supervise, dict) else {})}
                stack["supervisor"] = policy
                sup = start_supervisor(state, policy, timeout=timeout)
                started.append(sup)
                note(f"supervisor pid {sup.pid}  restarts a crashed worker or web (at most "
                     f"{policy['max_restarts']:g} times in {policy['window_s']:g} s each) {took()}")
            stack["phase"] = "running"
            write_stack(state, stack)
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
