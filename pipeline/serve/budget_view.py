"""What ``/budget``, ``/budget/history`` and ``/dashboard`` say at user level (public ledger keys only).

The release statement (in the served model's metadata) carries what a capped user gets per epoch
(``mu_at_cap``) and the table ``ratios[k - 1] = B(k) / B(cap)``; the ledger carries each user's
participations. A user's spent budget is ``mu_at_cap * sqrt(past + B(k) / B(cap))``, converted to
``(epsilon, delta)`` (:func:`pipeline.state.userlevel.spent_mu`); the statement's ``user_budget`` bounds it for life
(:class:`pipeline.config.ledger.LifetimeBudget`). Nothing here reads a trusted key (:func:`serving_isolation` asks
Redis whether it could).

``/budget``'s mode-specific part is a *view* per trust mode, ``view(query) -> fields`` over one
:class:`BudgetQuery`: :func:`global_view` here, the federated and the local ones beside their modes
(:func:`pipeline.modes.federated.federated_serving.federated_view`, :func:`pipeline.modes.local.local_http.local_view`);
the web app plugs them in by mode (``pipeline.apps.web.BUDGET_VIEWS``).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from models.accounting import DpEvent, gdp_epsilon, group_guarantee

from ..config.keys import PublicKeys, partition_of
from ..config.settings import Settings
from ..config.ledger import LedgerRecord, LifetimeBudget, class_counts, spent_mu, weighted_upper_median

__all__ = ["BudgetQuery", "global_view", "user_view", "ratio_of", "user_budget", "user_interactions", "learning", "ledger_overview", "spent_summary",
           "release_history", "serving_isolation"]


@dataclass(frozen=True)
class BudgetQuery:
    """One ``GET /budget[?user=U]``, as every mode's view reads it.

    ``r``: the (web role's) async Redis client; ``app``: the web application (a mode's own keys: the site router,
    the local calibration); ``keys``: the served model's public keys; ``statement`` and ``event``: the served
    release's privacy statement and accounting event; ``epoch``: the served release's epoch; ``user``: the user
    asked about (already authorized and known to the catalog), or ``None``; ``figures``: whether participation
    figures (exact counts, the ledger) may be answered (always under replace; the operator only under add/remove);
    ``settings`` and ``recommender``: the server's settings and what serves users (federated: the site router), so
    a mode's view needs no app keys of its own.
    """

    r: Any
    app: Mapping[Any, Any]
    partitions: int
    delta: float
    keys: PublicKeys
    statement: dict[str, Any]
    event: DpEvent
    epoch: int
    user: str | None
    figures: bool
    settings: Settings
    recommender: Any


async def user_view(q: BudgetQuery, keys: PublicKeys, epoch: int) -> dict[str, Any]:
    """``/budget?user=``'s ``user`` in global and federated mode, from the ledger under ``keys`` (the user's site's
    in federated mode) at ``epoch``: user level, their spent budget (:func:`user_budget`); event level, group
    privacy over their ``k`` interactions so far."""
    assert q.user is not None
    k = await user_interactions(q.r, keys, q.partitions, q.user)
    if q.statement.get("unit") == "user":
        return {**await user_budget(q.r, keys, q.partitions, q.user, q.statement, epoch), "interactions": k}
    g = group_guarantee(q.event, k, q.delta)
    return {"user": q.user, "interactions": k, "unit": "event",
            "epsilon": g.epsilon if math.isfinite(g.epsilon) else None, "delta": g.delta, "valid": g.valid,
            "note": g.note, "bound": "group privacy over all of this user's interactions so far (k times one "
                                     "interaction's sensitivity)"}


async def global_view(q: BudgetQuery) -> dict[str, Any]:
    """Global mode's part of ``/budget``: the user's guarantee (:func:`user_view`) and, at user level, the ledger's
    overview (:func:`ledger_overview`) when figures may be answered."""
    out: dict[str, Any] = {}
    if q.user is not None:
        out["user"] = await user_view(q, q.keys, q.epoch)
    if q.statement.get("unit") == "user" and q.figures:
        out["ledger"] = await ledger_overview(q.r, q.keys, q.partitions, q.statement, q.epoch)
    return out


def ratio_of(statement: dict[str, Any]) -> Any:
    """``k -> B(k) / B(cap)`` from the statement's public table (``None`` without noise)."""
    table = statement.get("ratios")
    if not statement.get("private") or not table:
        return None

    def ratio(k: int) -> float:
        return float(table[min(max(k, 1), len(table)) - 1])
    return ratio


