"""Local mode with codewords: the calibration's accounting, the device's messages, their wire forms (issue 21)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.local import LocalClient, LocalConfig, LocalReport, MemoryStorage, ReportError, parse_report
from models.local.client import codeword_messages
from models.local.esa import parse_envelope, seal_report
from models.local.seal import AnalyzerKey

K, D = 8, 3
CFG = LocalConfig(algorithm="round", d=D, epsilon=2.0, shuffle_batch=150, unit="user", cap=2, user_budget=10.0,
                  codewords=K)
BOOK = np.eye(K, D) + np.eye(K, D, k=-3)


def test_codewords_need_shuffling_at_user_level() -> None:
    with pytest.raises(ValueError, match="codewords"):
        LocalConfig(algorithm="round", d=D, epsilon=2.0, shuffle_batch=150, unit="event", codewords=K)
    with pytest.raises(ValueError, match="codewords"):
        LocalConfig(algorithm="round", d=D, epsilon=2.0, unit="user", codewords=K)


def test_spent_counts_blocks_of_cap_reports() -> None:
    # n reports are n batches; grouped by count into blocks of <= cap, each block (epsilon, delta) (the blanket's
    # exact calibration), blocks composing basically
    assert CFG.spent(1) == (2.0, 1e-5) and CFG.spent(2) == (2.0, 1e-5) and CFG.spent(3) == (4.0, 2e-5)
    assert CFG.report_limit() == 10 and CFG.spent(10)[0] <= 10.0 < CFG.spent(11)[0]
    assert CFG.blanket.guarantee().epsilon <= 2.0 and CFG.report_variance(1) == 0.0


def test_messages_are_the_blanket_and_one_more() -> None:
    p = CFG.blanket.p
    rng = np.random.default_rng(0)
    draws = [codeword_messages(CFG, 5, 1.0, rng) for _ in range(4000)]
    assert all(5 in m and len(set(m)) >= len(m) - 1 for m in draws)
    counts = np.array([len(m) for m in draws], dtype=float)
    # Bin(K + 1, p) + 1 messages (the dummy K is blanketed too): mean (K + 1) p + 1, sd of the mean
    # sqrt((K + 1) p (1 - p) / 4000); 5 sd
    sd = math.sqrt((K + 1) * p * (1 - p) / len(draws))
    assert abs(counts.mean() - ((K + 1) * p + 1)) < 5 * sd
    # reward 0: the dummy K stands in for the listen, so the count's law does not depend on the data
    silent = [codeword_messages(CFG, 5, 0.0, rng) for _ in range(4000)]
    assert all(K in m for m in silent)
    assert abs(np.mean([len(m) for m in silent]) - ((K + 1) * p + 1)) < 5 * sd
    # the dummy's blanket: with a listen, the value K appears as a fake with probability p (5 sd of Bin(4000, p));
    # without it, no analyzer could tell a listen from no listen by counting the dummies
    fake_dummies = sum(K in m for m in draws)
    assert abs(fake_dummies - len(draws) * p) < 5 * math.sqrt(len(draws) * p * (1 - p))
    assert sum(m.count(K) == 2 for m in silent) == pytest.approx(len(silent) * p, abs=5 * math.sqrt(len(silent) * p))


def test_the_device_keeps_its_messages_across_a_restart_and_sends_them_as_it_made_them() -> None:
    store = MemoryStorage()
    dev = LocalClient("7", CFG, store, seed=3, clock=lambda: 0.0, codebook=BOOK)
    rep = dev.report(rec_id="r1", x=BOOK[2], reward=1.0)
    assert 2 in rep.messages and not rep.vector.any()
    again = LocalClient("7", CFG, store, codebook=BOOK).pending()[0]
    assert again == rep and parse_report(rep.to_json(), d=D) == rep
    with pytest.raises(ValueError, match="codebook"):
        LocalClient("8", CFG, MemoryStorage())


@pytest.mark.parametrize("msgs", [[-1], [1.5], ["a"], [True], "3"])
def test_a_bad_msgs_field_is_named(msgs: object) -> None:
    body = {"schema": "privrec.LocalReport/2", "user": "7", "version": 1, "algorithm": "round", "rec_id": "r",
            "m": [0.0] * D, "msgs": msgs}
    with pytest.raises(ReportError) as e:
        parse_report(body, d=D)
    assert e.value.parameter == "msgs"


def test_an_envelope_seals_each_message_on_its_own() -> None:
    key = AnalyzerKey.generate()
    rep = LocalClient("7", CFG, MemoryStorage(), seed=1, clock=lambda: 0.0, codebook=BOOK).report(
        rec_id="r1", x=BOOK[1], reward=1.0)
    env = parse_envelope(seal_report(rep, key.public_bytes()).to_json())
    assert len(env.msgs) == len(rep.messages) and len(set(m[:65] for m in env.msgs)) == len(env.msgs)  # own keys
    body = env.to_dict()
    body["msgs"] = ["not base64!"]
    with pytest.raises(ReportError) as e:
        parse_envelope(body)
    assert e.value.parameter == "msgs"


def test_the_setting_needs_shuffling_at_user_level() -> None:
    from pipeline.config.settings import Settings, SettingsError

    base = {"PRIVREC_MODE": "local", "PRIVREC_LOCAL_ALGORITHM": "round", "PRIVREC_LOCAL_CODEWORDS": "64",
            "PRIVREC_USER_CAP": "2"}  # the default cap, 8, needs batches of 256 (see the test below)
    with pytest.raises(SettingsError, match="local_codewords"):
        Settings.from_mapping({}, environ=base)                          # no shuffler
    with pytest.raises(SettingsError, match="local_codewords"):
        Settings.from_mapping({}, environ={**base, "PRIVREC_SHUFFLE_BATCH": "150", "PRIVREC_PRIVACY_UNIT": "event"})
    s = Settings.from_mapping({}, environ={**base, "PRIVREC_SHUFFLE_BATCH": "150"})
    assert s.local_config(25).codewords == 64 and s.model_config()["local_codewords"] == 64
    assert "local_codewords" not in Settings.from_mapping({}, environ={}).model_config()


def _exact_batch_delta(epsilon: float, n: int, p: float) -> float:
    """delta(epsilon) of one blanket batch, recomputed here on the full (X, Y) grid without rounding: the pair
    P = (X + 1, Y), Q = (X, Y + 1), X, Y ~ Bin(n, p) (Balcer & Cheu's worst case; models.local.items' docstring)."""
    from scipy import stats

    x = np.arange(n + 1)
    w = stats.binom.pmf(x, n, p)
    # the seen counts (X + 1, Y) have probability pmf(X) pmf(Y) under P and pmf(X + 1) pmf(Y - 1) under Q (zero
    # when X = n or Y = 0: an infinite loss)
    X, Y = np.meshgrid(x, x, indexing="ij")
    weight = np.outer(w, w)
    q = np.where((X < n) & (Y >= 1), stats.binom.pmf(X + 1, n, p) * stats.binom.pmf(Y - 1, n, p), 0.0)
    finite = q > 0
    loss = np.log(weight[finite]) - np.log(q[finite])
    return float(weight[~finite].sum() + np.sum(weight[finite] * np.clip(-np.expm1(epsilon - loss), 0.0, None)))


def test_a_codeword_batch_states_the_blankets_guarantee_not_the_laplace_bound() -> None:
    from models.local.esa import SealedBatch, SealedShuffler
    from models.local.shuffle import ShuffledBatch, Shuffler

    small = LocalConfig(algorithm="round", d=D, epsilon=2.0, shuffle_batch=150, unit="user", cap=2, codewords=K)
    sh = Shuffler(small)
    out = []
    for u in range(150):
        out += sh.add(LocalReport(str(u), 1, "round", f"r{u}", np.zeros(D), ("a",), epoch=0), unit=0, messages=[u % K])
    (batch,) = out
    p, delta = small.blanket.p, small.delta
    assert (batch.analysis, batch.bound, batch.delta) == ("blanket", "blanket-exact", delta)
    # the stamped epsilon is one batch's, by the blanket's analysis: delta holds there and not 0.01 below it
    assert _exact_batch_delta(batch.epsilon, 150, p) <= delta < _exact_batch_delta(batch.epsilon - 0.01, 150, p)
    assert batch.epsilon < small.epsilon  # one batch alone: below the cap batches' (epsilon, delta)
    assert ShuffledBatch.parse(batch.to_json(), d=D) == batch
    sealed = SealedShuffler(small).guarantee()
    assert sealed == sh.guarantee() and SealedBatch.parse(
        SealedBatch(0, 1, ["a"], [b"x"], *sealed, analysis="blanket").to_json()).analysis == "blanket"
    # without codewords the same batch size states the Laplace reports' amplification
    laplace = Shuffler(LocalConfig(algorithm="round", d=D, epsilon=2.0, shuffle_batch=150, unit="user", cap=2))
    assert laplace.analysis == "amplification" and laplace.guarantee()[2] != "blanket-exact"


def test_budget_states_the_blanket_against_every_party(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.modes.local.esa import KEY_ENV, PUBLIC_ENV
    from pipeline.modes.local.local_http import local_statement

    for separate in (False, True):
        monkeypatch.delenv(KEY_ENV, raising=False)
        if separate:
            monkeypatch.setenv(PUBLIC_ENV, "{}")
        else:
            monkeypatch.delenv(PUBLIC_ENV, raising=False)
        st = local_statement(CFG)
        parties = st["parties"]
        assert parties["everyone_else"]["analysis"] == "blanket"
        assert (parties["everyone_else"]["epsilon"], parties["everyone_else"]["delta"]) == (CFG.epsilon, CFG.delta)
        assert parties["colluding"]["epsilon"] is None  # no local guarantee: not epsilon0 of Laplace reports
        assert st["against_operator"]["epsilon_per_report"] is None
        assert st["against_operator"]["epsilon"] == (CFG.epsilon if separate else None)
        assert "Laplace" not in st["statement"] and "blanket" in st["statement"]


def test_privrec_up_refuses_a_batch_too_small_for_the_blanket(tmp_path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from models.local.items import smallest_batch
    from pipeline.config.settings import Settings
    from privrec.cli import main

    for name in ("PRIVREC_SHUFFLE_BATCH", "PRIVREC_USER_CAP", "PRIVREC_EPSILON", "PRIVREC_DELTA",
                 "PRIVREC_PRIVACY_UNIT"):
        monkeypatch.delenv(name, raising=False)
    need = smallest_batch(2.0, 1e-5, 2)
    # the threshold is the calibration's own: the device's blanket exists at `need` users and not one fewer
    assert LocalConfig(algorithm="round", d=D, epsilon=2.0, shuffle_batch=need, unit="user", cap=2,
                       codewords=K).blanket.p <= 0.5
    with pytest.raises(ValueError, match="no blanket"):
        _ = LocalConfig(algorithm="round", d=D, epsilon=2.0, shuffle_batch=need - 1, unit="user", cap=2,
                        codewords=K).blanket.p
    state = tmp_path / "state"
    argv = ["up", "--mode", "local", "--local-algorithm", "round", "--user-cap", "2", "--local-codewords", "64",
            "--epsilon", "2", "--state-dir", str(state)]
    assert main([*argv, "--shuffle-batch", str(need - 1)]) == 2
    err = capsys.readouterr().err
    assert "setting `shuffle_batch`" in err and f"the smallest workable batch is {need} " in err
    assert not state.exists()  # refused before anything started (no state directory, no process)
    base = {"PRIVREC_MODE": "local", "PRIVREC_LOCAL_ALGORITHM": "round", "PRIVREC_LOCAL_CODEWORDS": "64",
            "PRIVREC_USER_CAP": "2"}
    assert Settings.from_mapping({}, environ={**base, "PRIVREC_SHUFFLE_BATCH": str(need)}).shuffle_batch == need
    # a larger cap needs more users: the same batch is refused at cap 8
    with pytest.raises(ValueError, match=f"smallest workable batch is {smallest_batch(2.0, 1e-5, 8)} "):
        Settings.from_mapping({}, environ={**base, "PRIVREC_SHUFFLE_BATCH": str(need), "PRIVREC_USER_CAP": "8"})
