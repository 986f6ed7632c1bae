"""Tracked child processes: start, probe, stop by PID, never anything we did not start.

``<name>.pid`` holds the bare PID, for any tool; ``<name>.service.json`` holds the whole
:class:`ServiceHandle`, so another process (``privrec status``, ``privrec down``) can find
and stop what this one started. :func:`start_process` is the generic launcher; the broker,
``redis-server`` and the faust workers all start through it.

A PID alone is not proof of ownership: PIDs are reused. :func:`stop` kills only a process
whose executable *and* kernel start time match what the handle recorded, so it never kills
anything this module did not start. (The executable, not the command line: redis-server
rewrites its command line to ``redis-server 127.0.0.1:PORT``.)

Examples
--------
>>> handle = ServiceHandle(name="redis", pid=1, address="127.0.0.1:6379",
...                        url="redis://127.0.0.1:6379/0", log_path=Path("redis.log"),
...                        argv=("redis-server",), exe="/usr/bin/redis-check-rdb",
...                        start_ticks=0)
>>> handle.host, handle.port
('127.0.0.1', 6379)

Limitations: process identity and socket ownership are read from ``/proc``, so this module
works on Linux only (the project's target).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "LOOPBACK",
    "PortInUseError",
    "ServiceError",
    "ServiceHandle",
    "free_port",
    "is_running",
    "read_handles",
    "start_on_free_port",
    "start_process",
    "stop",
    "stop_all",
    "tail",
]

LOOPBACK = "127.0.0.1"

#: Lines of a service's log quoted in a start-up error.
_TAIL_LINES = 30
#: Poll interval of the readiness and stop loops.
_POLL_SECONDS = 0.05
#: Start attempts on a picked port before giving up (another process may take it first).
_PORT_ATTEMPTS = 5
#: Tansu says "AddrInUse" / "Address in use", redis "Address already in use".
_ADDR_IN_USE = re.compile(r"AddrInUse|Address (already )?in use", re.IGNORECASE)
#: Suffix of handle files; distinct, so other JSON files may share the state directory.
_HANDLE_SUFFIX = ".service.json"
#: Kafka error code TOPIC_ALREADY_EXISTS.
_TOPIC_ALREADY_EXISTS = 36


class ServiceError(RuntimeError):
    """A service failed to start, or did not become ready in time.

    The message names the service, says what happened and quotes the tail of its log.
    """


class PortInUseError(ServiceError):
    """The service exited because its port was taken (a retry on another port may work)."""


@dataclass(frozen=True, slots=True)
class ServiceHandle:
    """What is needed to reach, identify and stop one started process.

    Attributes
    ----------
    name
        Service name, unique within a state directory (``"kafka"``, ``"redis"``,
        ``"worker-0"``); names the PID, handle and log files.
    pid
        Process id.
    address
        ``host:port`` the service listens on (``""`` for a process without a port).
    url
        How clients name the service: ``kafka://host:port`` for the broker (faust's
        ``broker=`` setting; kafka-python takes :attr:`address`),
        ``redis://host:port/0`` for redis.
    log_path
        File receiving the process's stdout and stderr.
    argv
        The command line it was started with.
    exe
        Resolved executable (``/proc/PID/exe``) at start.
    start_ticks
        Kernel start time of the process (field 22 of ``/proc/PID/stat``, clock ticks
        since boot); together with ``exe`` it tells our process from a reused PID.
    """

    name: str
    pid: int
    address: str
    url: str
    log_path: Path
    argv: tuple[str, ...]
    exe: str
    start_ticks: int

    @property
    def host(self) -> str:
        """Host part of :attr:`address`."""
        return self.address.rpartition(":")[0]

    @property
    def port(self) -> int:
        """Port part of :attr:`address`."""
        return int(self.address.rpartition(":")[2])

    def to_json(self) -> str:
        """Serialize for ``<name>.service.json``; inverse of :meth:`from_json`."""
        data = asdict(self)
        data["log_path"] = str(self.log_path)
        data["argv"] = list(self.argv)
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> ServiceHandle:
        """Rebuild a handle written by :meth:`to_json`."""
        data = json.loads(text)
        data["log_path"] = Path(data["log_path"])
        data["argv"] = tuple(data["argv"])
        return cls(**data)


# --- ports -----------------------------------------------------------------------------


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port that was free on ``host`` a moment ago.

    The kernel picks it (bind to port 0), so parallel callers rarely collide; a collision
    that does happen shows up as :class:`PortInUseError` at start, and the ``start_*``
    functions then retry on a new port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


# --- /proc helpers ---------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """Return ``(state, start_ticks)`` of ``pid``, or ``None`` if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after it don't.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our exited child, so it is not left a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def is_running(handle: ServiceHandle) -> bool:
    """Whether the process ``handle`` describes is alive and still the one we started.

    A zombie counts as stopped, and so does a live process whose executable or start time
    differs (the PID was reused).
    """
    _reap(handle.pid)
    stat = _proc_stat(handle.pid)
    if stat is None or stat[0] == "Z":
        return False
    return stat[1] == handle.start_ticks and _exe(handle.pid) == handle.exe


