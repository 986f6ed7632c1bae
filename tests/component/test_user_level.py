"""User-level sensitivity, calibration and the ledger's arithmetic (pure; brute force and dp-accounting)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from models.accounting import gdp_epsilon, gdp_mu
from models.mechanisms import make_mechanism
from models.mechanisms.factorization import BLT_TABLE, blt_strategy_coefficients
from models.mechanisms.participation import (
    UnsupportedMechanismError,
    exact_participation_bound,
    participation_bound,
    participation_factor,
    toeplitz_bound,
    toeplitz_matrix,
    tree_bound,
    tree_matrix,
)
from pipeline.config.ledger import LedgerRecord, spent_mu
from pipeline.state.userlevel import Contribution, decode_contribution, encode_contribution, merge_contributions


@pytest.mark.parametrize("p", [3, 4])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_blt_bound_is_above_the_exact_multi_participation_sensitivity_and_below_the_group_bound(p: int, k: int) -> None:
    theta, w = BLT_TABLE[p]
    c = blt_strategy_coefficients(np.array(theta), np.array(w), 2**p - 1)
    exact = exact_participation_bound(toeplitz_matrix(c), k)
    bound = toeplitz_bound(c, k)
    group = k * k * float(c @ c)
    assert exact <= bound * (1 + 1e-12) and bound <= group * (1 + 1e-12)
    if k == 1:
        assert bound == pytest.approx(exact, rel=1e-12)  # one participation: the largest column norm, exactly
    if k > 1:
        assert bound < group  # strictly better than the k-fold group bound


@pytest.mark.parametrize("levels", [3, 4])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_tree_bound_is_above_the_exact_sensitivity(levels: int, k: int) -> None:
    exact = exact_participation_bound(tree_matrix(levels), k)
    bound = tree_bound(levels=levels, k=k)
    assert exact <= bound <= k * k * levels
    if k <= 2:
        assert bound == exact  # the closest leaves achieve it


def test_the_bounds_need_the_structure_they_assume() -> None:
    with pytest.raises(ValueError, match="nonincreasing"):
        toeplitz_bound(np.array([1.0, 2.0]), 2)
    honaker = make_mechanism("honaker-exact", dim=1, sensitivity=1.0, epsilon=1.0, delta=1e-5, horizon=7, seed=0)
    with pytest.raises(UnsupportedMechanismError, match="BLT"):
        participation_bound(honaker, 2)
    with pytest.raises(ValueError, match="`k`"):
        tree_bound(levels=3, k=0)


def test_a_capped_user_gets_the_configured_guarantee_checked_with_dp_accounting() -> None:
    dp_accounting = pytest.importorskip("dp_accounting")
    cap, eps, delta = 6, 2.0, 1e-5
    base = make_mechanism("user-blt-exact", dim=4, sensitivity=1.0, epsilon=eps, delta=delta, horizon=1023, seed=0)
    factor = participation_factor(base, cap)
    assert 1 < factor < cap
    user = make_mechanism("user-blt-exact", dim=4, sensitivity=factor, epsilon=eps, delta=delta, horizon=1023, seed=0)
    sigma = user.scale  # noise std of the inner mechanism (Delta = Lx = 1 per tick)
    # the capped user's whole contribution: sensitivity sqrt(B(cap)) in the space of C X + Z
    mu_user = math.sqrt(participation_bound(user, cap)) / sigma
    assert mu_user == pytest.approx(gdp_mu(eps, delta), rel=1e-9)
    # an independent conversion: Google's PLD accountant on a Gaussian mechanism with multiplier 1/mu
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / mu_user))
    assert acc.get_epsilon(delta) == pytest.approx(eps, abs=2e-3)
    assert gdp_epsilon(mu_user, delta) == pytest.approx(eps, rel=1e-6)


@pytest.mark.parametrize("name", ["user-blt-exact", "gaussian-exact"])
def test_ledger_figures_for_a_known_sequence_equal_an_independent_computation(name: str) -> None:
    """Epoch 0: a user in 3 of at most 4 ticks; epoch 1: in 2 ticks. mu = mu_cap sqrt(B(3)/B(4) + B(2)/B(4))."""
    dp_accounting = pytest.importorskip("dp_accounting")
    cap, eps, delta = 4, 2.0, 1e-5
    mech = make_mechanism(name, dim=2, sensitivity=1.0, epsilon=eps, delta=delta, horizon=255, seed=1)
    B = {k: participation_bound(mech, k) for k in range(1, cap + 1)}

    def ratio(k: int) -> float:
        return B[min(k, cap)] / B[cap]

    rec = LedgerRecord()
    for version in (1, 3, 4):  # three ticks of epoch 0 (capacity 255)
        rec = LedgerRecord(0, rec.at(0, ratio).k + 1, version, rec.past)
    rec = rec.at(1, ratio)  # epoch 1 starts: epoch 0 closes into `past`
    for version in (256, 300):
        rec = LedgerRecord(1, rec.k + 1, version, rec.past)
    mu_cap = gdp_mu(eps, delta)
    mu = spent_mu(rec, 1, mu_cap, ratio)
    # independent: per-epoch sensitivities sqrt(B(k_e)), noise calibrated for sqrt(B(cap)) at mu_cap
    sigma = math.sqrt(B[cap]) / mu_cap
    per_epoch = [math.sqrt(B[3]) / sigma, math.sqrt(B[2]) / sigma]
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for m in per_epoch:
        acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / m))
    assert mu == pytest.approx(math.sqrt(sum(m * m for m in per_epoch)), rel=1e-12)
    assert gdp_epsilon(mu, delta) == pytest.approx(acc.get_epsilon(delta), abs=3e-3)
    # a user in fewer ticks than the cap spends less than a capped one, and one at the cap exactly eps per epoch
    assert spent_mu(LedgerRecord(0, cap, 9, 0.0), 0, mu_cap, ratio) == pytest.approx(mu_cap)
    assert spent_mu(LedgerRecord(0, 1, 9, 0.0), 0, mu_cap, ratio) < mu_cap


def test_contributions_round_trip_exactly() -> None:
    rng = np.random.default_rng(0)
    c = Contribution(3, 5, rng.normal(size=(4, 4)), rng.normal(size=4), {7: 1.0, 2: 0.5})
    back = decode_contribution(encode_contribution(c), 4)
    assert back.unit == 3 and back.count == 5 and back.items == {2: 0.5, 7: 1.0}
    assert np.array_equal(back.gram, c.gram) and np.array_equal(back.b, c.b)


def test_contributions_without_unit_statistics_round_trip_in_a_fraction_of_the_bytes() -> None:
    """The hierarchy's layout (no Gram, no b): the same unit, count and items; 5 values instead of 2 + d^2 + d + 5
    for one item; decoded by the same function, and a truncated value is refused, not misread."""
    c = Contribution(3, 5, None, None, {7: 1.0, 2: 0.5})
    raw = encode_contribution(c)
    back = decode_contribution(raw, 25)
    assert (back.unit, back.count, back.items, back.gram, back.b) == (3, 5, {2: 0.5, 7: 1.0}, None, None)
    assert len(raw) == 8 * (3 + 1 + 4)
    full = encode_contribution(Contribution(3, 5, np.eye(25), np.ones(25), {7: 1.0, 2: 0.5}))
    assert len(full) == 8 * (2 + 625 + 25 + 1 + 4)
    with pytest.raises(ValueError, match="neither layout"):
        decode_contribution(full[:-8], 25)
    with pytest.raises(ValueError, match="neither layout"):
        decode_contribution(raw[:-8], 25)
    merged = merge_contributions(decode_contribution(full, 25), back)  # an old worker's value meets a new one's
    assert merged.gram is None and merged.count == 10 and merged.items == {2: 1.0, 7: 2.0}


def test_the_hierarchy_fold_of_a_batch_keeps_counts_and_items_and_no_statistics() -> None:
    """``unit_stats = False`` (the hierarchy): per user the same unit, count and item rewards as the flat fold."""
    from pipeline.ingestion.ingest import UserIngestProcessor
    from pipeline.data.records import ParsedBatch

    rng = np.random.default_rng(4)
    n, d = 200, 5
    users = [f"u{int(k)}" for k in rng.integers(0, 9, n)]
    X = rng.normal(size=(n, d)) / 3
    r = rng.random(n).round(2)
    items = np.where(rng.random(n) < 0.8, rng.integers(0, 9, n), -1)
    units = np.array([int(u[1:]) % 3 for u in users])
    parsed = ParsedBatch(units, X, r, users, [], items, np.zeros(n, dtype=bool), X, np.arange(n))
    out = {}
    for stats in (True, False):
        proc = object.__new__(UserIngestProcessor)
        proc.listen_weight, proc.n_items, proc.unit_stats = 1.0, 9, stats
        work = {"u1": Contribution.empty(1, d, unit_stats=stats)}
        work["u1"].count, work["u1"].items = 2, {4: 1.0}
        proc._fold_users(work, parsed, d)
        out[stats] = work
    assert set(out[True]) == set(out[False]) == {f"u{k}" for k in range(9)}
    for u, c in out[False].items():
        flat = out[True][u]
        assert (c.unit, c.count, c.items) == (flat.unit, flat.count, flat.items)
        assert c.gram is None and c.b is None and flat.gram is not None


def test_the_offline_twin_calibrates_both_releases_by_the_participation_factor() -> None:
    from models.policies import make_user_level_policy

    kw = {"d": 3, "W": np.eye(2), "n_items": 5, "epsilon": 2.0, "features": np.eye(5, 3), "tick": 10}
    one, four = make_user_level_policy("LinUCB", cap=1, **kw), make_user_level_policy("LinUCB", cap=4, **kw)
    for get in (lambda p: p.inner.base.mechanism, lambda p: p.inner.item_mechanism):
        m1, m4 = get(one), get(four)
        assert participation_factor(m1, 1) == pytest.approx(1.0)
        # sigma = Delta * ||c|| / mu: the sensitivity of a user capped at 4 ticks multiplies sigma
        assert m4.scale / m1.scale == pytest.approx(participation_factor(m1, 4), rel=1e-12)
        assert 1.0 < m4.scale / m1.scale < 4.0  # better than the group bound (k = 4 full participations)


def test_the_offline_twin_clips_each_user_of_a_tick_separately() -> None:
    from models.policies import make_user_level_policy

    pol = make_user_level_policy("LinUCB", d=2, W=np.eye(1), n_items=3, epsilon=float("inf"), cap=2, tick=4,
                                 weight=0.0)
    x = np.array([1.0, 0.0])
    for user, reward in ((1, 1.0), (1, 1.0), (1, 1.0), (2, 0.5)):  # user 1: b = 3x -> x; user 2: 0.5x
        pol.begin_event(user)
        pol.update(0, x, reward, 0)
    assert pol.inner.base.b_released.tolist() == [1.5, 0.0]
    assert pol.dropped == 0 and pol.participations[(1, 0)] == 1 and pol.participations[(2, 0)] == 1


def test_experiment_userlevel_writes_every_output(tmp_path: Path) -> None:
    from privrec.cli import main

    out = tmp_path / "ul"
    assert main(["experiment", "userlevel", "--out", str(out), "--quick", "--no-lastfm", "--epsilons", "2,4",
                 "--jobs", "1"]) == 0
    doc = json.loads((out / "userlevel.json").read_text())
    assert doc["epsilons"] == [2.0, 4.0] and doc["unit"] == "user" and "lastfm" not in doc
    sy = doc["synthetic"]
    assert len(sy["regret"]) == 2 and all(r > 0 for r in sy["regret"])
    # the reported cap is the held-out winner of the tuning grid
    for e, cap in zip(doc["epsilons"], sy["cap"]):
        grid = {int(c): v for c, v in sy["tuning"][str(e)].items()}
        assert cap == min(grid, key=grid.__getitem__)
    assert (out / "userlevel.md").stat().st_size > 0 and (out / "userlevel.png").stat().st_size > 0


def test_experiment_userlevel_refuses_bad_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from privrec.cli import main

    assert main(["experiment", "userlevel", "--out", str(tmp_path), "--caps", "0,2", "--no-lastfm"]) == 2
    assert "`--caps` must be positive" in capsys.readouterr().err


@pytest.mark.parametrize(("overrides", "unit"), [
    ({}, "user"),  # the default mechanism, user-blt-exact
    ({"mechanism": "gaussian-exact"}, "user"),
    ({"mechanism": "paper"}, "event"),  # no multi-participation bound
    ({"mechanism": "laplace-l1"}, "event"),
    ({"algorithm": "ss-gaussian"}, "event"),  # a per-unit baseline
    ({"mode": "federated", "sites": 2, "site": 0}, "user"),  # each site folds, caps and budgets its own users
    ({"mode": "federated", "sites": 2, "site": 0, "privacy_unit": "event"}, "event"),  # an explicit choice
    ({"privacy_unit": "event"}, "event"),
])
def test_the_protected_unit_in_force(overrides: dict[str, object], unit: str) -> None:
    from pipeline.config.settings import Settings

    assert Settings(**overrides).unit_in_force == unit  # type: ignore[arg-type]


@pytest.mark.parametrize(("overrides", "field"), [
    ({"privacy_unit": "user", "mechanism": "paper"}, "mechanism"),
    ({"privacy_unit": "user", "algorithm": "ss-gaussian"}, "privacy_unit"),
    ({"privacy_unit": "user", "mode": "federated", "sites": 2, "mechanism": "paper"}, "mechanism"),
    ({"privacy_unit": "household"}, "privacy_unit"),
    ({"user_cap": 0}, "user_cap"),
    ({"user_cap": 2 ** 14}, "user_cap"),  # more than the ticks of an epoch
    ({"cap_policy": "drop"}, "cap_policy"),
])
def test_settings_refuse_a_user_level_they_cannot_give(overrides: dict[str, object], field: str) -> None:
    from pipeline.config.settings import Settings, SettingsError

    with pytest.raises(SettingsError) as exc:
        Settings(**overrides)  # type: ignore[arg-type]
    assert exc.value.setting == field


@pytest.mark.parametrize("topology", ["star", "ring"])
def test_federated_sites_are_user_level_by_default_and_say_so(topology: str) -> None:
    """``--mode federated`` with no flags: user level with the flat model's cap and the default lifetime budget, and the
    statement ``/budget`` serves (:func:`site_guarantee` wrapped by :func:`federated_statement`) says so with the
    cap, the epsilon a capped user spends per epoch and the budget; ``--privacy-unit event`` still states event
    level, with no cap and no budget."""
    from pipeline.config.settings import DEFAULT_CAPS, DEFAULT_USER_BUDGET, Settings
    from pipeline.data.catalog import SyntheticCatalog
    from pipeline.modes.federated.sites import federated_statement, site_guarantee

    s = Settings(mode="federated", sites=2, topology=topology, n_users=6, d=3, n_arms=10, tree_levels=6)
    assert (s.unit_in_force, s.model, s.user_cap, s.lifetime_budget) == ("user", "flat", DEFAULT_CAPS["flat"],
                                                                         DEFAULT_USER_BUDGET)
    catalog = SyntheticCatalog(n_users=6, d=3, n_arms=10, seed=0)
    st = federated_statement(s, site_guarantee(s, catalog))
    assert st["unit"] == "user" and st["neighbours"].startswith("user level, replace")
    assert st["cap"] == 8 and st["cap_policy"] == "ignore" and len(st["ratios"]) == 8 and st["ratios"][-1] == 1.0
    assert st["epsilon"] == pytest.approx(2.0, rel=1e-6)  # what a capped user spends per epoch
    assert st["mu_at_cap"] == pytest.approx(gdp_mu(st["epsilon"], st["delta"]))
    assert st["user_budget"]["epsilon"] == DEFAULT_USER_BUDGET
    assert st["user_budget"]["mu"] == pytest.approx(gdp_mu(DEFAULT_USER_BUDGET, s.delta))
    assert st["sensitivity"]["factor_vs_one_tick"] > 1  # calibrated to the cap, not to one tick
    assert "user level" in st["per_site"] and "at most 8 ticks" in st["per_site"] and "epsilon 10" in st["per_site"]
    event = s.replace(privacy_unit="event")
    st_event = federated_statement(event, site_guarantee(event, catalog))
    assert "unit" not in st_event and "user_budget" not in st_event and "cap" not in st_event
    assert st_event["neighbours"].startswith("event level, replace-one") and "event level" in st_event["per_site"]
    assert event.lifetime_budget == math.inf
    # the same epsilon per epoch: user level pays for the cap with noise, not with a weaker claim
    assert st_event["epsilon"] == pytest.approx(st["epsilon"], rel=1e-9)


def test_batched_user_contributions_equal_adding_events_one_at_a_time() -> None:
    """The worker folds a batch per user with one matrix product; the sums are the sequential loop's up to
    rounding (a few ulps of the entries' magnitude), the counts and item sums exactly."""
    from pipeline.ingestion.ingest import UserIngestProcessor
    from pipeline.data.records import ParsedBatch

    rng = np.random.default_rng(3)
    n, d, scale = 300, 5, 0.2
    users = [f"u{int(k)}" for k in rng.integers(0, 7, n)]
    X = rng.normal(size=(n, d)) / 3
    r = rng.random(n).round(2)
    listens = rng.random(n) < 0.3
    items = np.where(rng.random(n) < 0.8, rng.integers(0, 9, n), -1)
    units = np.array([int(u[1:]) % 3 for u in users])
    # the Gram rows: each feedback's own context, none for a listen (the user's choice stays out of the Gram)
    parsed = ParsedBatch(units, X, r, users, [], items, listens, X[~listens], np.flatnonzero(~listens))
    proc = object.__new__(UserIngestProcessor)  # only the fold: no Redis
    proc.listen_weight, proc.n_items = scale, 9
    start = {"u1": Contribution(1, 4, rng.normal(size=(d, d)), rng.normal(size=d), {2: 1.0})}
    saved = {u: (c.gram.copy(), c.b.copy()) for u, c in start.items()}
    # as prepare does: the batch's copies share the committed arrays, which the fold must not write
    work = {u: Contribution(c.unit, c.count, c.gram, c.b, dict(c.items)) for u, c in start.items()}
    proc._fold_users(work, parsed, d)
    assert all(np.array_equal(start[u].gram, g) and np.array_equal(start[u].b, b) for u, (g, b) in saved.items())
    ref = {u: Contribution(c.unit, c.count, c.gram.copy(), c.b.copy(), dict(c.items)) for u, c in start.items()}
    for j, user in enumerate(users):  # the reference: one event at a time, in order
        c = ref.setdefault(user, Contribution.empty(int(units[j]), d))
        x = X[j]
        if not listens[j]:
            c.gram += np.outer(x, x)
        c.b += (r[j] * scale if listens[j] else r[j]) * x
        c.count += 1
        if items[j] >= 0:
            c.items[int(items[j])] = c.items.get(int(items[j]), 0.0) + float(r[j])
    assert set(work) == set(ref) and len(ref) == 7
    for u in ref:
        assert work[u].unit == ref[u].unit and work[u].count == ref[u].count and work[u].items == ref[u].items
        # reordered sums of ~50 terms of magnitude <= ~10: |error| <= 50 * 2.2e-16 * 10 ≈ 1.1e-13
        np.testing.assert_allclose(work[u].gram, ref[u].gram, rtol=0, atol=1e-13)
        np.testing.assert_allclose(work[u].b, ref[u].b, rtol=0, atol=1e-13)
    assert not np.allclose(work["u1"].gram, start["u1"].gram)  # the open contribution was added to
