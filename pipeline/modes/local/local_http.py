"""Local mode's HTTP side: ``GET /local/config``, ``POST /report``, and the refusal of raw rewards.

Serving code: it imports only public things (the catalog, the public key layout, the device
calibration of :mod:`models.local`), never the trusted store. A report is checked here as far as
the web process can (the schema, the user, the shown list it answers, one report per list) and
produced to ``ldp-reports``; the worker checks the version (:mod:`pipeline.modes.local.ingest`).

The lifetime budget (``user_budget``) in local mode: a device's reports compose, so a user may send at most
:func:`report_limit` of them; the server counts each user's reports (atomically, :func:`budget_counter`, a key
of the web's own ``recs`` kind, no expiry) and refuses the ones past the limit with 403 — refused, never
silently lost: the count minus the limit is the user's reports "not learned (budget)".

At user level (local mode's default) the device enforces the cap per epoch and the budget itself; the worker
checks both again from each report's version and epoch (:mod:`pipeline.modes.local.ingest`), and ``/budget`` states each
user's guarantee in the fields of the global mode's user level (:func:`local_user_budget`,
:func:`local_ledger_overview`), from the public ledger the worker writes.
"""

from __future__ import annotations

import dataclasses

import json
import math
import time
from typing import Any

import numpy as np
from aiohttp import web

from models.accounting.conversions import gdp_epsilon, gdp_mu
from models.local import LocalConfig, ReportError, parse_report
from models.local.aggregate import clip_context

from ...serve.appkeys import CATALOG, KEYS, LOCAL_CONFIG, PRODUCER, REDIS, SETTINGS
from ...serve.budget_view import BudgetQuery, spent_summary, user_interactions
from ...serve.httpio import error as _error
from ...data.catalog import Catalog, UnknownUserError
from ...config.keys import PublicKeys, partition_of
from ...config.ledger import LedgerRecord
from ...serve.outbox import OUTBOX, accept
from ...data.records import TOPICS
from ...config.settings import Settings, SettingsError
from ...serve.shown import SHOWN

__all__ = ["add_routes", "refuse_raw_reward", "local_statement", "guarantee", "local_budget", "with_contexts", "RAW_REFUSED",
           "report_limit", "budget_counter", "local_user_budget", "local_ledger_overview", "catalog_codebook",
           "check_messages", "local_view"]

#: A separate shuffler's public description (:func:`pipeline.modes.local.esa.public_description`), ``None`` without one.
ESA = web.AppKey("esa", object)

#: Why ``/feedback`` and ``/listen`` answer 400 in local mode.
RAW_REFUSED = ("this stack runs in local mode: the server never receives a raw reward. Build a noisy report on the "
               "device (models.local.LocalClient, or the web page) and POST it to /report; GET /local/config gives "
               "the calibration (docs/local-protocol.md)")


def local_statement(config: LocalConfig) -> dict[str, Any]:
    """The privacy statement of a local-mode namespace (``/budget``, the serving models' meta)."""
    g = guarantee(config)
    out = {"private": True, **g, "note": g["statement"], "mechanism": g.get("mechanism", g.get("noise")),
           "neighbours": "event level, replace-one, on the device: two report streams of one user differing in the "
                         "reward of one interaction (rewards in [0, 1], contexts clipped to norm 1)",
           "scope": "every report a device ever sends; the server's sums, models and recommendations are "
                    "post-processing",
           # the server sees which devices report and when: their arrivals are public
           "relation": "replace"}
    if config.user_level:
        out.update({"neighbours": g["neighbours"],
                    "scope": f"per epoch of {config.epoch_seconds:g} s, all of one device's reports (at most "
                             f"{config.cap}) are ({config.epsilon:g}, {config.delta:g})-DP; its whole history "
                             f"composes up to its lifetime budget; the server's sums, models and recommendations "
                             f"are post-processing"})
    return out