def _epsilon(mu: float, delta: float) -> float | None:
    if mu <= 0:
        return 0.0
    e = gdp_epsilon(mu, delta)
    return e if math.isfinite(e) else None


async def user_interactions(r: Any, keys: PublicKeys, partitions: int, user: str) -> int:
    """``/budget?user=``'s ``interactions``: the user's counted events or reports, summed over the partitions'
    public ``ledger_users`` hashes. Written by the ingest (events, and local mode's reports without a shuffler)
    and, in local mode with a shuffler, by the shuffler (reports it accepted; the analyzer's batches name no
    user): :mod:`pipeline.modes.local.shuffler_service`."""
    counts = await asyncio.gather(*(r.hget(keys.ledger_users(p), user) for p in range(partitions)))
    return sum(int(c) for c in counts if c is not None)


async def user_budget(r: Any, keys: PublicKeys, partitions: int, user: str, statement: dict[str, Any],
                      epoch: int) -> dict[str, Any]:
    """One user's participations, cap and spent budget (user level): their one ledger record, in their partition
    (ingest counts a user's events in that partition only, :func:`pipeline.config.keys.partition_of`)."""
    raw = await r.hget(keys.ledger_participation(partition_of(user, partitions)), user)
    cap = int(statement.get("cap", 0))
    ratio = ratio_of(statement)
    rec = LedgerRecord.loads(raw).at(epoch, ratio or (lambda k: 1.0))
    delta = float(statement.get("delta", 0.0) or 0.0)
    out: dict[str, Any] = {"user": user, "unit": "user", "ticks_this_epoch": rec.k, "cap": cap,
                           "at_cap": rec.k >= cap, "epoch": epoch, "cap_policy": statement.get("cap_policy")}
    if ratio is None or not statement.get("mu_at_cap"):
        out.update({"epsilon": None if (rec.k or rec.past) else 0.0, "delta": delta, "valid": False,
                    "note": "no noise: nothing is protected" if not statement.get("private") else "unknown"})
        return out
    mu = spent_mu(rec, epoch, float(statement["mu_at_cap"]), ratio)
    budget = LifetimeBudget.of(statement, ratio)
    if budget is not None:  # the lifetime budget: whether this user is still learned from
        out.update({"user_budget": budget.epsilon, "at_budget": budget.exhausted(rec, epoch),
                    "budget_left": max(0.0, budget.epsilon - (_epsilon(mu, delta) or math.inf))})
    out.update({"epsilon": _epsilon(mu, delta), "delta": delta, "valid": bool(statement.get("valid", True)),
                "mu": mu, "bound": "user level: every release of every epoch, all of this user's contributions "
                                   "(multi-participation sensitivity of the mechanism; epochs compose in Gaussian DP)",
                "remaining_ticks": max(0, cap - rec.k)})
    return out


#: ``learning`` when nothing stops the server from learning (event level, or no user-level statement yet)
LEARNED: dict[str, Any] = {"learned": True, "reason": None, "cap": None, "ticks_this_epoch": None, "epoch": None,
                           "epoch_releases_left": None, "epoch_seconds_left_at_least": None}


