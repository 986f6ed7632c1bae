"""The privacy statements of global and federated mode's releases (``/budget``'s ``privacy``, the served model's meta).

What each released statistic is, its clip and sensitivity, the neighbouring relation, the guarantee and its scope:
for the flat model (:func:`privacy_statement`, with the item sums :func:`_composed_statement`, at user level
:func:`user_level_statement`), the hierarchy (:func:`hierarchy_statement`) and the other papers' per-unit baselines
(:func:`_baseline_statement`). The release stage (:mod:`pipeline.release.stages`) computes its statement once and
stores it with every release.

Each statement also carries ``statement`` and ``plain``, rendered from its :class:`~models.accounting.statement.
StatementFacts` (:func:`flat_facts`, :func:`hierarchy_facts`, :func:`baseline_facts`) by the one renderer of
:mod:`models.accounting.statement`; the page and the dashboard show these instead of writing their own.
"""

from __future__ import annotations

import math
from typing import Any

from models.accounting import GDPAccountant, describe
from models.accounting.statement import Party, Plain, StatementFacts, render, render_plain
from models.mechanisms import MECHANISMS, Mechanism
from models.mechanisms.participation import replace_sensitivity
from models.policies.dgs import DGSLinUCB, DGSTreeMechanism, first_positive_lambda_prime
from models.policies.jdp_linucb import SSLinUCB
from models.policies.peruser import PerUserLinUCB
from models.streaming.hierarchy import HierarchyLayout

from ..config.settings import Settings

__all__ = ["privacy_statement", "hierarchy_statement", "user_level_statement", "released_statistics",
           "EVENT_NEIGHBOURS", "USER_NEIGHBOURS", "PUBLIC_AND_PROTECTED", "ADD_REMOVE_PUBLIC_AND_PROTECTED",
           "HIERARCHY_ADD_REMOVE", "HIERARCHY_NEIGHBOURS", "HIERARCHY_MECHANISM", "ITEM_MECHANISM", "BASELINE_ABOUT",
           "flat_facts", "hierarchy_facts", "baseline_facts", "rendered", "SERVER"]

#: The hierarchy's mechanism (one release of its weighted blocks).
HIERARCHY_MECHANISM = "blt-exact"
#: The item sums' mechanism (sensitivity 1 per interaction; exact Gaussian-DP accounting).
ITEM_MECHANISM = "blt-exact"

#: The trusted party of global mode: the server that receives the raw feedback and adds the noise.
SERVER = Party("this server's operator", "none: the server receives every raw interaction and adds the noise "
                                         "itself (the trusted curator)")
#: What stays exact and public beside the noisy statistics under the replace relation.
_EXACT = "the Gram matrices and counts are exact (public: they never depend on a choice)"


def rendered(facts: StatementFacts) -> dict[str, str]:
    """A statement's ``statement`` (:func:`~models.accounting.statement.render`) and ``plain``
    (:func:`~models.accounting.statement.render_plain`) fields."""
    assert facts.plain is not None
    return {"statement": render(facts), "plain": render_plain(facts.plain)}


def _user_scope(settings: Settings) -> tuple[str, str, str]:
    """``(scope, composition, limit)`` of a user-level statement: the epoch and cap, how epochs compose, and what
    stops learning from a user (the cap policy within an epoch, the ledger's lifetime budget across them)."""
    s = settings
    budget = s.lifetime_budget
    return (f"per epoch of {s.tree_ticks} release ticks, for all of one user's contributions (up to {s.user_cap} "
            f"ticks, each tick's interactions summed and clipped)",
            "epochs compose (Gaussian DP: mu adds in quadrature); a user with k < cap ticks spends mu sqrt(B(k)/B(cap))",
            f"a user at the cap is not learned from for the rest of the epoch (cap policy: {s.cap_policy})"
            + (f"; the ledger stops learning from a user before they would exceed epsilon {budget:g} over their "
               f"lifetime (user_budget)" if math.isfinite(budget) else ""))