def guarantee(config: LocalConfig) -> dict[str, Any]:
    """The devices' guarantee as this stack runs them: :meth:`models.local.LocalConfig.guarantee` for this stack's
    shuffler (in the worker, or a separate service: :func:`pipeline.modes.local.esa.separate_shuffler`), and with
    shuffling the guarantee against each party (:func:`pipeline.modes.local.esa.parties`): ``parties``, and
    ``against_operator``, the analyzer operator's with ``epsilon_per_report``, what one report is against whoever
    sees it with its sender's identity (``None``: no local guarantee, the blanket)."""
    if not config.shuffled:
        return config.guarantee()
    from .esa import parties, separate_shuffler

    separate = separate_shuffler()
    p = parties(config, separate=separate)
    return {**config.guarantee(shuffler="separate" if separate else "worker"), "parties": p,
            "against_operator": {**p["analyzer_operator"], "epsilon_per_report": p["colluding"]["epsilon"]}}


def refuse_raw_reward(request: web.Request) -> web.Response | None:
    """400 in local mode (a raw reward must never reach the server), ``None`` otherwise."""
    s: Settings = request.app[SETTINGS]
    if s.mode != "local":
        return None
    return _error(400, "reward", RAW_REFUSED)


def with_contexts(out: dict[str, Any], catalog: Catalog) -> dict[str, Any]:
    """Local mode's ``/recommend``: each item also carries ``x``, its public feature vector (norm <= 1)."""
    items = out["items"]
    if items:
        X = catalog.features_of([it["item"] for it in items])
        for it, x in zip(items, X):
            it["x"] = [float(v) for v in clip_context(np.asarray(x, dtype=np.float64))]
    return out


def add_routes(app: web.Application) -> None:
    s: Settings = app[SETTINGS]
    if s.mode == "local":  # the calibration, computed once before the app starts
        app[LOCAL_CONFIG] = s.local_config(app[CATALOG].d)
        if s.shuffle_batch:  # a separate shuffler: where devices send their sealed reports (pipeline.modes.local.esa)
            from .esa import public_description

            app[ESA] = public_description()
    app.router.add_get("/local/config", config_view)
    app.router.add_post("/report", report)


def _config(request: web.Request) -> LocalConfig:
    cfg: LocalConfig = request.app[LOCAL_CONFIG]
    return cfg


def report_limit(config: LocalConfig, user_budget: float) -> int | None:
    """How many reports of one user stay within ``user_budget`` (epsilon at the device's delta); ``None``: no limit.

    :meth:`models.local.LocalConfig.report_limit` with this budget: event level, the group bound (shuffled
    ``k * epsilon0``; ``round`` ``mu * sqrt(k)``; ``tree`` ``k * mu``, ``k * epsilon`` for a Laplace device
    mechanism); user level, the device's own ledger (the rule the device stops at).
    """
    return dataclasses.replace(config, user_budget=user_budget).report_limit()


def budget_counter(keys: PublicKeys, user: str) -> str:
    """The key counting one user's reports (accepted and refused), for the lifetime budget."""
    return keys.recommendation(f"reports:{user}")


_CODEBOOKS: dict[tuple[str, int, bool], np.ndarray] = {}


def catalog_codebook(catalog: Catalog, size: int, items: bool = False) -> np.ndarray:
    """The public codebook of ``size`` codewords of the catalog's item features (k-means, seed 0: the offline twin's
    :func:`models.local.items.codebook`), cached per catalog; post-processing of public data.

    ``items`` (the setting ``local_item_term``): the codebook is the catalog itself, codeword ``c`` the features of
    catalog row ``c``, so a message names the item listened to and the messages' histogram is also the item term.
    ``size`` must then be the catalog's number of items (:class:`~pipeline.config.settings.SettingsError` naming
    ``local_codewords`` otherwise).
    """
    from models.local.items import codebook

    key = (catalog.fingerprint, int(size), bool(items))
    hit = _CODEBOOKS.get(key)
    if hit is None:
        features = np.asarray(catalog.feature_matrix if items else catalog.features_of(list(catalog.arm_ids)),
                              dtype=np.float64)  # items: in catalog row order, the item term's
        if items and size != len(features):
            raise SettingsError("local_codewords", f"with local_item_term the codebook is the catalog itself: must be "
                                                   f"its number of items, {len(features)}, got {size}.")
        clipped = features / np.maximum(1.0, np.linalg.norm(features, axis=1, keepdims=True))  # as codebook() clips
        hit = _CODEBOOKS[key] = clipped if items else codebook(features, int(size), seed=0)
    return hit