async def learning(r: Any, keys: PublicKeys, partitions: int, user: str, statement: dict[str, Any], *,
                   tree_ticks: int, tick_seconds: float) -> dict[str, Any]:
    """Whether an interaction of ``user`` sent now will be learned from, and why not: the ``learning`` field of
    ``/feedback``'s and ``/listen``'s answers (the caller's own view; nothing here goes into a public view).

    The release that will fold the interaction is the next one, version ``released + 1``, of epoch
    ``released // tree_ticks``; its fold (:meth:`pipeline.state.userlevel.Folder._plan`) drops the user's
    contribution when their ledger record of that epoch is at the cap (``reason`` ``"cap"``: until the epoch ends)
    or when one more tick would take them past their lifetime budget (``"budget"``). Both are read from the
    public ledger and the released version, never from the interaction itself: the answer is the same whatever
    was chosen or rewarded.

    A prediction as of now: an earlier interaction of the user still waiting for its release tick can bring the
    user to the cap first, and then this one is not learned although ``learned`` said it would be.

    The epoch ends after ``epoch_releases_left`` more releases. A release happens at most once every
    ``tick_seconds`` and only when something changed, so ``epoch_seconds_left_at_least`` is a lower bound, not a
    date.

    Examples
    --------
    >>> import asyncio
    >>> class R:  # released version 10; user "7" took part in 2 ticks of epoch 1 (versions 8..14)
    ...     async def hget(self, key, field):
    ...         return b"10" if ":released:" in key else b'{"epoch": 1, "k": 2, "last_version": 9}'
    >>> statement = {"unit": "user", "cap": 2, "private": False}
    >>> out = asyncio.run(learning(R(), PublicKeys("ns"), 1, "7", statement, tree_ticks=7, tick_seconds=0.5))
    >>> out["learned"], out["reason"], out["epoch"], out["epoch_releases_left"], out["epoch_seconds_left_at_least"]
    (False, 'cap', 1, 4, 2.0)
    """
    if statement.get("unit") != "user":
        return dict(LEARNED)
    released_raw, raw = await asyncio.gather(
        r.hget(keys.released, "version"), r.hget(keys.ledger_participation(partition_of(user, partitions)), user))
    released = int(released_raw or 0)
    epoch = released // tree_ticks  # the epoch of release released + 1, the one that folds this interaction
    ratio = ratio_of(statement)
    rec = LedgerRecord.loads(raw).at(epoch, ratio or (lambda k: 1.0))
    cap = int(statement.get("cap", 0))
    budget = LifetimeBudget.of(statement, ratio)
    reason = None
    if 0 < cap <= rec.k:
        reason = "cap"
    elif budget is not None and not budget.allows(rec, epoch):
        reason = "budget"
    left = (epoch + 1) * tree_ticks - released
    return {"learned": reason is None, "reason": reason, "cap": cap, "ticks_this_epoch": rec.k, "epoch": epoch,
            "epoch_releases_left": left, "epoch_seconds_left_at_least": left * tick_seconds}


async def ledger_overview(r: Any, keys: PublicKeys, partitions: int, statement: dict[str, Any],
                          epoch: int) -> dict[str, Any]:
    """Users, users at the cap, capped events, and the distribution of spent epsilon."""
    ratio = ratio_of(statement)
    cap = int(statement.get("cap", 0))
    delta = float(statement.get("delta", 0.0) or 0.0)
    mu_cap = statement.get("mu_at_cap")
    kept = await asyncio.gather(*(r.hgetall(keys.ledger_classes(p)) for p in range(partitions)))
    summaries = await asyncio.gather(*(r.hgetall(keys.ledger_summary(p)) for p in range(partitions)))
    classes: Counter[str] = Counter()
    for p, part in enumerate(kept):  # the fold's class counts, else (before them) the partition's records counted
        if part:
            classes.update({name.decode(): int(n) for name, n in part.items() if int(n)})
        else:
            classes.update(class_counts(await r.hvals(keys.ledger_participation(p))))
    spent: Counter[float] = Counter()
    at_cap = at_budget = 0
    budget = LifetimeBudget.of(statement, ratio)
    for name, n in classes.items():  # a user's figures depend only on their record's class: once per class
        rec = LedgerRecord.of_class(name).at(epoch, ratio or (lambda k: 1.0))
        if rec.k >= cap > 0:
            at_cap += n
        if budget is not None and budget.exhausted(rec, epoch):
            at_budget += n
        if ratio is not None and mu_cap:
            e = _epsilon(spent_mu(rec, epoch, float(mu_cap), ratio), delta)
            spent[math.inf if e is None else e] += n
    return {"users": sum(classes.values()), "users_at_cap": at_cap, "cap": cap,
            "capped_events": sum(int(s.get(b"dropped", b"0")) for s in summaries),
            "user_budget": None if budget is None else budget.epsilon, "users_at_budget": at_budget,
            "budget_events": sum(int(s.get(b"over_budget", b"0")) for s in summaries), **spent_summary(spent)}