def hierarchy_facts(settings: Settings, layout: HierarchyLayout, epsilon: float, delta: float) -> StatementFacts:
    """The hierarchy's facts: its blocks through one release at ``(epsilon, delta)`` per capped user and epoch
    (``epsilon`` inf: no noise), under the relation in force (add/remove: the count through the pool's noise)."""
    blocks = ", ".join(layout.blocks)
    counts = ("the count through the pool block's noise" if settings.add_remove else
              "the counts exact (public: arrivals)")
    release = (f"the hierarchy's blocks ({blocks}), each with its share of mu**2, through one release of "
               f"'{HIERARCHY_MECHANISM}' are ({epsilon:.4g}, {delta:g})-DP under {settings.relation}; {counts}"
               if math.isfinite(epsilon) else
               f"the hierarchy's blocks ({blocks}) are released without noise: nothing is protected (epsilon = inf)")
    scope, composition, limit = _user_scope(settings)
    return StatementFacts(release=release, parties=(SERVER,), composition=composition, scope=scope, limit=limit,
                          plain=_plain(settings, epsilon, delta, user_level=True))


def baseline_facts(settings: Settings, policy: PerUserLinUCB, epsilon: float, delta: float) -> StatementFacts:
    """A per-unit baseline's facts: each unit's model through its own tree; S&S's joint DP covers contexts too, DGS's
    ``(epsilon, delta)`` is the paper's claim, not a valid guarantee (``epsilon`` inf: no noise)."""
    name = settings.baseline or ""
    if not math.isfinite(epsilon):
        release, claim = "each unit's model is released without noise: nothing is protected (epsilon = inf)", ""
    elif isinstance(policy, SSLinUCB):
        release = (f"each unit's model through its own tree ({name}) is ({epsilon:.4g}, {delta:g}) joint DP in each "
                   f"interaction's context and reward")
        claim = ""
    else:
        release = (f"each unit's model through its own tree ({name}) claims ({epsilon:.4g}, {delta:g})-DP in one "
                   f"reward: NOT a valid DP guarantee (spec tree-dp B.5)")
        claim = "This ε is the paper's claim, not a valid bound."
    composition = ("each interaction enters only its own unit's tree (parallel composition over units); a user with k "
                   "interactions is covered at group level k")
    return StatementFacts(release=release, parties=(SERVER,), composition=composition,
                          plain=_plain(settings, epsilon, delta, user_level=False, total=claim))


def _plain(settings: Settings, epsilon: float, delta: float, *, user_level: bool, federated: bool = False,
           total: str = "") -> Plain:
    """The page's words for a global or federated release: where the answers stay, and what the bound covers under
    the relation in force (add/remove: taking part at all; replace: the answers, arrivals public)."""
    add_remove = settings.add_remove
    where = ("Your listens and skips stay at your site; only its noisy statistics leave it, and the recommendations "
             "are computed from those." if federated else
             "Your listens and skips stay inside the server; only noisy statistics are published"
             + (", on a fixed schedule," if add_remove else ",") + " and the recommendations are computed from those.")
    if add_remove:
        covers = ("everything you do in an epoch — whether you took part at all, and whatever you listened to, "
                  "skipped or picked")
        end = "Only you (with your token) and the operator see your own figures below."
    elif user_level:
        covers = "everything you do in an epoch — whatever you listened to, skipped or picked"
        end = "The ε above adds up your epochs; that you came, and when, is public."
    else:
        covers = ("any one answer you give — whether you listened or skipped, and whichever of the shown items you "
                  "picked")
        end = "The ε above adds this up over all your answers; that you came, and when, is public."
    return Plain(where=where, covers=covers, observer="the published results", epsilon=epsilon, delta=delta,
                 total=" ".join(t for t in (total, end) if t))


