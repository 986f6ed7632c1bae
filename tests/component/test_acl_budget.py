"""Offline checks of issue 22: the lifetime budget's arithmetic, the local-mode report limit, the ACL file and lines.

The budget and the limit are checked against the other direction of the conversion (``gdp_epsilon`` of the spent
``mu``, where the code compares ``mu`` against ``gdp_mu`` of the budget): the last allowed step is within the
budget and the next one is not.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest

from models.accounting import gdp_epsilon, gdp_mu
from pipeline.config import acl
from pipeline.config.ledger import LedgerRecord, LifetimeBudget, with_budget
from pipeline.modes.local.local_http import report_limit
from pipeline.config.settings import Settings, SettingsError

DELTA = 1e-5


def _ratio(cap: int):  # a tree-like B(k)/B(cap): concave, 1 at the cap
    return lambda k: math.sqrt(min(k, cap) / cap)


@pytest.mark.parametrize(("budget_eps", "eps_cap", "cap"), [(1.0, 2.0, 8), (10.0, 2.0, 8), (3.0, 1.0, 4), (0.5, 4.0, 16)])
def test_a_user_is_folded_exactly_while_the_spent_epsilon_stays_within_the_budget(budget_eps: float, eps_cap: float,
                                                                                  cap: int) -> None:
    ratio = _ratio(cap)
    mu_cap = gdp_mu(eps_cap, DELTA)
    statement = with_budget({"private": True, "mu_at_cap": mu_cap, "cap": cap}, budget_eps, DELTA)
    budget = LifetimeBudget.of(statement, ratio)
    assert budget is not None and budget.mu == pytest.approx(gdp_mu(budget_eps, DELTA))
    rec, epoch = LedgerRecord(), 0
    for _ in range(40 * cap):  # a user at the cap in every epoch, one tick per release
        if rec.at(epoch, ratio).k >= cap:
            epoch += 1
        rec = rec.at(epoch, ratio)
        if not budget.allows(rec, epoch):
            break
        rec = LedgerRecord(epoch, rec.k + 1, 0, rec.past)
    else:
        raise AssertionError("the budget never stopped the user")
    spent = mu_cap * math.sqrt(rec.past + ratio(rec.k))
    assert gdp_epsilon(spent, DELTA) <= budget_eps * (1 + 1e-9)
    nxt = rec.at(epoch + 1, ratio) if rec.k >= cap else rec
    assert gdp_epsilon(mu_cap * math.sqrt(nxt.past + ratio(nxt.k + 1)), DELTA) > budget_eps
    assert budget.exhausted(rec, epoch)


def test_no_budget_without_noise_or_with_an_infinite_one() -> None:
    ratio = _ratio(8)
    assert LifetimeBudget.of(with_budget({"private": False, "mu_at_cap": None, "cap": 8}, 10.0, DELTA), ratio) is None
    assert LifetimeBudget.of(with_budget({"private": True, "mu_at_cap": 0.5, "cap": 8}, math.inf, DELTA), ratio) is None


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_the_setting_refuses_a_budget_that_is_not_positive(value: str) -> None:
    with pytest.raises(SettingsError, match="user_budget"):
        Settings.from_mapping({"user_budget": value}, environ={})


@pytest.mark.parametrize("overrides", [{}, {"local_algorithm": "round"}, {"local_algorithm": "round", "shuffle_batch": 50},
                                       {"epsilon": 0.5}])
def test_the_local_report_limit_is_the_last_count_within_the_budget(overrides: dict[str, object]) -> None:
    s = Settings(mode="local", user_budget=6.0, privacy_unit="event", **overrides)  # type: ignore[arg-type]
    cfg = s.local_config(25)
    limit = report_limit(cfg, s.lifetime_budget)
    assert limit is not None and limit >= 1

    def spent(k: int) -> float:
        if cfg.shuffled:
            return k * cfg.epsilon0
        mu = gdp_mu(cfg.epsilon, cfg.delta)
        return gdp_epsilon(mu * (k if cfg.algorithm == "tree" else math.sqrt(k)), cfg.delta)

    assert spent(limit) <= s.user_budget * (1 + 1e-9) < spent(limit + 1)
    assert report_limit(cfg, math.inf) is None


def test_the_acl_file_holds_hashes_only_and_is_owner_only(tmp_path: Path) -> None:
    rules = acl.global_rules("ns")
    creds = acl.new_credentials(list(rules))
    path = acl.write_aclfile(tmp_path / "redis", rules, creds)
    text = path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    assert not any(pw in text for pw in creds.values())
    for role in ("default", "worker", "web"):
        assert "#" + hashlib.sha256(creds[role].encode()).hexdigest() in text
    web = next(line for line in text.splitlines() if line.startswith("user web "))
    assert "~ns:trusted" not in web and "+config|set" not in web and "%R~ns:model:*" in web
    worker = next(line for line in text.splitlines() if line.startswith("user worker "))
    assert "~ns:*" in worker and "+config|set" in worker
    lines = acl.acl_lines("ns", rules, creds)
    assert [ln.split()[2] for ln in lines] == ["ns-worker", "ns-web"]
    assert not any(pw in " ".join(lines) for pw in creds.values())


def test_credentials_are_kept_per_stack_and_renewed_when_the_roles_change(tmp_path: Path) -> None:
    first = acl.stack_credentials(tmp_path, ["worker", "web"])
    assert (tmp_path / acl.ROLES_FILE).stat().st_mode & 0o777 == 0o600
    assert acl.stack_credentials(tmp_path, ["worker", "web"]) == first
    other = acl.stack_credentials(tmp_path, ["site0", "coordinator", "web"])
    assert set(other) == {"default", "site0", "coordinator", "web"} and other["web"] != first["web"]


def test_the_default_budget_is_10_at_user_level_and_none_at_event_level() -> None:
    assert Settings().user_level and Settings().lifetime_budget == 10.0
    assert Settings(mode="local").user_level and Settings(mode="local").lifetime_budget == 10.0  # local: user level
    assert Settings(mode="local", privacy_unit="event").lifetime_budget == math.inf
    assert Settings(privacy_unit="event").lifetime_budget == math.inf
    assert Settings(mode="local", user_budget=4.0).lifetime_budget == 4.0
    event = Settings(mode="local", privacy_unit="event")
    assert report_limit(event.local_config(25), event.lifetime_budget) is None
