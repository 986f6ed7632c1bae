"""Fuzzing the decoders: ``interactions`` events, local reports, and the shuffler's batches (issue 12).

Property of every decoder: it returns a valid record, or raises *the module's own error type* (exactly that
type, not an ``OverflowError``, ``RecursionError``, ``TypeError``, ``KeyError`` ... that happens to be caught
by a broad ``except ValueError``) with a message naming the problem.

Each target has a default test (``DEFAULT_EXAMPLES`` derandomized examples) and a ``slow`` ``*_10k`` twin
(10,000 examples; ``pytest -m slow tests/fuzz``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.local import LocalReport, ReportError, parse_report
from models.local.reports import MAX_ABS
from models.local.shuffle import BATCH_SCHEMA, ShuffledBatch
from pipeline.data.catalog import SyntheticCatalog
from pipeline.data.records import MalformedEvent, Parsed, parse_batch, parse_interaction

from .strategies import decoder_input, dumps, profile

D = 4
CATALOG = SyntheticCatalog(n_users=5, d=D, n_arms=12, seed=3)

EVENT = {"event_id": "e1", "user": "1", "arm": "3", "reward": 1.0, "ts": 1.7e12, "rec_id": "r1",
         "context": [0.25, -0.5, 0.125, 0.0]}
LISTEN = {"event_id": "l1", "user": "4", "arm": "11", "reward": 0.5, "kind": "listen"}
EVENT_BYTES = st.one_of(decoder_input(EVENT), decoder_input(LISTEN),
                        decoder_input({"event_id": "e2", "user": "0", "arm": "no-such-arm", "reward": 0,
                                       "context": [3, 4, 0, 0]}))

REPORTS = [LocalReport("2", 3, "tree", "r9", np.array([0.5, -1.25, 3.0, 1e5]), ("7", "3")).to_dict(),
           LocalReport("0", 1, "round", "r1", np.zeros(D), ("1",)).to_dict()]
REPORT_BYTES = st.one_of(*(decoder_input(r) for r in REPORTS))

BATCH = {"schema": BATCH_SCHEMA, "unit": 2, "seq": 1, "items": ["1", "5"], "m": [[0.5, -1.0, 2.0, 0.0]] * 2,
         "epsilon": 1.5, "delta": 1e-6, "bound": "fmt"}
BATCH_BYTES = decoder_input(BATCH)


def _message(exc: BaseException) -> str:
    text = str(exc)
    assert isinstance(text, str) and text.strip(), f"{type(exc).__name__} without a message"
    return text


# ---------------------------------------------------------------------------------------------- events

def _valid_parsed(p: Parsed) -> None:
    assert p.user in CATALOG.users and p.unit == CATALOG.unit_of(p.user)
    assert 0.0 <= p.reward <= 1.0
    x = np.asarray(p.context)
    assert x.shape == (D,) and np.isfinite(x).all() and float(np.linalg.norm(x)) <= 1.0 + 1e-9


def check_interaction(raw: bytes) -> None:
    try:
        parsed = parse_interaction(raw, CATALOG)
    except MalformedEvent as exc:
        assert type(exc) is MalformedEvent
        _message(exc)
        return
    _valid_parsed(parsed)


def check_batch(raws: list[bytes]) -> None:
    """Never raises; each event accepted or dead exactly once, with the verdict ``parse_interaction`` gives."""
    batch = parse_batch(raws, CATALOG)
    dead = dict(batch.dead)
    assert len(dead) == len(batch.dead) and [i for i, _ in batch.dead] == sorted(dead)
    assert len(batch.units) + len(dead) == len(raws)
    assert len(batch.contexts) == len(batch.rewards) == len(batch.users) == len(batch.items) == len(batch.listens)
    kept = [i for i in range(len(raws)) if i not in dead]
    for j, i in enumerate(kept):
        single = parse_interaction(raws[i], CATALOG)  # accepted alone too, with the same values
        _valid_parsed(single)
        assert (int(batch.units[j]), batch.users[j], float(batch.rewards[j])) == (single.unit, single.user,
                                                                                  single.reward)
        assert np.array_equal(batch.contexts[j], single.context)
    for i, reason in dead.items():
        assert isinstance(reason, str) and reason.strip()
        with pytest.raises(MalformedEvent) as info:
            parse_interaction(raws[i], CATALOG)
        assert str(info.value) == reason


BATCHES = st.lists(st.one_of(EVENT_BYTES, st.just(dumps(EVENT)), st.just(dumps(LISTEN))), min_size=0, max_size=6)


# ---------------------------------------------------------------------------------------------- reports

def check_report(raw: bytes, algorithm: str | None) -> None:
    try:
        rep = parse_report(raw, d=D, algorithm=algorithm)
    except ReportError as exc:
        assert type(exc) is ReportError
        assert isinstance(exc.parameter, str) and exc.parameter, exc  # " " is a field's name too
        assert isinstance(exc.message, str) and exc.message.strip(), exc
        return
    assert algorithm is None or rep.algorithm == algorithm
    assert rep.algorithm in ("tree", "round") and 1 <= rep.version < 2**53
    for s in (rep.user, rep.rec_id, *rep.shown):
        assert isinstance(s, str) and 0 < len(s) <= 200
    assert rep.vector.shape == (D,) and np.isfinite(rep.vector).all() and np.abs(rep.vector).max() <= MAX_ABS
    assert parse_report(rep.to_json(), d=D) == rep  # what a device re-sends parses to the same report


def check_shuffled(raw: bytes) -> None:
    try:
        b = ShuffledBatch.parse(raw, d=D)
    except ValueError as exc:
        assert type(exc) is ValueError, f"{type(exc).__name__}: {exc}"  # not a stray OverflowError etc.
        assert _message(exc).startswith("batch: ")
        return
    assert b.n >= 1 and b.n == len(b.items) and all(isinstance(i, str) and i for i in b.items)
    assert b.unit >= 0 and b.seq >= 1 and not isinstance(b.unit, bool)
    assert all(len(row) == D and all(math.isfinite(v) for v in row) for row in b.vectors)
    assert isinstance(b.epsilon, float) and isinstance(b.delta, float)
    again = ShuffledBatch.parse(b.to_json(), d=D)
    assert (again.unit, again.seq, again.items, again.vectors) == (b.unit, b.seq, b.items, b.vectors)


# ---------------------------------------------------------------------------------------------- the tests

def _pair(check: Callable[..., None], **strategies: st.SearchStrategy[Any]) -> tuple[Any, Any]:
    """A target's default test and its 10,000-example ``slow`` twin (same strategy, same check)."""
    def make(slow: bool) -> Any:
        @profile(slow)
        @given(**strategies)
        def test(**kwargs: Any) -> None:
            check(**kwargs)

        return pytest.mark.slow(test) if slow else test

    return make(False), make(True)