def flat_facts(settings: Settings, epsilon: float, delta: float, *, user_level: bool, items: bool = False,
               federated: bool = False) -> StatementFacts:
    """The flat model's facts: ``b`` (and with ``items`` the item sums) through noise at ``(epsilon, delta)``
    (``epsilon`` inf: no noise), at event or ``user_level``; ``federated``: released by the user's site, whose
    coordinator and other sites see only its releases."""
    noised, verb = ("b and the item reward sums", "are") if items else ("b", "is")
    mechanism = f"'{settings.mechanism}'" + (f" and '{ITEM_MECHANISM}'" if items else "")
    if math.isfinite(epsilon):
        release = f"{noised} through {mechanism} {verb} ({epsilon:.4g}, {delta:g})-DP; {_EXACT}"
    else:
        release = f"{noised} {verb} released without noise: nothing is protected (epsilon = inf)"
    parties: tuple[Party, ...] = (SERVER,)
    if federated:
        parties = (Party("your site", "none: it sees its own users' raw feedback and adds the noise"),
                   Party("the coordinator and the other sites", "the site's guarantee: they see only its releases "
                         "(mixing them is post-processing)"))
    scope, composition, limit = _user_scope(settings) if user_level else (
        "", "every release ever published" + (" by a site" if federated else " from this namespace")
        + ", per interaction; a user with k interactions is covered at group level k", "")
    if federated:
        composition += "; a user belongs to one site (a public rule), so their data touch that site's releases only"
    return StatementFacts(release=release, parties=parties, composition=composition, scope=scope, limit=limit,
                          plain=_plain(settings, epsilon, delta, user_level=user_level, federated=federated))


def privacy_statement(settings: Settings, mechanism: Mechanism | None,
                      baseline: PerUserLinUCB | None = None, items: Mechanism | None = None) -> dict[str, Any]:
    """What the released statistics guarantee, stated plainly (``baseline``: the ss-*/dgs-* policy).

    ``items``: the item sums' mechanism, released beside the bandit statistic; the two compose exactly
    in Gaussian DP and the statement gives the total and the split.
    """
    if baseline is not None:
        return _baseline_statement(settings, baseline)
    if mechanism is None:
        return {"private": False, "guarantee": "none: epsilon = inf, statistics are released without noise",
                "statistics": released_statistics(settings, None, None), **PUBLIC_AND_PROTECTED,
                **rendered(flat_facts(settings, math.inf, settings.delta, user_level=False,
                                      items=settings.item_term)),
                **({"item_term": {"weight": settings.item_term_weight, "released": "item reward sums, without noise"}}
                   if settings.item_term else {})}
    if items is not None:
        return _composed_statement(settings, mechanism, items)
    g = describe(mechanism.event, settings.delta)
    return {
        "private": True,
        "mechanism": settings.mechanism,
        "mechanism_about": MECHANISMS[settings.mechanism],
        "epsilon": g.epsilon,
        "delta": g.delta,
        "valid": g.valid,
        "note": g.note,
        "neighbours": EVENT_NEIGHBOURS,
        "scope": "every release ever published from this namespace, per interaction; a user with k "
                 "interactions is covered at group level k",
        "statistics": released_statistics(settings, mechanism, None),
        **PUBLIC_AND_PROTECTED,
        **rendered(flat_facts(settings, g.epsilon, g.delta, user_level=False)),
    }


#: The event-level relation the calibration covers (one interaction replaced: its reward and the user's choice).
EVENT_NEIGHBOURS = ("event level, replace-one: two streams differing in one interaction's reward and in the user's "
                    "choice (which shown item they acted on, which item they listened to); who arrived when and "
                    "which items were shown are the same (public)")
#: The user-level relation.
USER_NEIGHBOURS = ("user level, replace: two streams differing in everything one user contributed — their rewards "
                   "and their choices (which shown item they acted on, which items they listened to); who arrived "
                   "when and which items were shown to them are the same (public); at most `user_cap` release "
                   "ticks per epoch per user, each user's interactions of one tick summed and clipped")