def _listening_ports(pid: int) -> set[int]:
    """TCP ports on which ``pid`` itself holds a listening socket.

    Readiness must not be fooled by another process that already listens on the port we
    picked: the probe would succeed against *that* process while ours fails to bind.
    """
    inodes: set[str] = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    except OSError:
        return set()
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A = TCP_LISTEN
                    ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


# --- files -----------------------------------------------------------------------------


def _pid_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.pid"


def _handle_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}{_HANDLE_SUFFIX}"


def _write_handle(state_dir: Path, handle: ServiceHandle) -> None:
    # Write-then-rename, so a concurrent reader never sees half a file.
    for path, text in (
        (_handle_path(state_dir, handle.name), handle.to_json()),
        (_pid_path(state_dir, handle.name), f"{handle.pid}\n"),
    ):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def _remove_handle(state_dir: Path, name: str) -> None:
    for path in (_pid_path(state_dir, name), _handle_path(state_dir, name)):
        path.unlink(missing_ok=True)


def tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """Return the last ``lines`` lines of a log file (``""`` if it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def read_handles(state_dir: str | os.PathLike[str]) -> dict[str, ServiceHandle]:
    """Return the recorded handles in ``state_dir`` by name, in start order.

    A handle is returned whether or not its process still runs; ask :func:`is_running`. A handle removed while
    they are read (a stop; the supervisor between a crashed process and its restart) is not returned.
    """
    state = Path(state_dir)
    handles: list[ServiceHandle] = []
    for path in sorted(state.glob(f"*{_HANDLE_SUFFIX}")):
        try:
            text = path.read_text()
        except FileNotFoundError:  # removed since the listing (a stop, or the supervisor replacing a crashed one)
            continue
        handles.append(ServiceHandle.from_json(text))
    handles.sort(key=lambda h: h.start_ticks)
    return {h.name: h for h in handles}


# --- start / stop ----------------------------------------------------------------------


def start_process(
    name: str,
    argv: Sequence[str],
    state_dir: str | os.PathLike[str],
    *,
    address: str = "",
    url: str = "",
    ready: Callable[[], bool] | None = None,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> ServiceHandle:
    """Launch ``argv`` as a tracked child process and wait until it is ready.

    The PID and handle files are written right after launch, so even a start that fails
    half-way can be cleaned up by :func:`stop_all`.

    Parameters
    ----------
    name
        Service name, unique within ``state_dir``.
    argv
        Command line; ``argv[0]`` must be an absolute path or on ``PATH``. The process
        inherits our working directory, so give it absolute paths.
    state_dir
        Directory for ``<name>.pid``, ``<name>.service.json`` and ``<name>.log``; created
        if missing.
    address
        ``host:port`` the process will listen on. When given, readiness also requires that
        the process itself (not another one) holds a listening socket on that port.
    url
        Client-facing name of the service, recorded in the handle.
    ready
        Probe called until it returns ``True``; ``None`` means "ready once launched and
        listening on ``address``".
    timeout
        Seconds to wait for readiness.
    env
        Environment of the process; ``None`` inherits ours.

    Returns
    -------
    ServiceHandle
        The started, ready process.

    Raises
    ------
    ServiceError
        If a live process is already recorded under ``name``, if the process exits before it
        is ready (:class:`PortInUseError` when its log says the port was taken), or on
        timeout. The process is stopped and its files removed before raising.
    """
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    _claim(state, name)
    log_path = state / f"{name}.log"
    argv = tuple(str(a) for a in argv)
    pid = _spawn(name, argv, log_path, env)
    stat = _proc_stat(pid)
    handle = ServiceHandle(name=name, pid=pid, address=address, url=url, log_path=log_path, argv=argv,
                           exe=_exe(pid) or "", start_ticks=stat[1] if stat else 0)
    _write_handle(state, handle)
    _await_ready(state, handle, ready, timeout)
    return handle


def _claim(state: Path, name: str) -> None:
    """Raise :class:`ServiceError` if a live process is recorded under ``name``; forget a dead one's files."""
    previous = read_handles(state).get(name)
    if previous is not None:
        if is_running(previous):
            raise ServiceError(
                f"{name} is already running (pid {previous.pid}, {previous.address}) "
                f"in {state}; stop it first"
            )
        _remove_handle(state, name)