test_parse_interaction, test_parse_interaction_10k = _pair(check_interaction, raw=EVENT_BYTES)
test_parse_batch, test_parse_batch_10k = _pair(check_batch, raws=BATCHES)
test_parse_report, test_parse_report_10k = _pair(check_report, raw=REPORT_BYTES,
                                                 algorithm=st.sampled_from([None, "tree", "round"]))
test_shuffled_batch_parse, test_shuffled_batch_parse_10k = _pair(check_shuffled, raw=BATCH_BYTES)


# ---------------------------------------------------------------------------------------------- regressions

@pytest.mark.parametrize("raw", [
    b"[" * 20000,                                              # nesting past the decoder's recursion limit
    b'{"a":' * 1025 + b"1" + b"}" * 1025,
    json.dumps({**EVENT, "context": [10**400, 0, 0, 0]}).encode(),  # an integer too large for a float
    b'{"event_id": "e", "user": "1", "arm": "2", "reward": ' + b"1" * 5000 + b"}",
])
def test_hostile_events_are_malformed(raw: bytes) -> None:
    check_interaction(raw)
    check_batch([raw, dumps(EVENT)])


@pytest.mark.parametrize("raw", [
    b"[" * 20000,                                              # RecursionError before the fix
    dumps({**REPORTS[0], "b": [10**400, 0, 0, 0]}),            # OverflowError in numpy before the fix
    dumps({**REPORTS[1], "m": [0, -(10**309), 0, 0]}),
    dumps({**REPORTS[0], "rec_id": "\ud800"}),                 # a lone surrogate: accepted, then no key could hold it
    dumps({**REPORTS[0], "user": "a\udfff"}),
])
def test_hostile_reports_are_report_errors(raw: bytes) -> None:
    with pytest.raises(ReportError):
        parse_report(raw, d=D)


@pytest.mark.parametrize("raw", [
    b"{" * 20000,
    dumps({**BATCH, "m": [[10**400, 0, 0, 0]] * 2}),
    dumps({**BATCH, "epsilon": 10**400}),
    dumps({**BATCH, "delta": -(10**309)}),
])
def test_hostile_batches_are_value_errors(raw: bytes) -> None:
    check_shuffled(raw)
    with pytest.raises(ValueError):
        ShuffledBatch.parse(raw, d=D)


@pytest.mark.parametrize("value", [float("nan"), -1.0])
@pytest.mark.parametrize("field", ["epsilon", "delta"])
def test_a_nan_or_negative_guarantee_in_a_batch_is_refused(field: str, value: float) -> None:
    """A shuffled batch claiming ε = NaN (JSON ``NaN``) or a negative δ is refused, naming the field."""
    raw = json.dumps({**BATCH, field: value}).encode()
    check_shuffled(raw)
    with pytest.raises(ValueError, match="epsilon must be >= 0 and delta in"):
        ShuffledBatch.parse(raw, d=D)


@pytest.mark.parametrize("context", [[1e300, 1e300, -1e300, 0.0], [1.7e308, 0.0, 0.0, 0.0], [1e200, 3e200, 0, 0]])
def test_a_context_of_huge_finite_floats_is_scaled_not_zeroed(context: list[float]) -> None:
    """``x @ x`` overflows to inf for these finite contexts: before the fix ``x / inf`` made them all zero.

    They are scaled to norm 1 in the direction they point, exactly like a moderate context of that direction.
    """
    got = parse_interaction(json.dumps({**EVENT, "context": context}).encode(), CATALOG).context
    x = np.asarray(context) / max(abs(v) for v in context)
    assert np.linalg.norm(got) == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(got, x / np.linalg.norm(x), rtol=1e-12, atol=0)
    (batched,) = parse_batch([json.dumps({**EVENT, "context": context}).encode()], CATALOG).contexts
    assert np.array_equal(batched, got)


def test_the_properties_catch_a_foreign_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: an exception of another type escapes the checks, and a message-less error fails them."""
    def overflow(raw: bytes, *, d: int) -> ShuffledBatch:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(ShuffledBatch, "parse", staticmethod(overflow))
    with pytest.raises(OverflowError):
        check_shuffled(b"{}")
    with pytest.raises(AssertionError):
        _message(MalformedEvent(""))
    with pytest.raises(AssertionError):
        _valid_parsed(Parsed(0, np.ones(D), 1.0, "0"))  # norm 2 > 1