#: What is public and what is protected, in plain words (/budget, the page, the README say the same).
PUBLIC_AND_PROTECTED = {
    "protected": ["the reward of every interaction (click or skip, listen)",
                  "which of the shown items a user acted on",
                  "which items a user listened to of their own accord (organic listens)"],
    "public": ["which user arrived and when (the ledger of participations, the event counts)",
               "which items were shown to whom (the shown lists: a function of released models and the request)",
               "the item catalog and its features, and each user's model unit (a public rule)",
               "the Gram matrices: sums of x x^T over the items of every answered shown list — never the item the "
               "user chose; an organic listen adds nothing to them"],
}


def released_statistics(settings: Settings, mechanism: Mechanism | None, items: Mechanism | None,
                        ratio: Any = None) -> list[dict[str, Any]]:
    """What each released statistic is, its clip and its per-tick sensitivity under the stated relation.

    ``ratio`` (user level): the participation bound ``k -> B(k)/B(cap)``; each noisy statistic then also says
    what a capped user spends on it per epoch (``mu_at_cap``).
    """
    from models.accounting import gdp_mu

    b_clip, item_clip = settings.clips
    unit = "a user's tick" if settings.user_level else "an interaction"
    out: list[dict[str, Any]] = []
    for name, mech, clip, signed, about in (
            ("b", mechanism, b_clip, True, "per model unit, sum of r x (the reward-weighted contexts of the items "
                                           "the user acted on or listened to), mixed by the public V"),
            ("items", items, item_clip, False, "per catalog item, the sum of its rewards (the item term)")):
        if name == "items" and not settings.item_term:
            continue
        entry: dict[str, Any] = {
            "name": name, "what": about, "released": "through noise" if mech is not None else "without noise",
            "clip": clip, "clip_of": f"the L2 norm of {unit}'s contribution",
            "sensitivity_per_tick": replace_sensitivity(clip, signed=signed),
            "sensitivity_rule": ("2 x clip: two replacing contributions of any sign" if signed else
                                 "sqrt(2) x clip: two replacing nonnegative contributions")}
        if mech is not None:
            g = describe(mech.event, settings.delta)
            entry["epsilon"] = g.epsilon
            entry["mu"] = gdp_mu(g.epsilon, settings.delta) if math.isfinite(g.epsilon) else math.inf
            if ratio is not None:
                entry["mu_at_cap"] = entry["mu"]
        out.append(entry)
    out.append({"name": "gram", "what": "per model unit, sum of x x^T over every item of every answered shown list",
                "released": "exactly (public: it depends only on which items were shown, never on the choice)"})
    out.append({"name": "count", "what": "interactions per model unit", "released": "exactly (public: arrivals)"})
    return out


#: The relation the hierarchy's release is calibrated under (its contributions are means, not sums).
#: What stays public under the add/remove relation (the hierarchy in global mode): nothing that depends on whether a
#: user took part, but through noise. The protected list is :data:`PUBLIC_AND_PROTECTED`'s with participation added.
ADD_REMOVE_PUBLIC_AND_PROTECTED = {
    "protected": ["whether a user took part at all in an epoch: their arrivals, how many interactions they made, "
                  "whether they reached the cap"] + PUBLIC_AND_PROTECTED["protected"],
    "public": ["the item catalog and its features, and each user's model unit (a public rule on the user's id)",
               "the release schedule: one release per tick whatever arrived, a new epoch every `tree_ticks` ticks",
               "the mechanism, its noise scale and the settings (epsilon, delta, cap, lifetime budget, shares)",
               "to the user alone (their token): their own recommendations, shown lists and spent budget",
               "to the operator alone (the operator token): the exact counts, ingest offsets, the ledger's figures "
               "and dead letters — participation data, not calibrated"],
}

