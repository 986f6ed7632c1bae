"""Calibration and accountants, checked against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.accounting import (
    GaussianTreeEvent,
    GDPAccountant,
    LaplaceAccountant,
    LaplaceTreeEvent,
    UnsupportedEventError,
    ZCDPAccountant,
    describe,
    epsilon_from_rho,
    gdp_delta,
    rho_from_epsilon,
)
from models.mechanisms import BinaryTreeMechanism

EPS = (0.5, 1.0, 2.0, 5.0, 10.0)


def _delta_by_integration(mu: float, epsilon: float) -> float:
    """delta(eps) = E[(1 - e^(eps - L))_+] with the privacy loss L ~ N(mu^2/2, mu^2), by quadrature."""
    m, s = mu * mu / 2, mu
    x = np.linspace(m - 40 * s, m + 40 * s, 2_000_001)
    pdf = np.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))
    f = np.where(x > epsilon, (1 - np.exp(np.minimum(epsilon - x, 0))) * pdf, 0.0)
    return float(np.trapezoid(f, x))


def test_zcdp_sigma_matches_errata_table() -> None:
    got = [BinaryTreeMechanism.gaussian(dim=1, sensitivity=1.0, epsilon=e, delta=1e-5, horizon=10_000, seed=0).scale
           for e in EPS]
    # ERRATA §1 prints sigma/Delta = 36.3 / 18.3 / 9.35 / 3.95 / 2.12 (rounded)
    assert got == pytest.approx([36.3, 18.3, 9.35, 3.95, 2.12], abs=0.05)


def test_exact_sigma_matches_errata_table() -> None:
    got = [BinaryTreeMechanism.gaussian(dim=1, sensitivity=1.0, epsilon=e, delta=1e-5, horizon=10_000, seed=0,
                                        accounting="exact").scale for e in EPS]
    # ERRATA §1 prints 26.3 / 14.0 / 7.46 / 3.34 / 1.87 (rounded)
    assert got == pytest.approx([26.3, 14.0, 7.46, 3.34, 1.87], abs=0.051)


@pytest.mark.parametrize("epsilon", EPS)
def test_gaussian_calibrations_are_valid_by_numerical_integration(epsilon: float) -> None:
    for acc in ("zcdp", "exact"):
        m = BinaryTreeMechanism.gaussian(dim=1, sensitivity=1.0, epsilon=epsilon, delta=1e-5, horizon=10_000,
                                         seed=0, accounting=acc)  # type: ignore[arg-type]
        mu = math.sqrt(m.levels) / m.scale  # h node releases of a unit-sensitivity leaf
        delta = _delta_by_integration(mu, epsilon)
        assert delta <= 1e-5 * 1.001
        if acc == "exact":  # tight: it spends (almost) all of delta
            assert delta > 0.99e-5
            assert gdp_delta(mu, epsilon) == pytest.approx(delta, rel=1e-3)


def test_zcdp_round_trip_and_accountant() -> None:
    for e in EPS:
        assert epsilon_from_rho(rho_from_epsilon(e, 1e-5), 1e-5) == pytest.approx(e, abs=1e-9)
    acc = ZCDPAccountant().compose(GaussianTreeEvent(noise_multiplier=2.0, max_nodes_per_leaf=4), count=3)
    assert acc.rho == pytest.approx(3 * 4 / (2 * 4.0))


def test_laplace_paper_calibration_is_labelled_invalid() -> None:
    m = BinaryTreeMechanism.paper(dim=1, sensitivity=1.0, epsilon=2.0, horizon=10_000, seed=0)
    assert m.scale == pytest.approx(14 / 2.0)
    g = describe(m.event, 1e-5)
    assert g.epsilon == pytest.approx(2.0) and not g.valid and "L2" in g.note
    ok = describe(BinaryTreeMechanism.laplace_l1(dim=1, sensitivity_l1=1.0, epsilon=2.0, horizon=10_000,
                                                  seed=0).event, 1e-5)
    assert ok.valid and ok.epsilon == pytest.approx(2.0)


def test_accountants_check_before_committing() -> None:
    acc = ZCDPAccountant()
    with pytest.raises(UnsupportedEventError):
        acc.compose(LaplaceTreeEvent(1.0, 3))
    assert acc.rho == 0.0 and acc.ledger == []
    with pytest.raises(ValueError, match="`count` must be positive"):
        GDPAccountant().compose(GaussianTreeEvent(1.0, 1), count=0)
    with pytest.raises(UnsupportedEventError):
        LaplaceAccountant().compose(GaussianTreeEvent(1.0, 1))


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan")])
def test_bad_epsilon_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="`epsilon` must be positive"):
        rho_from_epsilon(bad, 1e-5)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 2.0])
def test_bad_delta_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match=r"`delta` must be in \(0, 1\)"):
        rho_from_epsilon(1.0, bad)


@pytest.mark.parametrize("form", ["dumped", "reformatted", "mixed"])
def test_many_ledger_records_read_at_once_are_the_records_read_one_by_one(form: str) -> None:
    """:class:`LedgerColumns` (the fold's reader) against :meth:`LedgerRecord.loads`: the same records and classes,
    whether written by ``dumps`` (read by a regular expression) or as other JSON (fields reordered, spaced, left
    out, ``past`` an integer: read by ``json``)."""
    import json

    from models.accounting.ledger import LedgerColumns, LedgerRecord

    rng = np.random.default_rng(3)
    raws: list[bytes | None] = []
    for i in range(300):
        rec = LedgerRecord(int(rng.integers(0, 4)), int(rng.integers(0, 3)), int(rng.integers(0, 10**12)),
                           [0.0, 0.5, 1e-17, 12.25, 0][int(rng.integers(0, 5))])
        raw = rec.dumps()
        if form == "reformatted" or (form == "mixed" and i % 7 == 0):
            fields = {"past": rec.past, "k": rec.k, "epoch": rec.epoch, "last_version": rec.last_version}
            raw = json.dumps({k: v for k, v in fields.items() if not (k == "k" and v == 0)}, separators=(",", ":"))
        raws.append(None if i % 5 == 0 else raw.encode())
    cols = LedgerColumns.loads(raws)
    for i, raw in enumerate(raws):
        one = LedgerRecord.loads(raw)
        assert cols.record(i) == one
        assert cols.record(i).class_field == one.class_field
    assert {c.class_field for c in cols.classes} == {LedgerRecord.loads(r).class_field for r in raws if r}


def test_a_ledger_record_dumped_for_many_versions_is_each_dumped_record() -> None:
    from models.accounting.ledger import LedgerRecord

    for rec in (LedgerRecord(3, 1, 0, 0.1 + 0.2), LedgerRecord(0, 0, 0, 0), LedgerRecord(7, 2, 0, 1e300)):
        assert rec.dumps_many([0, 5, 10**15]) == [LedgerRecord(rec.epoch, rec.k, v, rec.past).dumps()
                                                   for v in (0, 5, 10**15)]
