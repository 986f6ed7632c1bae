"""``privrec down``: stop exactly the processes ``stack.json`` lists, last started first."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline import services
from pipeline.services import ServiceHandle

from .relaunch import SUPERVISOR_FILE, stop_supervisor
from .stackfile import STACK_FILE, locked, read_stack, recorded_handles

__all__ = ["down"]

#: Processes stopped together (each takes about a second to leave its consumer groups).
_PARALLEL = ("worker-", "site-")

def down(state_dir: str | os.PathLike[str], *, grace_seconds: float = 10.0,
         say: Callable[[str], None] | None = None) -> list[tuple[str, int]]:
    """Stop what ``up`` started in ``state_dir``, last started first; return ``(name, pid)`` stopped.

    The supervisor (:mod:`privrec.ops.supervise`) is stopped first, before anything else is read or
    stopped, so it cannot restart what ``down`` stops (a restart under way finishes first, and is then
    stopped with the rest); ``say`` is told its PID. It is not in the returned list, which names the
    stack's own processes.

    Only processes ``stack.json`` lists are touched, each only if :mod:`pipeline.services`
    recognises it as the process it started (same executable and start time). Workers (and sites)
    stop together (each takes about a second to leave its consumer groups); the web server
    stops before them and the broker and redis after them. ``stack.json`` and the PID
    files are removed; the redis data (``redis/``) and logs stay.
    """
    state = Path(state_dir).resolve()
    if not state.is_dir():
        return []
    with locked(state, "`privrec down`"):
        keeper = stop_supervisor(state, grace_seconds=grace_seconds)
        if keeper is not None and say is not None:
            say(f"supervisor (pid {keeper}) stopped first, so it restarts nothing")
        stack = read_stack(state)
        handles = recorded_handles(state, stack)
        stopped: list[tuple[str, int]] = []
        groups: list[list[ServiceHandle]] = []
        for h in reversed(handles):  # consecutive workers form one group, stopped in parallel
            if h.name.startswith(_PARALLEL) and groups and groups[-1][0].name.startswith(_PARALLEL):
                groups[-1].append(h)
            else:
                groups.append([h])
        for group in groups:
            with ThreadPoolExecutor(max_workers=len(group)) as pool:
                results = list(pool.map(lambda h: services.stop(h, grace_seconds=grace_seconds), group))
            stopped += [(h.name, h.pid) for h, was in zip(group, results) if was]
        (state / STACK_FILE).unlink(missing_ok=True)
        (state / SUPERVISOR_FILE).unlink(missing_ok=True)
        return stopped