#: The add/remove relation of the hierarchy (the default in global mode).
HIERARCHY_ADD_REMOVE = ("user level, add/remove: two streams differing in everything one user did in an epoch, "
                        "taking part at all included — present with any events or absent; the noise is calibrated "
                        "to the larger of this difference (a contribution's norm, 1 per block) and the replace one "
                        "(sqrt 2), so the same (epsilon, delta) also holds between two versions of one user's "
                        "history with the same arrivals; at most `user_cap` release ticks per epoch per user; in "
                        "each, the user's listens become one contribution: their mean context and their share of "
                        "each item, weighted by min(1, total reward)")

HIERARCHY_NEIGHBOURS = ("user level, replace: two streams differing in everything one user contributed — their "
                        "rewards and their choices (which shown item they acted on, which items they listened to); "
                        "who arrived when and which items were shown to them are the same (public); at most "
                        "`user_cap` release ticks per epoch per user; in each, the user's listens become one "
                        "contribution: their mean context and their share of each item, weighted by min(1, total "
                        "reward)")


def hierarchy_statement(settings: Settings, mechanism: Mechanism | None, layout: HierarchyLayout,
                        ratio: Any) -> dict[str, Any]:
    """What the hierarchy's release guarantees, stated plainly (user level; its blocks and their shares)."""
    from models.accounting import gdp_mu

    s = settings
    blocks = []
    about = {"pool": "the pooled block: every user's mean listened context and count, summed (d + 1 values)",
             "items": "the item counts: every user's share of each item they listened to, summed (one per item)",
             "units": "each unit's block: its users' mean listened contexts and count, summed (d + 1 per unit)"}
    for name in layout.blocks:
        entry: dict[str, Any] = {"name": name, "what": about[name], "share_of_mu_squared": layout.share(name),
                                 "released": "through noise" if mechanism is not None else "without noise",
                                 "clip": 1.0, "clip_of": "the L2 norm of a user's tick's contribution (a mean of their "
                                                         "listens, weighted by min(1, total reward))",
                                 "sensitivity_per_tick": float(layout.sensitivity[name]),
                                 "sensitivity_rule": "sqrt(2) x clip: two replacing contributions with a "
                                                     "nonnegative inner product" + (
                                                         "; adding or removing one: 1 x clip (covered)"
                                                         if s.add_remove else "")}
        blocks.append(entry)
    if s.add_remove:
        count = {"name": "count", "what": "user ticks per release: the pool block's last coordinate",
                 "released": "through noise (the pool block's)"}
        lists: dict[str, Any] = dict(ADD_REMOVE_PUBLIC_AND_PROTECTED)
    else:
        count = {"name": "count", "what": "interactions per release (arrivals)", "released": "exactly (public: "
                                                                                           "arrivals)"}
        lists = {**PUBLIC_AND_PROTECTED,
                 "public": [p for p in PUBLIC_AND_PROTECTED["public"] if not p.startswith("the Gram")]}
    base: dict[str, Any] = {
        "model": "hierarchy", "unit": "user", "relation": s.relation, "cap": s.user_cap, "cap_policy": s.cap_policy,
        "statistics": blocks + [count], **lists,
    }
    if mechanism is None:
        return {"private": False, "guarantee": "none: epsilon = inf, the blocks are released without noise", **base,
                **rendered(hierarchy_facts(s, layout, math.inf, s.delta))}
    g = describe(mechanism.event, s.delta)
    mu = gdp_mu(g.epsilon, g.delta) if math.isfinite(g.epsilon) else math.inf
    for entry in blocks:
        entry["mu"] = mu * math.sqrt(layout.share(entry["name"]))
    return {
        "private": True, "mechanism": HIERARCHY_MECHANISM,
        "mechanism_about": MECHANISMS[HIERARCHY_MECHANISM] + "; one release of the hierarchy's blocks, each scaled "
                                                             "so that it gets its share of mu**2 (Gaussian DP)",
        "epsilon": g.epsilon, "delta": g.delta, "valid": g.valid, "note": g.note, "mu_at_cap": mu,
        "neighbours": HIERARCHY_ADD_REMOVE if s.add_remove else HIERARCHY_NEIGHBOURS,
        "scope": f"per epoch of {s.tree_ticks} release ticks, all of one user's contributions (up to {s.user_cap} "
                 f"ticks) are ({g.epsilon:.4g}, {g.delta:g})-DP; epochs compose (Gaussian DP: mu adds in "
                 f"quadrature); a user with k < cap ticks spends mu sqrt(B(k)/B(cap))",
        "sensitivity": {"rule": "multi-participation sensitivity sqrt(B(cap)) of the blocks' weighted sum (per "
                                "tick 1: each block's contribution has norm <= 1, its replace difference <= its "
                                "sensitivity, scaled by its weight)",
                        "factor_vs_one_tick": math.sqrt(ratio(s.user_cap) / ratio(1))},
        "ratios": [ratio(k) for k in range(1, s.user_cap + 1)],
        **base,
        **rendered(hierarchy_facts(s, layout, g.epsilon, g.delta)),
    }