def check_messages(config: LocalConfig, messages: Any) -> None:
    """A report's item messages against the calibration: codeword indices below ``codewords`` when on, none when
    off; :class:`~models.local.ReportError` naming ``msgs``."""
    if messages and not config.codewords:
        raise ReportError("msgs", "this namespace takes no item messages (setting local_codewords is 0)")
    if any(m > config.codewords for m in messages):
        raise ReportError("msgs", f"must be codeword indices below {config.codewords} (or {config.codewords}: the "
                                  f"dummy that stands for an absent listen)")
    if config.codewords and not messages:
        raise ReportError("msgs", "missing: with codewords a report carries its listen's messages (at least one)")


async def config_view(request: web.Request) -> web.Response:
    """The devices' public calibration; ``{"mode": <mode>}`` alone outside local mode."""
    s: Settings = request.app[SETTINGS]
    if s.mode != "local":
        return web.json_response({"mode": s.mode})
    public = _config(request).to_public()
    if public.get("codewords"):
        public["codebook"] = catalog_codebook(request.app[CATALOG], public["codewords"], bool(s.local_item_term)).tolist()
        public["item_term"] = bool(s.local_item_term)  # the codebook is the catalog: codeword c is catalog row c
    esa = request.app.get(ESA)
    return web.json_response(public if esa is None else {**public, "esa": esa})


async def report(request: web.Request) -> web.Response:
    s: Settings = request.app[SETTINGS]
    if s.mode != "local":
        return _error(400, None, f"this stack runs in {s.mode} mode: POST /report is for local mode; send feedback "
                                 f"to POST /feedback")
    cfg = _config(request)
    esa = request.app.get(ESA)
    if esa is not None:  # the web server must never see a report next to its user: the shuffler is a party apart
        return _error(400, None, f"this stack's shuffler is a separate service: seal the report's content to the "
                                 f"analyzer's key and POST the envelope to {esa['shuffler']} (GET /local/config: "
                                 f"'esa'; docs/local-parties.md)")
    raw = await request.read()
    try:
        rep = parse_report(raw, d=cfg.d, algorithm=cfg.algorithm)
        check_messages(cfg, rep.messages)
    except ReportError as e:
        return _error(400, e.parameter, e.message)
    catalog: Catalog = request.app[CATALOG]
    try:
        catalog.unit_of(rep.user)
    except UnknownUserError as exc:
        return _error(404, "user", str(exc))
    keys: PublicKeys = request.app[KEYS]
    r = request.app[REDIS]
    shown_raw = await request.app[SHOWN].get(rep.rec_id)  # a list whose write is still pending counts
    if shown_raw is None:
        return _error(404, "rec_id", f"unknown rec_id {rep.rec_id!r} (never shown by /recommend, or expired)")
    shown = json.loads(shown_raw)
    if shown["user"] != rep.user:
        return _error(400, "user", f"list {rep.rec_id!r} was shown to another user")
    if rep.shown:
        return _error(400, "shown", "is added by the server (the list it showed); a device does not send it")
    producer = request.app[PRODUCER]
    if producer is None:
        return _error(503, None, "no Kafka producer configured (KAFKA_BOOTSTRAP)")
    answered = keys.recommendation(rep.rec_id) + ":answered"
    # the queued report carries the whole shown list (public): the Gram takes every shown item, never the choice
    queued = dataclasses.replace(rep, shown=tuple(shown["items"])).to_json()
    limit = report_limit(cfg, s.lifetime_budget)
    counter = budget_counter(keys, rep.user)
    if limit is not None and await r.incr(counter) > limit:  # counted: reports "not learned (budget)"
        return _error(403, "user", f"user {rep.user!r} has sent the {limit} reports their lifetime budget allows "
                                   f"(user_budget epsilon {s.lifetime_budget:g}): no further report is accepted")
    try:
        accepted = await accept(r, request.app.get(OUTBOX), producer, TOPICS["ldp_reports"], rep.user.encode(), queued,
                                claim=(answered, "1", 24 * 3600))
    except Exception:
        if limit is not None:
            await r.decr(counter)  # not accepted: not counted
        raise
    if not accepted:
        if limit is not None:
            await r.decr(counter)
        return _error(409, "rec_id", f"a report on {rep.rec_id!r} was already accepted (one per shown list)")
    return web.json_response({"accepted": True, "user": rep.user, "version": rep.version}, status=202)


