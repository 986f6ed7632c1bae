"""The embedded ``redis-server``: append-only persistence in the state directory, loopback only."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import redis

from .process import LOOPBACK, ServiceError, ServiceHandle, free_port, start_on_free_port, start_process

__all__ = ["redis_ready", "start_redis", "start_redis_cluster"]


def redis_ready(url: str, timeout: float = 2.0) -> bool:
    """Whether redis at ``url`` answers PING (and has finished loading its data)."""
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except redis.exceptions.RedisError:  # includes BusyLoadingError while the AOF loads
        return False
    finally:
        client.close()


def start_redis(
    state_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    host: str = LOOPBACK,
    name: str = "redis",
    appendonly: bool = True,
    cluster: bool = False,
    timeout: float = 30.0,
) -> ServiceHandle:
    """Start ``redis-server`` with append-only persistence and wait until it answers PING.

    Data lives in ``state_dir/<name>/``; starting again on the same ``state_dir`` loads it
    back, and so are the ACL users of ``state_dir/<name>/users.acl`` when that file exists
    (:func:`pipeline.config.acl.write_aclfile`). RDB snapshots are off (``--save ""``): the AOF (``appendfsync everysec``) is the
    persistence, so at most about one second of writes is lost on a crash, none on a clean
    stop.

    Parameters
    ----------
    state_dir
        Directory for the PID, handle and log files and the data directory.
    port
        Port; ``None`` picks a free one (and retries if it is taken meanwhile).
    host
        Bind address.
    name
        Service name, unique within ``state_dir``; also the data directory's name.
    appendonly
        Turn the append-only file on (default) or off.
    cluster
        Start the node in cluster mode (its slots are assigned by :func:`start_redis_cluster`).
    timeout
        Seconds to wait for readiness (loading a large AOF counts).

    Returns
    -------
    ServiceHandle
        ``url`` is ``redis://host:port/0``.

    Raises
    ------
    ServiceError
        Also when ``redis-server`` is not installed (``apt-get install redis-server``).
    """
    server = shutil.which("redis-server")
    if server is None:
        raise ServiceError(
            "redis-server not found on PATH; install it (Debian: apt-get install redis-server, "
            "or run scripts/bootstrap.sh)"
        )
    data_dir = Path(state_dir) / name
    data_dir.mkdir(parents=True, exist_ok=True)

    from ..config.acl import ACL_FILE, PROBE_USER

    locked = (data_dir / ACL_FILE).exists()

    def start(p: int) -> ServiceHandle:
        argv = _redis_argv(server, p, host, data_dir, appendonly=appendonly, cluster=cluster,
                           aclfile=(data_dir / ACL_FILE).resolve() if locked else None)
        url = f"redis://{host}:{p}/0"
        # with an ACL file `default` has a password: probe as its PING-only user (which still sees LOADING)
        probe = f"redis://{PROBE_USER}:probe@{host}:{p}/0" if locked else url
        return start_process(
            name,
            argv,
            state_dir,
            address=f"{host}:{p}",
            url=url,
            ready=lambda: redis_ready(probe),
            timeout=timeout,
        )

    return start_on_free_port(start, port, host)


def _redis_argv(server: str, port: int, host: str, data_dir: Path, *, appendonly: bool, cluster: bool,
                aclfile: Path | None) -> list[str]:
    """``redis-server``'s command line (logs to stdout, which :func:`start_process` sends to ``<name>.log``)."""
    return [
        server,
        "--port", str(port),
        "--bind", host,
        "--dir", str(data_dir.resolve()),
        "--appendonly", "yes" if appendonly else "no",
        "--save", "",
        "--daemonize", "no",
        "--logfile", "",
        *(["--aclfile", str(aclfile)] if aclfile is not None else []),
        *(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000",
           "--cluster-port", str(free_port(host))]  # the bus port: explicit (default port + 10000 may be taken)
          if cluster else []),
    ]  # fmt: skip


def start_redis_cluster(state_dir: str | os.PathLike[str], *, nodes: int = 3, host: str = LOOPBACK,
                        timeout: float = 60.0) -> list[ServiceHandle]:
    """Start ``nodes`` cluster-mode ``redis-server`` masters and assign them the 16,384 slots.

    Each node keeps its AOF in ``state_dir/redis-node<i>/``. Returns the handles (stop each with
    :func:`~pipeline.services.stop`); ``handles[0].url`` is a seed URL for a cluster client.
    """
    import subprocess
    import time

    cli = shutil.which("redis-cli")
    if cli is None:
        raise ServiceError("redis-cli not found on PATH (Debian: apt-get install redis-tools)")
    handles: list[ServiceHandle] = []
    try:
        for i in range(nodes):
            handles.append(start_redis(state_dir, host=host, name=f"redis-node{i}", cluster=True, timeout=timeout))
        out = subprocess.run([cli, "--cluster", "create", *(h.address for h in handles), "--cluster-replicas", "0",
                              "--cluster-yes"], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise ServiceError(f"redis-cli --cluster create failed: {out.stdout[-500:]}{out.stderr[-500:]}")
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for h in handles:
                c = redis.Redis.from_url(h.url)
                try:
                    info = c.execute_command("CLUSTER", "INFO")
                    states.append(info.decode() if isinstance(info, bytes) else str(info))
                finally:
                    c.close()
            if all("cluster_state:ok" in st for st in states):
                return handles
            if time.monotonic() > deadline:
                raise ServiceError("the Redis cluster did not reach cluster_state:ok")
            time.sleep(0.2)
    except BaseException:
        from .process import stop

        for h in handles:
            stop(h)
        raise