def _composed_statement(settings: Settings, mechanism: Mechanism, items: Mechanism) -> dict[str, Any]:
    """The bandit statistic and the item sums together: exact GDP composition (mu adds in quadrature)."""
    bandit = describe(mechanism.event, settings.delta)
    item = describe(items.event, settings.delta)
    total = GDPAccountant().compose(mechanism.event).compose(items.event).guarantee(settings.delta)
    return {
        "private": True,
        "mechanism": settings.mechanism,
        "mechanism_about": MECHANISMS[settings.mechanism] + f"; plus the item sums through '{ITEM_MECHANISM}'",
        "epsilon": total.epsilon,
        "delta": total.delta,
        "valid": total.valid and bandit.valid and item.valid,
        "note": f"{total.note}: the bandit statistic ({bandit.note}) and the item reward sums ({item.note}) compose "
                f"exactly in Gaussian DP",
        "neighbours": EVENT_NEIGHBOURS,
        "scope": "every release ever published from this namespace (both statistics), per interaction; a user with "
                 "k interactions is covered at group level k",
        "statistics": released_statistics(settings, mechanism, items),
        **PUBLIC_AND_PROTECTED,
        **rendered(flat_facts(settings, total.epsilon, total.delta, user_level=False, items=True)),
        "composition": {"bandit": {"epsilon": bandit.epsilon, "mechanism": settings.mechanism},
                        "items": {"epsilon": item.epsilon, "mechanism": ITEM_MECHANISM},
                        "share": settings.item_share,
                        "rule": "mu = sqrt(mu_bandit**2 + mu_items**2) (Gaussian DP); share = mu_bandit**2 / mu**2"},
        "item_term": {"weight": settings.item_term_weight, "listen_weight": settings.listen_weight_in_force},
    }