def local_user_budget(config: LocalConfig, user: str, raw: bytes | str | None, epoch: int) -> dict[str, Any]:
    """One user's user-level guarantee in local mode, in the fields of the global mode's
    (:func:`pipeline.serve.budget_view.user_budget`): from their public ledger record ``raw`` (the worker's: the epoch of
    their last accepted report, the reports in it, and its version — a device's report counter, so at least the
    number of reports it ever made) as of epoch ``epoch``."""
    rec = LedgerRecord.loads(raw)
    k = rec.k if rec.epoch == epoch else 0
    n = rec.last_version
    eps, delta = config.spent(n)
    limit = config.report_limit()
    out: dict[str, Any] = {"user": user, "unit": "user", "ticks_this_epoch": k, "cap": config.cap,
                           "at_cap": k >= config.cap, "epoch": epoch, "cap_policy": "device", "reports": n,
                           "epsilon": eps, "delta": delta if n else config.delta, "valid": True,
                           "mu": None if config.shuffled else gdp_mu(config.epsilon, config.delta)
                           * math.sqrt(config.spent_fraction(n)),
                           "bound": "user level, on the device: every report this user's device ever sent, all "
                                    "together (the device's calibration to its cap; blocks of cap reports compose"
                                    + (" by basic composition of the shuffled batches)" if config.shuffled
                                       else " in Gaussian DP)"),
                           "remaining_ticks": max(0, config.cap - k)}
    if limit is not None:
        out.update({"user_budget": config.user_budget, "at_budget": n >= limit,
                    "budget_left": max(0.0, config.user_budget - eps), "reports_allowed": limit})
    return out


async def local_ledger_overview(r: Any, keys: PublicKeys, partitions: int, config: LocalConfig,
                                epoch: int) -> dict[str, Any]:
    """``/budget``'s ``ledger`` in local mode, in the global mode's fields (:func:`pipeline.serve.budget_view.ledger_overview`):
    users, users at the cap this epoch, reports refused past the cap (``capped_events``) or the budget
    (``budget_events``), and the distribution of spent epsilon."""
    import asyncio

    parts = await asyncio.gather(*(r.hgetall(keys.ledger_participation(p)) for p in range(partitions)))
    summaries = await asyncio.gather(*(r.hgetall(keys.ledger_summary(p)) for p in range(partitions)))
    limit = config.report_limit()
    spent: list[float] = []
    epsilon_of: dict[int, float] = {}  # users share few report counts: one conversion each
    at_cap = at_budget = 0
    for part in parts:
        for raw in part.values():
            rec = LedgerRecord.loads(raw)
            at_cap += rec.epoch == epoch and rec.k >= config.cap
            at_budget += limit is not None and rec.last_version >= limit
            if rec.last_version not in epsilon_of:
                epsilon_of[rec.last_version] = config.spent(rec.last_version)[0]
            spent.append(epsilon_of[rec.last_version])
    return {"users": sum(len(p) for p in parts), "users_at_cap": at_cap, "cap": config.cap,
            "capped_events": sum(int(s.get(b"dropped", b"0")) for s in summaries),
            "user_budget": None if limit is None else config.user_budget, "users_at_budget": at_budget,
            "budget_events": sum(int(s.get(b"over_budget", b"0")) for s in summaries), **spent_summary(spent)}


