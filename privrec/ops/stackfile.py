"""The stack's files and shared helpers: ``stack.json``, the lock, ``tokens.json``, child environments, probes."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.config import acl
from pipeline import services
from pipeline.services import ServiceHandle
from pipeline.config.settings import Settings, env_name
from pipeline.serve.auth import OPERATOR_ENV, SECRET_ENV, Tokens, new_token

__all__ = [
    "AlreadyRunningError",
    "KAFKA",
    "OpsError",
    "REDIS",
    "STACK_FILE",
    "TOKENS_FILE",
    "TOPIC_PARTITIONS",
    "WEB",
    "admin_redis_url",
    "child_env",
    "default_state_dir",
    "http_probe",
    "locked",
    "read_stack",
    "recorded_handles",
    "running_processes",
    "settings_dict",
    "stack_tokens",
    "read_tokens",
    "worker_status_key",
    "write_stack",
]

#: The stack description written by :func:`up` (and removed by :func:`down`).
STACK_FILE = "stack.json"
#: The stack's token secret and operator token (:mod:`pipeline.serve.auth`), mode 0600, beside ``stack.json``.
TOKENS_FILE = "tokens.json"
#: Partitions of the topics other than ``interactions`` (whose count is a setting).
TOPIC_PARTITIONS = {"dead-letters": 1, "recommendations": 1}
#: Names of the processes, in start order (workers are ``worker-<i>``).
KAFKA, REDIS, WEB = "kafka", "redis", "web"
_LOCK_FILE = ".lock"
POLL_SECONDS = 0.1
STACK_SCHEMA = 1


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

    Written by the ingest task (:mod:`pipeline.ingestion.agents`) about once a second; the field is
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
    for name in (SECRET_ENV, OPERATOR_ENV):  # the web server's alone: privrec.ops.up adds them to its environment
        env.pop(name, None)
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


def stack_tokens(state_dir: Path, environ: Mapping[str, str] | None = None) -> Tokens:
    """The stack's tokens: ``PRIVREC_TOKEN_SECRET`` / ``PRIVREC_OPERATOR_TOKEN`` of ``environ`` (ours when ``None``)
    where set, else those of ``<state_dir>/tokens.json``, else new ones (32 random bytes each); written back to
    ``tokens.json`` (mode 0600), so the stack keeps them across restarts and ``privrec budget`` finds the operator's.

    The file is the only place they are kept: not ``stack.json``, not Redis (whose ``web`` user could read it).
    """
    env = os.environ if environ is None else environ
    kept = read_tokens(state_dir)
    tokens = Tokens(secret=env.get(SECRET_ENV) or (kept.secret if kept else new_token()),
                    operator=env.get(OPERATOR_ENV) or (kept.operator if kept and kept.operator else new_token()))
    if tokens != kept:
        fd = os.open(state_dir / TOKENS_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"secret": tokens.secret, "operator": tokens.operator}, fh)
    return tokens


def read_tokens(state_dir: str | os.PathLike[str]) -> Tokens | None:
    """The tokens of ``<state_dir>/tokens.json`` (:func:`stack_tokens`), or ``None`` when there is none."""
    path = Path(state_dir) / TOKENS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise OpsError(f"{path} is not valid JSON ({exc}); remove it and `privrec up` again (new tokens)") from None
    return Tokens(secret=data["secret"], operator=data.get("operator"))


def write_stack(state_dir: Path, stack: Mapping[str, Any]) -> None:
    path = state_dir / STACK_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(stack, indent=2) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def locked(state_dir: Path, what: str) -> Iterator[None]:
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


def recorded_handles(state_dir: Path, stack: Mapping[str, Any] | None) -> list[ServiceHandle]:
    """Handles of the processes ``stack.json`` lists, in start order (missing ones skipped)."""
    if not stack:
        return []
    handles = services.read_handles(state_dir)
    return [handles[n] for n in stack.get("processes", []) if n in handles]


def running_processes(handles: list[ServiceHandle]) -> dict[str, int]:
    return {h.name: h.pid for h in handles if services.is_running(h)}


def http_probe(url: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]] | None:
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


def admin_redis_url(stack: Mapping[str, Any]) -> str:
    """The Redis URL of the ops commands, with the administrator's credentials when ``privrec up`` set ACL users
    (:func:`role_redis_url`)."""
    return role_redis_url(stack, "admin")


def role_redis_url(stack: Mapping[str, Any], role: str) -> str:
    """The Redis URL the stack's ``role`` connects with (``admin``: the ops commands), with its credentials."""
    url = str(stack["redis"])
    users = (stack.get("redis_acl") or {}).get("users")
    if not users:
        return url
    creds = acl.load_credentials(Path(stack["state_dir"]))
    if creds is None:
        raise OpsError(f"{Path(stack['state_dir']) / acl.ROLES_FILE} is missing: the stack's Redis passwords are gone "
                       f"(`privrec down`, then `privrec up` makes new ones)")
    if role == "admin":
        if not stack["redis_acl"].get("external"):
            return acl.role_url(url, "default", creds["default"])
        role = "worker" if "worker" in users else "web"
    return acl.role_url(url, users[role], creds[role])


def settings_dict(settings: Settings) -> dict[str, Any]:
    out = dataclasses.asdict(settings)
    # JSON has no inf: keep epsilon readable and exact as a string when it is not finite
    for k, v in out.items():
        if isinstance(v, float) and v in (float("inf"), float("-inf")):
            out[k] = repr(v)
    return out
