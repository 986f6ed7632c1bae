"""The facts of a privacy statement, and the one renderer of its plain-words sentence.

A mechanism or protocol states what it guarantees as :class:`StatementFacts`: what it releases and the
guarantee of one release, the guarantee against each party that sees something else, how releases compose,
and (user level) the scope the ``(epsilon, delta)`` covers. :func:`render` turns the facts into the sentence
``/budget`` serves as ``statement`` (and the page shows): one author of the wording, so a variant (another
shuffler, another unit) changes a fact, never a copy of the sentence.

Examples
--------
>>> facts = StatementFacts(release="each report is pure 1-LDP",
...                        parties=(Party("the operator", "each report is only its local guarantee"),),
...                        composition="a user's reports in k batches compose",
...                        scope="per epoch a device makes at most 2 reports")
>>> render(facts)
"per epoch a device makes at most 2 reports: each report is pure 1-LDP; against the operator: each report is only its local guarantee; a user's reports in k batches compose"
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Party", "StatementFacts", "render"]


@dataclass(frozen=True, slots=True)
class Party:
    """What one party is guaranteed: ``who`` (as the sentence names them), the ``guarantee`` and its ``condition``
    (empty: unconditional)."""

    who: str
    guarantee: str
    condition: str = ""


@dataclass(frozen=True, slots=True)
class StatementFacts:
    """The facts one statement renders.

    Attributes
    ----------
    release
        What is released, through which noise, and the guarantee of one release.
    parties
        The guarantee against each party that sees more (or less) than the released statistics, in order.
    composition
        How releases compose (a user's k reports, blocks, batches); empty when the release covers everything.
    scope
        User level: the unit the ``(epsilon, delta)`` covers (per epoch, at most ``cap`` reports); empty at
        event level.
    limit
        The lifetime budget's stopping rule, when there is one.
    """

    release: str
    parties: tuple[Party, ...] = ()
    composition: str = ""
    scope: str = ""
    limit: str = ""


def render(facts: StatementFacts) -> str:
    """The statement's sentence: ``scope: release; against <party>: <guarantee>[, condition]; composition; limit``."""
    against = [f"against {p.who}: {p.guarantee}" + (f", {p.condition}" if p.condition else "") for p in facts.parties]
    body = "; ".join(c for c in (facts.release, *against, facts.composition, facts.limit) if c)
    return f"{facts.scope}: {body}" if facts.scope else body
