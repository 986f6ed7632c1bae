"""The embedded ``redis-server``: append-only persistence in the state directory, loopback only."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import redis

from .process import LOOPBACK, ServiceError, ServiceHandle, start_on_free_port, start_process

__all__ = ["redis_ready", "start_redis"]


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
    timeout: float = 30.0,
) -> ServiceHandle:
    """Start ``redis-server`` with append-only persistence and wait until it answers PING.

    Data lives in ``state_dir/<name>/``; starting again on the same ``state_dir`` loads it
    back. RDB snapshots are off (``--save ""``): the AOF (``appendfsync everysec``) is the
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

    def start(p: int) -> ServiceHandle:
        argv = [
            server,
            "--port", str(p),
            "--bind", host,
            "--dir", str(data_dir.resolve()),
            "--appendonly", "yes" if appendonly else "no",
            "--save", "",
            "--daemonize", "no",
            "--logfile", "",  # log to stdout, which start_process sends to <name>.log
        ]  # fmt: skip
        url = f"redis://{host}:{p}/0"
        return start_process(
            name,
            argv,
            state_dir,
            address=f"{host}:{p}",
            url=url,
            ready=lambda: redis_ready(url),
            timeout=timeout,
        )

    return start_on_free_port(start, port, host)