def user_level_statement(settings: Settings, statement: dict[str, Any], ratio: Any,
                         mechanism: Mechanism | None = None, items: Mechanism | None = None) -> dict[str, Any]:
    """The statement at user level: a capped user's whole epoch is (epsilon, delta)-DP; the ledger's rule."""
    from models.accounting import gdp_mu

    out = dict(statement)
    if not statement.get("private"):
        out.update({"unit": "user", "cap": settings.user_cap, "cap_policy": settings.cap_policy,
                    **rendered(flat_facts(settings, math.inf, settings.delta, user_level=True,
                                          items=settings.item_term))})
        return out
    mu = gdp_mu(float(statement["epsilon"]), float(statement["delta"]))
    out.update({
        **rendered(flat_facts(settings, float(statement["epsilon"]), float(statement["delta"]), user_level=True,
                              items=items is not None)),
        "unit": "user",
        "cap": settings.user_cap,
        "cap_policy": settings.cap_policy,
        "mu_at_cap": mu,
        "neighbours": USER_NEIGHBOURS + f" (b to norm {settings.clips[0]:g}, item rewards to norm "
                                        f"{settings.clips[1]:.4g})",
        "statistics": released_statistics(settings, mechanism, items, ratio),
        "scope": f"per epoch of {settings.tree_ticks} release ticks, all of one user's contributions (up to "
                 f"{settings.user_cap} ticks) are ({statement['epsilon']:.4g}, {statement['delta']:g})-DP; epochs compose "
                 f"(Gaussian DP: mu adds in quadrature); a user with k < cap ticks spends mu sqrt(B(k)/B(cap))",
        "sensitivity": {"rule": "multi-participation sensitivity sqrt(B(cap)) (models.mechanisms.participation): "
                                "an upper bound of max over <= cap ticks of ||sum of columns of C||",
                        "factor_vs_one_tick": math.sqrt(ratio(settings.user_cap) / ratio(1)),
                        "group_bound_factor": settings.user_cap},
        # B(k) / B(cap) for k = 1..cap: a user with k ticks this epoch spends mu_at_cap * sqrt(ratio) (public)
        "ratios": [ratio(k) for k in range(1, settings.user_cap + 1)],
    })
    return out


#: What each baseline's mechanism is (``mechanism_about`` of its statement).
BASELINE_ABOUT = {
    "SS-LinUCB-Gaussian": "Shariff & Sheffet (2018) joint-DP LinUCB: per unit, one binary tree over the augmented "
                          "Gram matrix [[G, u], [u^T, .]] of [x; r] with symmetrised Gaussian node noise, the "
                          "paper's calibration (Prop. 11), shifted by 2 Upsilon to stay positive definite; their "
                          "width (Prop. 4)",
    "SS-LinUCB-Gaussian-tight": "Shariff & Sheffet (2018) joint-DP LinUCB with the tree's noise calibrated by exact "
                                "Gaussian-DP accounting (ERRATA 6: 6-14x less noise than the paper's); their width",
    "SS-LinUCB-Wishart": "Shariff & Sheffet (2018) joint-DP LinUCB: per unit, one binary tree over the augmented "
                         "Gram matrix with Wishart node noise, padded to m k degrees of freedom and shifted (Prop. 9, "
                         "Eq. 4, spec D.3), calibrated at epsilon/2 for replace-one neighbours (spec D.5); their width",
    "DGS-LinUCB-Laplace": "dynamic global sensitivity (Wang, Zhao, Wang 2022): per unit, tree noise on the estimate "
                          "theta itself, Laplace with the paper's scale Delta/epsilon' (an L2 sensitivity)",
    "DGS-LinUCB-Gaussian": "dynamic global sensitivity (Wang, Zhao, Wang 2022): per unit, tree noise on the estimate "
                           "theta itself, Gaussian calibrated in zCDP (spec D.6)",
}


