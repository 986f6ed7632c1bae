"""``privrec up`` in local mode with shuffling: the shuffler as a party of its own (encode-shuffle-analyze).

:func:`start_shuffler` runs before the workers: the stack's analyzer key pair, made on its first start and kept
after (:func:`pipeline.modes.local.esa.create_keys`: the private key 0600 in ``<state>/esa/``), then
``python -m pipeline.modes.local.shuffler_service`` on a port of its own, connected to Redis as the ``shuffler`` user
(:func:`pipeline.config.acl.global_rules`: its own keys ``{ns}-shuffler:*`` and read-only the shown lists). It returns
what the workers' and the web server's environments get besides their settings: the worker (the analyzer) the
path of the private key, the web server the path of the public description — never the other way round, and the
shuffler neither. :func:`role_env` gives the same to a process the supervisor starts again.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from pipeline import services
from pipeline.modes.local.esa import ESA_DIR, KEY_ENV, PUBLIC_ENV, create_keys
from pipeline.services import ServiceHandle
from pipeline.config.settings import Settings

from .stackfile import child_env, http_probe

__all__ = ["SHUFFLER", "uses_shuffler", "start_shuffler", "forget_shuffler", "role_env"]

#: The shuffler's process name (its PID, handle and log files; its Redis role).
SHUFFLER = "shuffler"


def uses_shuffler(settings: Settings) -> bool:
    """Local mode with shuffling: the stack runs the shuffler as its own service."""
    return settings.mode == "local" and bool(settings.shuffle_batch)


def forget_shuffler(state: Path) -> None:
    """A stack without a separate shuffler: no public description left from an earlier one (the key stays)."""
    (state / ESA_DIR / "public.json").unlink(missing_ok=True)


def role_env(state: Path, name: str) -> dict[str, str]:
    """What ``name``'s environment gets besides its settings: the worker the key's path, the web the public one."""
    d = state / ESA_DIR
    if not (d / "public.json").exists():
        return {}
    if name.startswith("worker-"):
        return {KEY_ENV: str(d / "analyzer-key.pem")}
    if name == "web":
        return {PUBLIC_ENV: str(d / "public.json")}
    return {}


def start_shuffler(settings: Settings, state: Path, *, urls: Mapping[str, str], record: Callable[[str], None],
                   started: list[ServiceHandle], note: Callable[[str], None], took: Callable[[], str],
                   loglevel: str | None, timeout: float) -> None:
    """Create (or keep) the stack's analyzer key and start the shuffler; return once it answers ``/healthz``."""
    host = services.LOOPBACK
    for attempt in range(5):
        port = services.free_port(host)
        url = f"http://{host}:{port}"
        create_keys(state, shuffler_url=url)
        env = child_env(settings.replace(redis_url=urls.get(SHUFFLER, settings.redis_url)), state, loglevel=loglevel)
        for key in (KEY_ENV, PUBLIC_ENV):
            env.pop(key, None)
        if attempt == 0:
            record(SHUFFLER)
        try:
            h = services.start_process(SHUFFLER, [sys.executable, "-m", "pipeline.modes.local.shuffler_service", "--host", host,
                                                  "--port", str(port)], state, address=f"{host}:{port}", url=url,
                                       env=env, timeout=timeout, ready=lambda: http_probe(f"{url}/healthz") is not None)
        except services.PortInUseError:
            if attempt == 4:
                raise
            continue
        started.append(h)
        note(f"shuffler {url}  pid {h.pid}  (its own Redis user; the analyzer's key in {state / ESA_DIR}, "
             f"worker only) {took()}")
        return
