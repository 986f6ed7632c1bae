"""Serving in the federated mode: each user is served by their site's model, feedback goes to their site.

Star: everyone is served from the coordinator's model (``<ns>:model:*``). Decentralized: a user of
site ``i`` is served from site ``i``'s own view (``<ns>-site<i>:model:*``). Either way ``/feedback``
goes to the user's site's own topic, so no other site ever receives the raw event. Only public keys
are read (``model``, ``released``, ``ledger``), as in global mode.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from models.streaming.federated import assign_sites

from ...data.catalog import Catalog, UnknownUserError
from .federation import site_namespace, site_topic
from ...config.keys import PublicKeys
from ...data.records import TOPICS
from ...serve.budget_view import BudgetQuery, ledger_overview, user_view
from ...serve.serving import BadRequest, Recommender
from ...config.settings import Settings

__all__ = ["SiteRouter", "model_namespaces", "interactions_topic", "federated_budget", "site_epoch", "federated_view"]


def model_namespaces(settings: Settings) -> list[str]:
    """The namespaces whose serving models users are served from (one, or one per site)."""
    if settings.mode != "federated" or settings.topology == "star":
        return [settings.namespace]
    return [site_namespace(settings.namespace, i) for i in range(settings.sites)]


def interactions_topic(settings: Settings, catalog: Catalog, user: str) -> str:
    """Where a user's feedback goes: ``interactions``, or their site's own topic."""
    if settings.mode != "federated":
        return TOPICS["interactions"]
    site = int(assign_sites(catalog.n_units, settings.sites)[catalog.unit_of(user)])
    return site_topic(site)


class SiteRouter:
    """A :class:`~pipeline.serve.serving.Recommender` per serving namespace; each user goes to their site's."""

    def __init__(self, client: redis.Redis, settings: Settings, catalog: Catalog, *, meta_ttl: float = 0.0) -> None:
        self.settings, self.catalog = settings, catalog
        self.site_of_unit = assign_sites(catalog.n_units, settings.sites)
        self.star = settings.topology == "star"
        self.recommenders = [Recommender(client, ns, catalog, meta_ttl=meta_ttl) for ns in model_namespaces(settings)]

    def site_of(self, user: str) -> int:
        return int(self.site_of_unit[self.catalog.unit_of(user)])

    def _for(self, user: str) -> tuple[int, Recommender]:
        if not isinstance(user, str) or not user:
            raise BadRequest("user", "must be a non-empty user id")
        try:
            site = self.site_of(user)
        except UnknownUserError as exc:
            raise BadRequest("user", str(exc)) from None
        return site, self.recommenders[0 if self.star else site]

    def recommend(self, user: str, candidates: Sequence[str] | None = None, k: int = 10) -> dict[str, Any]:
        site, rec = self._for(user)
        out = rec.recommend(user, candidates, k)
        out["site"] = site
        return out

    def meta(self) -> dict[str, str]:
        return self.recommenders[0].meta()


async def site_epoch(r: Any, settings: Settings, site: int) -> int:
    """The epoch of site ``site``'s own release clock (its ledger's epochs): the served version is not it (star: the
    sum of the sites' versions; decentralized: the consensus round)."""
    released = await r.hget(PublicKeys(site_namespace(settings.namespace, site)).released, "version")
    return (max(1, int(released or 0)) - 1) // settings.tree_ticks


async def federated_budget(r: Any, settings: Settings, statement: dict[str, Any] | None = None) -> dict[str, Any]:
    """The mode, the topology and each serving namespace's model and statement (for ``/budget``).

    At user level (``statement["unit"] == "user"``) each site's entry also carries its ledger's overview (users,
    users at the cap and at the budget, spent epsilon; :func:`pipeline.serve.budget_view.ledger_overview`): a user
    belongs to one site, so the ledgers are disjoint.
    """
    sites: list[dict[str, Any]] = []
    for i in range(settings.sites):
        keys = PublicKeys(site_namespace(settings.namespace, i))
        released = await r.hget(keys.released, "version")
        count = await r.hget(keys.released, "count")
        entry: dict[str, Any] = {"site": i, "releases": None if released is None else int(released),
                                 "events_released": None if count is None else int(count),
                                 "topic": site_topic(i)}
        if settings.topology != "star":
            meta = await r.hgetall(keys.model_meta)
            if meta:
                entry["view_round"] = int(meta[b"version"])
                entry["privacy"] = json.loads(meta.get(b"privacy", b"{}"))
        if statement is not None and statement.get("unit") == "user":
            entry["ledger"] = await ledger_overview(r, keys, settings.partitions, statement,
                                                    await site_epoch(r, settings, i))
        sites.append(entry)
    return {"mode": "federated", "topology": settings.topology, "schedule": settings.fed_schedule,
            "sites": sites}


async def federated_view(q: BudgetQuery) -> dict[str, Any]:
    """Federated mode's part of ``/budget`` (a :class:`pipeline.serve.budget_view.BudgetQuery`): every site's
    ledger and statement (:func:`federated_budget`), and the user's guarantee counted at their own site, on its
    release clock (:func:`pipeline.serve.budget_view.user_view`)."""
    settings = q.settings
    out: dict[str, Any] = {"federated": await federated_budget(q.r, settings, q.statement)}
    if q.user is not None:
        site = q.recommender.site_of(q.user)
        keys = PublicKeys(site_namespace(settings.namespace, site))
        out["user"] = await user_view(q, keys, await site_epoch(q.r, settings, site))
    return out
