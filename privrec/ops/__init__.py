"""Start, inspect and stop a whole privrec stack: ``privrec up`` / ``status`` / ``down``.

A *stack* is what :func:`up` starts under one state directory, on loopback, on free
ports, each process tracked by PID through :mod:`pipeline.services`:

1. ``kafka`` — the embedded Tansu broker (memory-only), unless ``settings.kafka`` names
   an external one (``KAFKA_BOOTSTRAP`` / ``--kafka``);
2. ``redis`` — ``redis-server`` with AOF on, unless ``settings.redis_url`` names an
   external one (``REDIS_URL`` / ``--redis-url``);
3. the topics (``interactions`` with ``settings.partitions`` partitions, ``dead-letters``,
   ``recommendations``), created if missing;
4. ``worker-0`` … ``worker-{N-1}`` — faust workers (``python -m pipeline.apps.worker``);
5. ``web`` — the HTTP API and page (``python -m pipeline.apps.web``).

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

Modules: ``stackfile`` (``stack.json``, the lock, child environments, probes), ``up``,
``status``, ``down``; everything public is re-exported here (``from privrec import ops``).

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

from pathlib import Path  # noqa: F401  (the doctests above use it)

from pipeline.config.settings import Settings  # noqa: F401  (the doctests above use it)

from .down import down
from .stackfile import (
    STACK_FILE,
    TOPIC_PARTITIONS,
    AlreadyRunningError,
    OpsError,
    child_env,
    default_state_dir,
    read_stack,
    worker_status_key,
)
from .status import status
from .up import up, wait_workers

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
