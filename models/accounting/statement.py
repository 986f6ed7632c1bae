"""The facts of a privacy statement, and the one renderer of its plain-words sentence.

A mechanism or protocol states what it guarantees as :class:`StatementFacts`: what it releases and the
guarantee of one release, the guarantee against each party that sees something else, how releases compose,
and (user level) the scope the ``(epsilon, delta)`` covers. :func:`render` turns the facts into the sentence
``/budget`` serves as ``statement`` (the page and the dashboard show it); :func:`render_plain` turns their
:class:`Plain` part into ``plain``, the same guarantee in the second person (the page's "in plain words"). One author
of the wording, so a variant (another shuffler, another unit, another relation) changes a fact, never a copy of the
sentence.

Examples
--------
>>> facts = StatementFacts(release="each report is pure 1-LDP",
...                        parties=(Party("the operator", "each report is only its local guarantee"),),
...                        composition="a user's reports in k batches compose",
...                        scope="per epoch a device makes at most 2 reports")
>>> render(facts)
"per epoch a device makes at most 2 reports: each report is pure 1-LDP; against the operator: each report is only its local guarantee; a user's reports in k batches compose"
>>> render_plain(Plain(where="Your answers stay on your device.", covers="any one answer of yours",
...                    observer="each report", epsilon=1.0, delta=1e-5))
'Your answers stay on your device. For any one answer of yours, each report is almost as likely either way: at most 2.7× more likely ((ε, δ) = (1.00, 10⁻⁵)), except with probability 10⁻⁵.'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Party", "Plain", "StatementFacts", "render", "render_plain", "fmt_epsilon", "fmt_delta"]


@dataclass(frozen=True, slots=True)
class Party:
    """What one party is guaranteed: ``who`` (as the sentence names them), the ``guarantee`` and its ``condition``
    (empty: unconditional)."""

    who: str
    guarantee: str
    condition: str = ""


@dataclass(frozen=True, slots=True)
class Plain:
    """The guarantee as one person reads it (the page's words, second person).

    Attributes
    ----------
    where
        Where the person's answers stay and what leaves (whole sentences).
    covers
        What one may change within the bound ("any one answer you give", "everything you do in an epoch").
    observer
        What is almost as likely either way: plural when it starts with "the" ("the published results"), else
        singular ("each report", "what the server sees").
    epsilon, delta
        The bound (``epsilon`` inf: nothing is protected).
    total
        How the figure the person is shown adds up, and what stays public (whole sentences; may be empty).
    """

    where: str
    covers: str
    observer: str
    epsilon: float
    delta: float
    total: str = ""


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
    plain
        The same guarantee in the second person (:func:`render_plain`); ``None`` where no page shows it.
    """

    release: str
    parties: tuple[Party, ...] = ()
    composition: str = ""
    scope: str = ""
    limit: str = ""
    plain: Plain | None = None


def render(facts: StatementFacts) -> str:
    """The statement's sentence: ``scope: release; against <party>: <guarantee>[, condition]; composition; limit``."""
    against = [f"against {p.who}: {p.guarantee}" + (f", {p.condition}" if p.condition else "") for p in facts.parties]
    body = "; ".join(c for c in (facts.release, *against, facts.composition, facts.limit) if c)
    return f"{facts.scope}: {body}" if facts.scope else body


def render_plain(plain: Plain, parties: tuple[Party, ...] = ()) -> str:
    """The guarantee in plain words: ``where``, the ``e^epsilon`` bound on ``observer`` over ``covers``, ``total``,
    (none when nothing is protected), then a sentence per party (``Against <who>: <guarantee>.``), the numbers as
    the page writes them
    (:func:`fmt_epsilon`, :func:`fmt_delta`)."""
    if not math.isfinite(plain.epsilon):
        bound = (f"Nothing is protected (ε = ∞): {plain.observer} show anyone who sees them how each of your answers "
                 f"moved them.")
    else:
        e, d = fmt_epsilon(plain.epsilon), fmt_delta(plain.delta)
        verb = "are" if plain.observer.startswith("the ") else "is"  # "the published results", "each report"
        bound = (f"For {plain.covers}, {plain.observer} {verb} almost as likely either way: at most "
                 f"{math.exp(plain.epsilon):.1f}× more likely " + (f"((ε, δ) = ({e}, {d})), except with probability "
                                                                   f"{d}." if plain.delta > 0 else f"(ε = {e}, pure)."))
    against = [f"Against {p.who}: {p.guarantee}" + (f", {p.condition}" if p.condition else "") + "." for p in parties]
    total = plain.total if math.isfinite(plain.epsilon) else ""
    return " ".join(c for c in (plain.where, bound, total, *against) if c)


def fmt_epsilon(x: float) -> str:
    """``epsilon`` as the page writes it: 0 decimals from 100, 1 from 10, else 2; ``∞`` for inf."""
    if not math.isfinite(x):
        return "∞"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


_SUP = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def fmt_delta(x: float) -> str:
    """``delta`` as the page writes it: ``10⁻⁵``, ``2.5·10⁻⁷``, ``0``.

    >>> fmt_delta(1e-5), fmt_delta(2.5e-7), fmt_delta(0.0)
    ('10⁻⁵', '2.5·10⁻⁷', '0')
    """
    if x == 0:
        return "0"
    m, e = f"{x:.1e}".split("e")
    m = m.removesuffix(".0")
    return ("" if m == "1" else f"{m}·") + "10" + str(int(e)).translate(_SUP)