def _baseline_statement(settings: Settings, policy: PerUserLinUCB) -> dict[str, Any]:
    """The guarantee of a per-unit baseline: S&S joint DP (contexts too); DGS a claim, not a proof."""
    name = settings.baseline or ""
    tree = policy.mechanisms[0]  # SSTreeMechanism / DGSTreeMechanism: both have `levels` and `capacity`
    common: dict[str, Any] = {
        "algorithm": settings.algorithm,
        "mechanism": name,
        "mechanism_about": BASELINE_ABOUT.get(name, name),
        "mechanism_setting": f"not used: {settings.algorithm} brings its own per-unit mechanism (the mechanism "
                             f"setting {settings.mechanism!r} applies to linucb/colin/goblin only)",
        "trees": {"per_unit": True, "levels": int(getattr(tree, "levels")),
                  "unit_releases_per_epoch": int(getattr(tree, "capacity")),
                  "advance": "a unit's tree advances at a release only if the unit's interaction count grew "
                             "(a public count, never a value)"},
    }
    if not policy.private:
        return {"private": False, **common, **rendered(baseline_facts(settings, policy, math.inf, settings.delta)),
                "guarantee": "none: epsilon = inf, the per-unit models are released without noise"}
    g = describe(policy.mechanisms[0].event, settings.delta)
    out: dict[str, Any] = {"private": True, **common, "epsilon": g.epsilon, "delta": g.delta, "valid": g.valid,
                           "target_epsilon": settings.epsilon, "target_delta": settings.delta,
                           "scope": "every release ever published from this namespace, per interaction; each "
                                    "interaction enters only its own unit's tree (parallel composition over "
                                    "units); a user with k interactions is covered at group level k",
                           **rendered(baseline_facts(settings, policy, g.epsilon, g.delta))}
    if isinstance(policy, SSLinUCB):
        note = g.note
        if policy.noise_kind == "gaussian" and policy.calibration == "paper":
            note += (f"; the paper's sigma targets epsilon = {settings.epsilon:g}, exact accounting of that same "
                     f"noise gives epsilon = {g.epsilon:.4g} (the paper's calibration is conservative, ERRATA 6)")
        out.update({
            "notion": "joint DP (Shariff & Sheffet 2018, Def. 1): the published per-unit models are "
                      "(epsilon, delta)-DP in each interaction's context and reward; a recommendation is computed "
                      "from them plus the request's own candidates in the clear (Claim 7), so it protects every "
                      "interaction except against the requester's own query",
            "protects": "each interaction's reward and its context (the Gram matrix is noised too)",
            "neighbours": "event level, replace-one: two streams differing in one interaction's context and "
                          "reward (contexts clipped to norm 1, rewards in [0, 1], L~^2 = 2)",
            "limits": "context protection covers everything published from the statistics; the pipeline still "
                      "treats which items a user was shown and answered as public (shown lists in the "
                      "recommendations topic and recs keys, DESIGN 2): keep those private for end-to-end context "
                      "protection",
            "note": note,
        })
        return out
    assert isinstance(policy, DGSLinUCB)
    mech = policy.mechanisms[0]
    assert isinstance(mech, DGSTreeMechanism)
    shrink: Any = None
    if policy.lambda_0 is not None:
        shrink = first_positive_lambda_prime(policy.lambda_0, mech.delta_node)
    out.update({
        "valid": False,
        "notion": "claimed (epsilon, delta)-DP of the published estimates w.r.t. one reward (the paper's claim, "
                  "NOT a proof)",
        "protects": "each interaction's reward only (contexts are public)",
        "neighbours": "event level, replace-one: two streams differing in the reward of one interaction "
                      "(rewards in [0, 1], contexts clipped to norm 1)",
        "note": "NOT a valid DP guarantee (spec tree-dp B.5): one reward changes every later tree leaf "
                "theta_(t+1) - theta_t through b, not m of them (B.5-1), so the per-node budget split does not "
                "compose to the claimed (epsilon, delta); the shrinking sensitivity L R / (lambda + lambda'_t) "
                "holds only with probability 1 - delta' under an i.i.d.-context assumption (B.5-2)"
                + ("; the Laplace scale is calibrated to an L2 sensitivity (B.5-3)"
                   if policy.noise_kind == "laplace" and policy.calibration == "paper" else "")
                + ". The numbers are what the paper claims, recorded for comparison only",
        "sensitivity": {"lambda_0": policy.lambda_0,
                        "lambda_0_source": "lambda_min of the catalog's arm features' second moment (spec D.9 "
                                           "option 2); interactions with their own contexts are outside this "
                                           "assumption",
                        "initial": mech.sensitivity(0),
                        "shrinks_after_unit_releases": shrink},
    })
    return out
