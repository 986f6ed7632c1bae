"""Fault points for the fault tests: a process kills itself (SIGKILL) at a named point of its work.

``PRIVREC_FAULT=<point>[@<n>]`` makes the ``n``-th (default first) pass through ``point(<point>)`` send
SIGKILL to the process itself — no cleanup, no flush, as a power cut or the OOM killer would. Unset
(always, outside tests), a fault point costs one dictionary lookup.

Points: ``release-persisted`` (the release and the mechanism state are in Redis, not yet published),
``release-published`` (published, not yet solved), ``solve-before-write`` (the serving models are
computed, not yet written), ``outbox-acknowledged`` (the web's forwarder: the broker acknowledged a batch,
its positions are not yet in Redis).
"""

from __future__ import annotations

import os
import signal
from collections import Counter

__all__ = ["point"]

_hits: Counter[str] = Counter()


def point(name: str) -> None:
    spec = os.environ.get("PRIVREC_FAULT")
    if not spec:
        return
    target, _, nth = spec.partition("@")
    if target != name:
        return
    _hits[name] += 1
    if _hits[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
