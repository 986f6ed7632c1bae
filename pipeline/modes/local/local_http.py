"""Local mode's HTTP side: ``GET /local/config``, ``POST /report``, and the refusal of raw rewards.

Serving code: it imports only public things (the catalog, the public key layout, the device
calibration of :mod:`models.local`), never the trusted store. A report is checked here as far as
the web process can (the schema, the user, the shown list it answers, one report per list) and
produced to ``ldp-reports``; the worker checks the version (:mod:`pipeline.modes.local.localmode`).

The lifetime budget (``user_budget``) in local mode: a device's reports compose, so a user may send at most
:func:`report_limit` of them; the server counts each user's reports (atomically, :func:`budget_counter`, a key
of the web's own ``recs`` kind, no expiry) and refuses the ones past the limit with 403 — refused, never
silently lost: the count minus the limit is the user's reports "not learned (budget)".
"""

from __future__ import annotations

import dataclasses

import json
import math
from typing import Any

import numpy as np
from aiohttp import web

from models.local import LocalConfig, ReportError, parse_report
from models.local.aggregate import clip_context

from ...serve.appkeys import CATALOG, KEYS, LOCAL_CONFIG, PRODUCER, REDIS, SETTINGS
from ...data.catalog import Catalog, UnknownUserError
from ...config.keys import PublicKeys
from ...serve.outbox import OUTBOX, accept
from ...data.records import TOPICS
from ...config.settings import Settings
from ...serve.shown import SHOWN

__all__ = ["add_routes", "refuse_raw_reward", "local_statement", "local_budget", "with_contexts", "RAW_REFUSED",
           "report_limit", "budget_counter"]

#: Why ``/feedback`` and ``/listen`` answer 400 in local mode.
RAW_REFUSED = ("this stack runs in local mode: the server never receives a raw reward. Build a noisy report on the "
               "device (models.local.LocalClient, or the web page) and POST it to /report; GET /local/config gives "
               "the calibration (docs/local-mode.md)")


def local_statement(config: LocalConfig) -> dict[str, Any]:
    """The privacy statement of a local-mode namespace (``/budget``, the serving models' meta)."""
    g = config.guarantee()
    return {"private": True, **g, "note": g["statement"], "mechanism": g.get("mechanism", g.get("noise")),
            "neighbours": "event level, replace-one, on the device: two report streams of one user differing in "
                          "the reward of one interaction (rewards in [0, 1], contexts clipped to norm 1)",
            "scope": "every report a device ever sends; the server's sums, models and recommendations are "
                     "post-processing"}


def _error(status: int, parameter: str | None, message: str) -> web.Response:
    return web.json_response({"error": {"parameter": parameter, "message": message}}, status=status)


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
    app.router.add_get("/local/config", config_view)
    app.router.add_post("/report", report)


def _config(request: web.Request) -> LocalConfig:
    cfg: LocalConfig = request.app[LOCAL_CONFIG]
    return cfg


def report_limit(config: LocalConfig, user_budget: float) -> int | None:
    """How many reports of one user stay within ``user_budget`` (epsilon at the device's delta); ``None``: no limit.

    Shuffled (pure ``epsilon0``-LDP reports): basic composition, ``k * epsilon0``. ``round``: independent
    Gaussian reports compose to ``mu * sqrt(k)``. ``tree``: a user's k interactions are covered at group level
    k: ``k * mu`` in Gaussian DP (``k * epsilon`` for a Laplace device mechanism).
    """
    from models.accounting.conversions import gdp_mu

    if not math.isfinite(user_budget):
        return None
    if config.shuffled:
        return math.floor(user_budget / config.epsilon0)
    if config.algorithm == "tree" and "laplace" in config.mechanism:
        return math.floor(user_budget / config.epsilon)
    ratio = gdp_mu(user_budget, config.delta) / gdp_mu(config.epsilon, config.delta)
    return math.floor(ratio if config.algorithm == "tree" else ratio**2)


def budget_counter(keys: PublicKeys, user: str) -> str:
    """The key counting one user's reports (accepted and refused), for the lifetime budget."""
    return keys.recommendation(f"reports:{user}")


async def config_view(request: web.Request) -> web.Response:
    """The devices' public calibration; ``{"mode": <mode>}`` alone outside local mode."""
    s: Settings = request.app[SETTINGS]
    if s.mode != "local":
        return web.json_response({"mode": s.mode})
    return web.json_response(_config(request).to_public())


async def report(request: web.Request) -> web.Response:
    s: Settings = request.app[SETTINGS]
    if s.mode != "local":
        return _error(400, None, f"this stack runs in {s.mode} mode: POST /report is for local mode; send feedback "
                                 f"to POST /feedback")
    cfg = _config(request)
    raw = await request.read()
    try:
        rep = parse_report(raw, d=cfg.d, algorithm=cfg.algorithm)
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


def local_budget(settings: Settings, config: LocalConfig, user: str | None, reports: int,
                 sent: int | None = None) -> dict[str, Any]:
    """``/budget``'s local section: the devices' guarantee and the lifetime budget, and for a user what their
    reports cover (``sent``: the reports they sent, accepted or refused — :func:`budget_counter`)."""
    from models.accounting.conversions import gdp_epsilon, gdp_mu

    limit = report_limit(config, settings.lifetime_budget)
    out: dict[str, Any] = {"guarantee": config.guarantee(),
                           "user_budget": {"epsilon": None if limit is None else settings.lifetime_budget,
                                           "reports_allowed": limit}}  # None: no budget (JSON has no inf)
    if user is None:
        return out
    entry: dict[str, Any] = {"user": user, "reports": reports, "unit": "event"}
    if limit is not None and sent is not None:
        entry.update({"at_budget": sent >= limit, "not_learned_budget": max(0, sent - limit)})
    if config.algorithm == "tree":
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
