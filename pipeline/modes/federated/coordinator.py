"""The star coordinator of the federated mode: ``python -m pipeline.modes.federated.coordinator`` (settings from the environment).

It consumes ``federated-updates``, keeps each site's latest release (a repeated or older version counts
once — :class:`pipeline.modes.federated.federation.Coordinator`), and every ``tick_seconds`` sums them into the namespace's
released statistics and solves the serving model (:class:`pipeline.release.stages.SolveStage`, unchanged). It never
sees raw events or a site's exact statistics: with the Redis ACL users of ``privrec up`` it cannot read them
either (:mod:`pipeline.config.acl`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402

from ...data.catalog import load_catalog  # noqa: E402
from .federation import Coordinator, MalformedMessage, decode_message  # noqa: E402
from ...config.kafkaconn import client_kwargs  # noqa: E402
from ...data.records import TOPICS, dead_letter_value  # noqa: E402
from ...config.redisconn import connect  # noqa: E402
from ...config.settings import Settings  # noqa: E402
from .sites import federated_statement, site_guarantee  # noqa: E402
from ...release.stages import SolveStage, projection  # noqa: E402

log = logging.getLogger("privrec.coordinator")

__all__ = ["run", "main"]


async def run(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    """Consume site releases and publish their sum until ``stop`` is set."""
    catalog = load_catalog(settings)
    structure, V = projection(settings.algorithm, catalog.W)
    client = connect(settings.redis_url or "redis://127.0.0.1:6379/0")
    coord = Coordinator(client, settings.namespace, V=V, structure=structure, sites=settings.sites)
    statement = federated_statement(settings, site_guarantee(settings, catalog))
    solver = SolveStage(settings, client, statement)
    consumer = AIOKafkaConsumer(TOPICS["federated_updates"], **client_kwargs(settings),
                                group_id=f"privrec-{settings.namespace}-coordinator", auto_offset_reset="earliest",
                                enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=1000,
                                max_partition_fetch_bytes=16 * 1024 * 1024)
    producer = AIOKafkaProducer(**client_kwargs(settings), linger_ms=5)
    await consumer.start()
    await producer.start()
    loop = asyncio.get_running_loop()
    status_key = f"{settings.namespace}:ops:{{{settings.namespace}:ops}}:workers"
    last_tick = 0.0
    stop = stop or asyncio.Event()
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200)
            for tp, records in batches.items():
                for r in records:
                    raw = r.value or b""
                    try:
                        msg = decode_message(raw, n_units=catalog.n_units, d=catalog.d, sites=settings.sites)
                    except MalformedMessage as exc:
                        await producer.send_and_wait(TOPICS["dead_letters"], value=dead_letter_value(
                            raw, f"federated update: {exc}", tp.topic, tp.partition, r.offset))
                        continue
                    await loop.run_in_executor(None, coord.offer, msg, raw)
            if batches:
                await consumer.commit()
            now = time.monotonic()
            if now - last_tick >= settings.tick_seconds:
                last_tick = now
                version = await loop.run_in_executor(None, lambda: coord.aggregate(n_units=catalog.n_units,
                                                                                   d=catalog.d))
                solved = await loop.run_in_executor(None, solver.run)
                if version is not None or solved is not None:
                    log.info("aggregated version %s, solved %s", version, solved)
                client.hset(status_key, "coordinator", f'{{"pid": {os.getpid()}, "at_ms": {int(time.time() * 1000)}}}')
    finally:
        await consumer.stop()
        await producer.stop()
        client.close()


def main() -> None:
    logging.basicConfig(level=os.environ.get("PRIVREC_LOGLEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_mapping({})
    stop = asyncio.Event()

    async def runner() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(settings, stop=stop)

    asyncio.run(runner())


if __name__ == "__main__":
    main()
