"""The shuffler as a party of its own: ``python -m pipeline.modes.local.shuffler_service --port P`` (Prochlo's *shuffle*).

Devices ``POST /submit`` an envelope (:mod:`models.local.esa`): who they are, their report counter, the shown
list they answer and their report's content sealed to the analyzer's key. The shuffler

1. checks what it can see: the envelope's form and the sealed bytes' form (400 naming the field), the user
   (404), that the list was shown to this user (404 / 400; it reads the web's shown lists, which are public,
   read-only), one report per list (409), a growing report counter (409: stale or repeated version), the
   lifetime budget's report limit (403, as ``POST /report`` does without a separate shuffler);
2. keeps the envelope with the list's items in its own Redis keys (``{ns}-shuffler:*``, its own ACL user: the
   web and the worker cannot read them, and it can read nothing of theirs but the shown lists), then answers
   202 — accepted envelopes survive a restart;
   at user level it mirrors the user's ledger record (epoch, reports in it, last version) to the public ledger
   keys ``{ns}:ledger:{ns:p<P>}:participation``, and each refusal for the cap, an epoch or the budget to
   ``…:summary`` (``dropped`` / ``over_budget``), as the worker's report ingest does
   (:meth:`pipeline.modes.local.ingest.LocalIngest._mirror_ledger`): participations are public, and
   ``/budget`` and the dashboard read them there. At every level it mirrors the user's count of accepted
   envelopes to ``{ns}:ledger:{ns:p<P>}:users`` (``/budget?user=``'s ``interactions`` / ``reports``: the key the
   report ingest counts in without a shuffler). Its ACL user may write exactly those three kinds of keys;
3. batches with the local mode's policy (:class:`models.local.shuffle.Shuffler`: one report of each of
   ``shuffle_batch`` distinct users of one model unit), and a full batch — the unit, a sequence number, the
   items and the sealed contents, each list shuffled by :class:`random.SystemRandom`, no identity — is saved in
   an outbox in the same transaction that removes its envelopes, produced to ``ldp-shuffled``, then dropped
   from the outbox (the analyzer counts a batch's sequence number once, so a re-send after a crash is harmless).

It never holds a key that opens a content: it cannot read a report. Identified envelopes never touch Kafka
(the embedded broker has no ACLs: a topic of them would be readable by every process); they live only in the
shuffler's Redis keys until their batch leaves.

Cross-origin: the page (served by the web server) posts here directly, so ``/submit`` answers CORS requests
from any origin — the web server must not relay envelopes: it would see each sealed content next to its
user, and the operator running it would then link the analyzer's decryption back to that user.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading
import time
from typing import Any

import redis
from aiohttp import web

from models.local import LocalConfig, ReportError
from models.local.esa import Envelope, SealedShuffler, parse_envelope
from models.local.shuffle import POPULATION

from ...data.catalog import Catalog, UnknownUserError, load_catalog
from ...config.keys import PublicKeys, partition_of
from .local_http import report_limit
from models.local.analyzer import BeyondLimit, check_user_level
from ...config.ledger import LedgerRecord
from ...config.kafkaconn import client_kwargs
from ...data.records import TOPICS
from ...config.redisconn import connect
from ...config.settings import Settings

__all__ = ["ShufflerStore", "ShufflerService", "Refused", "create_app", "shuffler_prefix", "main"]

log = logging.getLogger("privrec.shuffler")
#: How long a claim "this list was answered" is kept (as the web keeps its shown lists).
ANSWERED_TTL = 24 * 3600
#: How long to look again for a shown list whose write-behind is still under way (seconds).
SHOWN_RETRY_SECONDS = 1.0


def shuffler_prefix(namespace: str) -> str:
    """Every key of the shuffler starts with this (its Redis user may touch nothing else but read shown lists)."""
    return f"{namespace}-shuffler:"


class ShufflerStore:
    """The shuffler's durable state in Redis, all under one hash tag of its own prefix.

    ``open`` (hash: arrival number → stored envelope with its unit), ``versions`` (hash: user → latest version),
    ``seq`` (hash: unit → batches sent), ``accepted`` (hash: user → envelopes accepted, for the lifetime budget:
    :func:`pipeline.modes.local.local_http.report_limit`), ``arrivals`` (counter), ``outbox`` (list of batches not yet produced),
    ``answered:<rec_id>`` (strings with a TTL), ``ledger`` (hash: user → their user-level ledger record, the
    epoch of their last accepted envelope and its count: the cap's check, :func:`check_user_level`).
    """

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.r = client
        tag = f"{{{namespace}-shuffler}}"
        p = shuffler_prefix(namespace)
        self.open, self.versions, self.seq = f"{p}open:{tag}", f"{p}versions:{tag}", f"{p}seq:{tag}"
        self.arrivals, self.outbox, self.accepted = f"{p}arrivals:{tag}", f"{p}outbox:{tag}", f"{p}accepted:{tag}"
        self._answered = f"{p}answered:{tag}:"
        self.ledger = f"{p}ledger:{tag}"

    def answered(self, rec_id: str) -> str:
        return self._answered + rec_id


class Refused(Exception):
    """An envelope the shuffler answers with a 4xx: the HTTP ``status``, the field (``parameter``) and why."""

    def __init__(self, status: int, parameter: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.parameter, self.message = status, parameter, message


class ShufflerService:
    """The shuffler's logic over its store: accept an envelope, batch, hand out completed batches."""

    def __init__(self, client: redis.Redis, settings: Settings, catalog: Catalog, config: LocalConfig) -> None:
        self.r, self.settings, self.catalog, self.config = client, settings, catalog, config
        self.store = ShufflerStore(client, settings.namespace)
        self.public = PublicKeys(settings.namespace)
        #: Held while one envelope is checked and saved (in an executor thread: see :meth:`accept`).
        self.commit_lock = threading.Lock()
        self.load()

    def load(self) -> None:
        """(Re)build the batching state from Redis: the open envelopes in arrival order."""
        self.shuffler = SealedShuffler(self.config)
        st = self.store
        self.shuffler.seq = {int(k): int(v) for k, v in self.r.hgetall(st.seq).items()}
        self.field: dict[tuple[str, int], str] = {}
        for name, raw in sorted(self.r.hgetall(st.open).items(), key=lambda kv: int(kv[0])):
            stored = json.loads(raw)
            env = parse_envelope(stored["envelope"], stored=True)
            self.field[(env.user, env.version)] = name.decode()
            closed = self.shuffler.add_envelope(env, unit=int(stored["unit"]))
            assert not closed, "a saved open batch was full: it should have left in the same transaction"

    def _shown(self, rec_id: str) -> dict[str, Any] | None:
        raw = self.r.get(self.public.recommendation(rec_id))
        return None if raw is None else dict(json.loads(raw))

    async def accept(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        """``(status, body)`` of ``POST /submit``; a 202 envelope is saved (and its batch, if it completed one).

        Every Redis call runs in the loop's default executor (the client is the synchronous ``redis.Redis``), so a
        slow store never stalls the other requests or the forwarding loop; the checks and the save of one envelope
        run under :attr:`commit_lock`, one envelope at a time, in arrival order of the lock.
        """
        try:
            env, unit = self._parse(raw)
            env = await self._with_shown(env)
            batches = await asyncio.to_thread(self._commit, env, unit)
        except Refused as e:
            return e.status, _err(e.parameter, e.message)
        if batches:
            log.info("shuffler: %d batch(es) of unit %d complete (%d reports each)", len(batches), unit,
                     batches[0].n)
        return 202, {"accepted": True, "user": env.user, "version": env.version}

    def _parse(self, raw: bytes) -> tuple[Envelope, int]:
        """The envelope and its batching unit, from what the shuffler can check without its store."""
        try:
            env = parse_envelope(raw)
        except ReportError as e:
            raise Refused(400, e.parameter, e.message) from None
        try:
            unit = self.catalog.unit_of(env.user)
        except UnknownUserError as e:
            raise Refused(404, "user", str(e)) from None
        if self.config.codewords:  # population-wide batches; every report carries its sealed messages
            if not env.msgs:
                raise Refused(400, "msgs", "missing: with codewords an envelope carries its messages, each sealed")
            return env, POPULATION
        if env.msgs:
            raise Refused(400, "msgs", "this namespace takes no item messages (setting local_codewords is 0)")
        return env, unit

    async def _with_shown(self, env: Envelope) -> Envelope:
        """``env`` with the items of the list it answers (the web's shown list, which must be its user's)."""
        shown = await asyncio.to_thread(self._shown, env.rec_id)
        if shown is None:  # the web writes its lists behind the answer: look once more
            await asyncio.sleep(SHOWN_RETRY_SECONDS)
            shown = await asyncio.to_thread(self._shown, env.rec_id)
        if shown is None:
            raise Refused(404, "rec_id", f"unknown rec_id {env.rec_id!r} (never shown by /recommend, or expired)")
        if shown.get("user") != env.user:
            raise Refused(400, "user", f"list {env.rec_id!r} was shown to another user")
        return env.with_shown(tuple(shown["items"]))

    def _commit(self, env: Envelope, unit: int) -> list[Any]:
        """Check ``env`` against the store (one per list, a growing version, the budget, the cap) and save it with
        the batches it completes, in one transaction; the batches closed. Blocking: runs in an executor thread,
        under :attr:`commit_lock` (the checks and the save of one envelope are never interleaved with another's)."""
        st = self.store
        with self.commit_lock:
            record = self._check(env)
            self.shuffler.just_closed = []
            batches = self.shuffler.add_envelope(env, unit=unit)
            arrival = int(self.r.incr(st.arrivals))
            name = f"{arrival:015d}"
            self.field[(env.user, env.version)] = name
            with self.r.pipeline(transaction=True) as pipe:
                pipe.hset(st.open, name, json.dumps({"unit": unit, "envelope": env.to_dict()}))
                pipe.hset(st.versions, env.user, env.version)
                pipe.hincrby(st.accepted, env.user, 1)  # the third reply: the user's accepted count
                if record is not None:
                    pipe.hset(st.ledger, env.user, record.dumps())
                pipe.set(st.answered(env.rec_id), "1", ex=ANSWERED_TTL)
                gone = [self.field.pop((e.user, e.version)) for e in self.shuffler.just_closed]
                if gone:
                    pipe.hdel(st.open, *gone)
                for b in batches:
                    pipe.hset(st.seq, str(b.unit), b.seq)
                    pipe.rpush(st.outbox, b.to_json())
                try:
                    accepted = int(pipe.execute()[2])
                except redis.RedisError:
                    self.load()  # nothing of this envelope was saved: the state as Redis has it
                    raise
            if record is not None:
                self.mirror_ledger(env.user, record=record)
            self.mirror_count(env.user, accepted)
        return list(batches)

    def _check(self, env: Envelope) -> LedgerRecord | None:
        """Refuse ``env`` if its list was answered, its version does not grow, its user's lifetime budget is spent
        or (user level) it is beyond the cap; else the user's new ledger record (user level) or ``None``."""
        st = self.store
        if self.r.exists(st.answered(env.rec_id)):
            raise Refused(409, "rec_id", f"a report on {env.rec_id!r} was already accepted (one per shown list)")
        latest = int(self.r.hget(st.versions, env.user) or 0)
        if env.version <= latest:
            raise Refused(409, "version", f"stale or repeated version {env.version} of user {env.user!r} (latest "
                                          f"{latest}): the device's report counter must grow")
        limit = report_limit(self.config, self.settings.lifetime_budget)
        if limit is not None and int(self.r.hget(st.accepted, env.user) or 0) >= limit:
            self.mirror_ledger(env.user, refused="over_budget")
            raise Refused(403, "user", f"user {env.user!r} has sent the {limit} reports their lifetime budget "
                                       f"allows (user_budget epsilon {self.settings.lifetime_budget:g}): no further "
                                       f"report is accepted")
        if not self.config.user_level:
            return None
        raw_record = self.r.hget(st.ledger, env.user)  # the cap per epoch, from the envelope's version and epoch
        ledger = {} if raw_record is None else {env.user: LedgerRecord.loads(raw_record)}
        try:
            return check_user_level(self.config, ledger, env, time.time())
        except ReportError as e:
            raise Refused(400, e.parameter, e.message) from None
        except BeyondLimit as e:
            self.mirror_ledger(env.user, refused=e.counter)
            raise Refused(403, "epoch" if e.counter == "dropped" else "version", str(e)) from None

    def mirror_ledger(self, user: str, *, record: LedgerRecord | None = None, refused: str | None = None) -> None:
        """User level: ``user``'s ledger record, or one refusal (``dropped`` / ``over_budget``), to the public ledger
        keys of the user's partition. After the shuffler's own transaction (the keys are in other hash slots): a
        crash in between leaves the mirror one envelope behind until the user's next one (the shuffler's own
        record decides, never the mirror)."""
        if not self.config.user_level:
            return
        p = partition_of(user, self.settings.partitions)
        if record is not None:
            self.r.hset(self.public.ledger_participation(p), user, record.dumps())
        if refused is not None:
            self.r.hincrby(self.public.ledger_summary(p), refused, 1)

    def mirror_count(self, user: str, accepted: int) -> None:
        """``user``'s accepted envelopes (all of their history) to the public ``ledger_users`` hash of their
        partition, as an absolute value (a crash before it leaves the mirror behind until their next envelope)."""
        self.r.hset(self.public.ledger_users(partition_of(user, self.settings.partitions)), user, accepted)

    def outbox(self) -> list[bytes]:
        return [bytes(v) for v in self.r.lrange(self.store.outbox, 0, -1)]

    def sent(self, count: int) -> None:
        """The first ``count`` batches of the outbox are on the topic: drop them."""
        if count:
            self.r.ltrim(self.store.outbox, count, -1)


def _err(parameter: str | None, message: str) -> dict[str, Any]:
    return {"error": {"parameter": parameter, "message": message}}


_CORS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "POST, OPTIONS",
         "Access-Control-Allow-Headers": "Content-Type", "Access-Control-Max-Age": "600"}

SERVICE = web.AppKey("service", ShufflerService)
PRODUCER = web.AppKey("producer", object)
FLUSH = web.AppKey("flush", asyncio.Event)


def create_app(settings: Settings, catalog: Catalog, client: redis.Redis) -> web.Application:
    """The shuffler's aiohttp app: ``POST /submit``, ``GET /healthz``; the outbox is produced in the background."""
    config = settings.local_config(catalog.d)
    app = web.Application(client_max_size=(64 + config.codewords // 4) * 1024)  # codewords: ~130 B a message
    app[SERVICE] = ShufflerService(client, settings, catalog, config)
    app[FLUSH] = asyncio.Event()

    async def submit(request: web.Request) -> web.Response:
        try:
            status, body = await request.app[SERVICE].accept(await request.read())
        except redis.RedisError as exc:
            log.warning("shuffler: Redis unavailable (%s)", type(exc).__name__)
            return web.json_response(_err(None, "the shuffler's store is unavailable: retry"), status=503,
                                     headers={**_CORS, "Retry-After": "1"})
        if status == 202:
            request.app[FLUSH].set()
        return web.json_response(body, status=status, headers=_CORS)

    async def preflight(_request: web.Request) -> web.Response:
        return web.Response(status=204, headers=_CORS)

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "role": "shuffler", "shuffle_batch": config.shuffle_batch})

    async def forward(app: web.Application) -> Any:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(**client_kwargs(settings), linger_ms=5)
        await producer.start()
        service = app[SERVICE]

        async def loop() -> None:
            while True:
                try:
                    for value in await asyncio.to_thread(service.outbox):  # Redis off the loop, as in accept
                        unit = json.loads(value)["unit"]
                        await producer.send_and_wait(TOPICS["ldp_shuffled"], key=str(unit).encode(), value=value)
                        await asyncio.to_thread(service.sent, 1)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - broker or Redis away: the outbox keeps them; try again
                    log.warning("shuffler: forwarding failed (%s: %s); retrying", type(exc).__name__, exc)
                    await asyncio.sleep(1.0)
                    continue
                app[FLUSH].clear()
                try:
                    await asyncio.wait_for(app[FLUSH].wait(), timeout=1.0)
                except asyncio.TimeoutError:
                    pass

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await producer.stop()

    app.cleanup_ctx.append(forward)
    app.router.add_post("/submit", submit)
    app.router.add_route("OPTIONS", "/submit", preflight)
    app.router.add_get("/healthz", healthz)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.modes.local.shuffler_service", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("PRIVREC_LOGLEVEL", "INFO"))
    settings = Settings.from_mapping({})
    if settings.mode != "local" or not settings.shuffle_batch:
        raise SystemExit("the shuffler runs in local mode with `shuffle_batch` > 0 only")
    catalog = load_catalog(settings)
    client = connect(settings.redis_url or "redis://127.0.0.1:6379/0")
    log.info("shuffler: namespace %r, batches of %d distinct users per unit, on %s:%d", settings.namespace,
             settings.shuffle_batch, args.host, args.port)
    web.run_app(create_app(settings, catalog, client), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