def _spawn(name: str, argv: tuple[str, ...], log_path: Path, env: Mapping[str, str] | None) -> int:
    """Launch ``argv`` in a session of its own, its output appended to ``log_path``; its PID."""
    path = shutil.which(argv[0])
    if path is None:
        raise ServiceError(f"{name}: executable {argv[0]!r} not found")
    with log_path.open("ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} start {' '.join(argv)}\n".encode())
        log.flush()
        # posix_spawn rather than subprocess.Popen: the handle owns the process, and no Popen
        # object is left to warn or reap it behind our back. setsid: a Ctrl-C aimed at our
        # terminal must not reach a service that outlives us (``privrec up`` returns early).
        return os.posix_spawn(
            path,
            argv,
            dict(env) if env is not None else dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, log.fileno(), 2),
            ],
            setsid=True,
        )


def _await_ready(state: Path, handle: ServiceHandle, ready: Callable[[], bool] | None, timeout: float) -> None:
    """Poll until ``handle``'s process listens on its address and ``ready()`` holds; on an early exit or a
    timeout, stop it, remove its files and raise (:class:`PortInUseError` when its log says the port was taken)."""
    name, pid, address, log_path = handle.name, handle.pid, handle.address, handle.log_path
    port = int(address.rpartition(":")[2]) if address else None
    deadline = time.monotonic() + timeout
    while True:
        exited = _exit_status(pid)
        if exited is not None:
            _remove_handle(state, name)
            log_tail = tail(log_path)
            kind = PortInUseError if _ADDR_IN_USE.search(log_tail) else ServiceError
            raise kind(f"{name} exited ({exited}) before it was ready; {log_path}:\n{log_tail}")
        if (port is None or port in _listening_ports(pid)) and (ready is None or ready()):
            return
        if time.monotonic() > deadline:
            stop(handle)
            raise ServiceError(
                f"{name} (pid {pid}) was not ready at {address or 'start'} after {timeout:g} s; "
                f"{log_path}:\n{tail(log_path)}"
            )
        time.sleep(_POLL_SECONDS)


def _exit_status(pid: int) -> str | None:
    """Reap our child ``pid`` if it has exited and describe how; ``None`` while it runs."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # already reaped elsewhere
        return "exit status unknown"
    if done == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    return f"exit code {code}" if code >= 0 else f"killed by signal {-code}"


def stop(handle: ServiceHandle, *, grace_seconds: float = 10.0) -> bool:
    """Stop the process ``handle`` describes: SIGTERM, then SIGKILL after ``grace_seconds``.

    Only a process that :func:`is_running` recognises is signalled; a PID that now belongs
    to some other process is left alone.

    Parameters
    ----------
    handle
        What to stop; its PID and handle files are next to its log file.
    grace_seconds
        Seconds between SIGTERM and SIGKILL.

    Returns
    -------
    bool
        ``True`` if our process was running and has been stopped, ``False`` if it was
        already gone. Either way its PID and handle files are removed.
    """
    was_running = is_running(handle)
    if was_running:
        for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, sig)
            deadline = time.monotonic() + wait
            while is_running(handle) and time.monotonic() < deadline:
                time.sleep(_POLL_SECONDS)
            if not is_running(handle):
                break
        else:
            raise ServiceError(f"{handle.name} (pid {handle.pid}) survived SIGKILL")
    _remove_handle(handle.log_path.parent, handle.name)
    return was_running


def stop_all(state_dir: str | os.PathLike[str], *, grace_seconds: float = 10.0) -> list[str]:
    """Stop every process recorded in ``state_dir``, last started first.

    Returns
    -------
    list of str
        Names of the processes that were running and have been stopped.
    """
    stopped = []
    for handle in reversed(list(read_handles(state_dir).values())):
        if stop(handle, grace_seconds=grace_seconds):
            stopped.append(handle.name)
    return stopped


def start_on_free_port(
    start: Callable[[int], ServiceHandle], port: int | None, host: str
) -> ServiceHandle:
    """Call ``start(port)``; with no fixed port, retry on a fresh one if it was taken."""
    attempts = 1 if port is not None else _PORT_ATTEMPTS
    for attempt in range(attempts):
        try:
            return start(port if port is not None else free_port(host))
        except PortInUseError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