def local_budget(settings: Settings, config: LocalConfig, user: str | None, reports: int,
                 sent: int | None = None, record: bytes | str | None = None, epoch: int = 0) -> dict[str, Any]:
    """``/budget``'s local section: the devices' guarantee and the lifetime budget, and for a user what their
    reports cover (``sent``: the reports they sent, accepted or refused — :func:`budget_counter`; user level:
    ``record``, their public ledger record, and ``epoch``, the current one — :func:`local_user_budget`)."""
    limit = report_limit(config, settings.lifetime_budget)
    out: dict[str, Any] = {"guarantee": guarantee(config),
                           "user_budget": {"epsilon": None if limit is None else settings.lifetime_budget,
                                           "reports_allowed": limit}}  # None: no budget (JSON has no inf)
    if config.user_level:
        out["epoch"] = epoch
    if user is None:
        return out
    entry: dict[str, Any] = {"user": user, "reports": reports, "unit": "event"}
    if limit is not None and sent is not None:
        entry.update({"at_budget": sent >= limit, "not_learned_budget": max(0, sent - limit)})
    if config.user_level:
        entry = {**entry, **local_user_budget(config, user, record, epoch), "reports": reports}
    elif config.algorithm == "tree":
        entry["per_interaction"] = {"epsilon": config.epsilon, "delta": config.delta}
        entry["bound"] = (f"each of this user's {reports} interactions is ({config.epsilon:g}, {config.delta:g})-DP "
                          f"in their whole report stream (their device's mechanism); all of them together at group "
                          f"level {reports}")
    elif not config.shuffled:
        mu = gdp_mu(config.epsilon, config.delta)
        eps = gdp_epsilon(mu * reports ** 0.5, config.delta) if reports else 0.0
        entry["all_reports"] = {"epsilon": eps, "delta": config.delta}
        entry["bound"] = (f"{reports} Gaussian reports compose in Gaussian DP to mu = {mu:.3g} x sqrt({reports}): "
                          f"({eps:.4g}, {config.delta:g}) over all of them")
    else:
        e0 = config.epsilon0
        entry["all_reports"] = {"epsilon_local": e0 * reports, "delta": 0.0,
                                "central_per_batch": {"epsilon": config.epsilon, "delta": config.delta}}
        entry["bound"] = (f"each report is pure {e0:.4g}-LDP ({reports} reports: {e0 * reports:.4g} by basic "
                          f"composition); in the shuffled batches each is ({config.epsilon:g}, {config.delta:g})-DP "
                          f"centrally")
    out["user"] = entry
    return out


async def local_view(q: BudgetQuery) -> dict[str, Any]:
    """Local mode's part of ``/budget`` (a :class:`pipeline.serve.budget_view.BudgetQuery`): the devices' guarantee
    and lifetime budget (:func:`local_budget`), the user's (what their reports cover, in the global mode's fields),
    and at user level the devices' ledger (:func:`local_ledger_overview`); epochs on the devices' clock."""
    settings: Settings = q.app[SETTINGS]
    cfg: LocalConfig = q.app[LOCAL_CONFIG]
    epoch = cfg.epoch_at(time.time())
    out: dict[str, Any] = {}
    if q.user is None:
        out["local"] = local_budget(settings, cfg, None, 0, epoch=epoch)
    else:
        k = await user_interactions(q.r, q.keys, q.partitions, q.user)
        sent = await q.r.get(budget_counter(q.keys, q.user))
        record = await q.r.hget(q.keys.ledger_participation(partition_of(q.user, q.partitions)), q.user)
        out["local"] = local_budget(settings, cfg, q.user, k, sent=int(sent or 0), record=record, epoch=epoch)
        out["user"] = {"user": q.user, "interactions": k, **out["local"]["user"]}
    if cfg.user_level:  # the devices' ledger, in the global mode's fields
        out["ledger"] = await local_ledger_overview(q.r, q.keys, q.partitions, cfg, epoch)
    return out
