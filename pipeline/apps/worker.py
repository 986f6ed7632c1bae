"""Run one privrec worker: ``python -m pipeline.apps.worker`` (settings from the environment).

Started by ``privrec up`` (or by tests) with ``KAFKA_BOOTSTRAP``, ``REDIS_URL``
and ``PRIVREC_*`` set. Not the ``faust worker`` CLI, which would re-enable
faust's web server on 0.0.0.0:6066 (deploy/NOTES-broker.md).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main() -> None:
    import faust

    from .worker_app import build_worker_app

    app = build_worker_app()
    level = os.environ.get("PRIVREC_LOGLEVEL", "INFO")
    faust.Worker(app, loglevel=level).execute_from_commandline()


if __name__ == "__main__":
    main()