def spent_summary(spent: list[float] | Counter[float]) -> dict[str, Any]:
    """``spent_max``, ``spent_median`` and ``spent_histogram`` (10 bins) of the users' spent epsilons (the finite
    ones): a list with one value per user, or a ``Counter`` of users per value (local mode's ledger overview uses
    it too).

    >>> spent_summary([1.0, 1.0, 3.0]) == spent_summary(Counter({1.0: 2, 3.0: 1}))
    True
    """
    counted = spent if isinstance(spent, Counter) else Counter(spent)
    finite = sorted((v, n) for v, n in counted.items() if math.isfinite(v) and n > 0)
    edges = _edges([v for v, _ in finite])
    counts = [0] * (len(edges) - 1)
    for v, n in finite:
        i = min(len(counts) - 1, max(0, next((j for j in range(len(counts)) if v < edges[j + 1]), len(counts) - 1)))
        counts[i] += n
    return {"spent_max": finite[-1][0] if finite else 0.0, "spent_median": weighted_upper_median(finite),
            "spent_histogram": {"edges": edges, "counts": counts}}


def _edges(values: list[float], bins: int = 10) -> list[float]:
    hi = max(values) if values else 1.0
    hi = hi if hi > 0 else 1.0
    return [round(hi * i / bins, 6) for i in range(bins + 1)]


async def release_history(r: Any, keys: PublicKeys, count: int = 500, *, exact: bool = True
                          ) -> list[dict[str, Any]]:
    """Per release: time (``at_ms``), version, events covered and the ledger summary (user level), oldest first.

    Under the add/remove relation the released log holds the release's noisy count and no ledger; ``exact`` then
    takes the count and the ledger from the operator's figures (``keys.release_figures_log``), for the operator's
    eyes only. Under replace the released log holds the exact figures (public there) either way.
    """
    figures: dict[int, dict[bytes, bytes]] = {}
    if exact:
        for _, fields in await r.xrevrange(keys.release_figures_log, count=count):
            figures[int(fields[b"version"])] = fields
    out = []
    for entry_id, fields in await r.xrevrange(keys.released_log, count=count):
        version = int(fields[b"version"])
        fields = {**fields, **figures.get(version, {})}
        ledger = fields.get(b"ledger") or b""
        entry: dict[str, Any] = {"version": version, "count": int(fields.get(b"count", b"0")),
                                 "at_ms": int(entry_id.split(b"-")[0])}
        if ledger:
            entry["ledger"] = json.loads(ledger)
        out.append(entry)
    out.reverse()
    return out


async def serving_isolation(r: Any, namespace: str) -> dict[str, Any]:
    """Whether Redis refuses this (web) process the trusted key kinds: asked of Redis itself, not of a setting.

    ``EXISTS`` on a key of the ``trusted`` kind answers NOPERM when the process's Redis user is the ``web`` role
    of :mod:`pipeline.config.acl`; an answer means serving could read the exact statistics and the noise seeds.
    """
    import redis

    try:
        await r.exists(f"{namespace}:trusted:acl-check")
    except redis.exceptions.NoPermissionError:
        return {"enforced": True, "note": "Redis refuses this server every trusted key (its own ACL user)"}
    return {"enforced": False, "note": "NOT ENFORCED: this server's Redis user can read trusted state (the stack "
                                       "runs without ACL users, `privrec up --no-acl`); only code review keeps "
                                       "serving from it"}
