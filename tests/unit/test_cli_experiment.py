"""``privrec experiment table1`` and ``privrec bench core`` end to end, on a tiny grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privrec.cli import main


def test_table1_writes_every_output(tmp_path: Path) -> None:
    out = tmp_path / "t1"
    rc = main(["experiment", "table1", "--out", str(out), "--runs", "2", "--horizon", "300", "--preset", "d5",
               "--jobs", "1", "--no-progress"])
    assert rc == 0
    doc = json.loads((out / "table1.json").read_text())
    assert doc["epsilons"] == [0.5, 1.0, 2.0, 5.0, 10.0]
    expected_rows = {"DP-LinUCB", "DP-CoLin", "DP-GOBLin", "LDP-CoLin", "LDP-GOBLin", "LinUCB", "CoLin", "GOBLin",
                     "random"}
    assert set(doc["rows"]) == expected_rows
    for row in doc["rows"].values():
        assert len(row["mean"]) == 5 and len(row["std"]) == 5
    assert doc["settings"]["horizon"] == 300 and doc["settings"]["runs"] == 2
    assert doc["settings"]["lambda"] == 1.0 and doc["settings"]["environment"]["d"] == 5
    for f in ("table1.md", "table1.png", "curves.png"):
        assert (out / f).stat().st_size > 0
    assert "DP-GOBLin" in (out / "table1.md").read_text()


def test_table1_runs_the_mechanism_it_is_given(tmp_path: Path) -> None:
    """``privrec experiment table1 --mechanism M`` (docs/privacy.md): the run records M and what it is."""
    assert main(["experiment", "table1", "--out", str(tmp_path), "--runs", "1", "--horizon", "200", "--preset", "d5",
                 "--jobs", "1", "--no-progress", "--mechanism", "gaussian-exact"]) == 0
    settings = json.loads((tmp_path / "table1.json").read_text())["settings"]
    assert settings["mechanism"] == "gaussian-exact" and "Gaussian" in settings["mechanism_about"]


def test_bench_core_writes_json(tmp_path: Path) -> None:
    assert main(["bench", "core", "--out", str(tmp_path), "--steps", "100", "--d", "5", "--users", "3"]) == 0
    doc = json.loads((tmp_path / "core.json").read_text())
    assert doc["linucb_us"] > 0 and doc["colin_us"] > 0
    if "mabwiser_linucb_us" in doc:  # the `bench` extra: the peer took turns with LinUCB, one time per repeat
        assert doc["speedup_vs_mabwiser_linucb"] == pytest.approx(doc["mabwiser_linucb_us"] / doc["linucb_us"])
        assert len(doc["speedup_vs_mabwiser_linucb_by_repeat"]) == doc["settings"]["repeats"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--runs", "0"], "`--runs` must be at least 1"),
        (["--tick", "0"], "`--tick` must be a positive"),
        (["--delta", "1.5"], r"`--delta` must be in \(0, 1\)"),
    ],
)
def test_bad_parameters_exit_2_with_a_clear_message(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["experiment", "table1", "--out", str(tmp_path), "--no-progress", *args])
    assert rc == 2
    import re

    assert re.search(message, capsys.readouterr().err)


def test_bad_alpha_is_an_argparse_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["experiment", "table1", "--out", str(tmp_path), "--alpha", "wide"])
    assert exc.value.code == 2


def test_modes_writes_every_output_with_the_schema(tmp_path: Path) -> None:
    out = tmp_path / "modes"
    rc = main(["experiment", "modes", "--out", str(out), "--runs", "1", "--horizon", "400", "--tick", "100",
               "--no-lastfm", "--jobs", "1", "--no-progress", "--scaling-users", "3,6", "--population", ""])
    assert rc == 0
    doc = json.loads((out / "modes.json").read_text())
    assert doc["epsilons"] == [0.5, 1.0, 2.0, 5.0, 10.0]
    assert {"global", "federated-star", "federated-ring", "local-tree", "local-round", "local-shuffled-vectors"} <= set(
        doc["modes"])
    for name, m in doc["modes"].items():
        assert len(m["regret"]) == 5 and m["lastfm_ratio"] == []
        if name in ("local-shuffled-vectors", "local-shuffled-items"):  # no synthetic row: nothing measured
            assert m["regret"] == [None] * 5
            continue
        assert all(r >= 0 for r in m["regret"])
        if name.startswith("federated"):
            assert m["bytes_per_site_per_tick"] > 0
    # the local rows ran real devices: their regret differs from the global mode's at the same seeds
    assert doc["modes"]["local-round"]["regret"] != doc["modes"]["global"]["regret"]
    sc = doc["scaling"]
    assert sc["n_users"] == [3, 6] and len(sc["local_added"]) == len(sc["global_added"]) == 2
    # a 4-site ring sends each release to two neighbours, a star's site to one coordinator
    assert doc["modes"]["federated-ring"]["bytes_per_site_per_tick"] == pytest.approx(
        2 * doc["modes"]["federated-star"]["bytes_per_site_per_tick"])
    assert "ratio" in doc["target"] and isinstance(doc["target"]["met"], bool)
    for f in ("modes.md", "modes.png"):
        assert (out / f).stat().st_size > 0


def test_modes_refuses_an_unknown_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["experiment", "modes", "--out", str(tmp_path), "--rows", "global,telepathic", "--no-lastfm",
               "--no-progress"])
    assert rc == 2
    assert "telepathic" in capsys.readouterr().err


def test_the_federated_sites_twin_at_user_level_clips_caps_and_calibrates_to_the_cap() -> None:
    """``federated_sites_twin``: at event level the live sites' replace-one calibration; at user level one user's
    interactions of a tick are summed and clipped to norm 1, a user past ``cap`` ticks is not learned from, and the
    noise is the event level's times the participation factor."""
    import numpy as np

    from models.mechanisms.participation import participation_factor
    from privrec.experiments.modes import federated_sites_twin

    kw = dict(n_units=4, d=2, sites=2, delta=1e-5, lam=1.0, alpha=0.3, kappa=0.0, tick=3, horizon=3 * 63, cap=2,
              seed=0)
    pol = federated_sites_twin("user", epsilon=float("inf"), **kw)  # type: ignore[arg-type]
    fed = pol.inner.base
    for tick in range(4):  # user 7 (unit 1) sends three interactions per tick: b = 3 x, clipped to norm 1
        for _ in range(3):
            pol.begin_event(7)
            pol.update(1, np.array([0.8, 0.0]), 1.0)
    # two ticks (the cap), each of norm 1 (unclipped: 2.4 each, 9.6 over the four)
    np.testing.assert_allclose(fed.views[0].b_tilde.reshape(4, 2)[1], [2.0, 0.0], rtol=1e-12)
    assert pol.dropped == 6 and fed.ticks == 4
    event = federated_sites_twin("event", epsilon=2.0, **kw).base  # type: ignore[arg-type]
    user = federated_sites_twin("user", epsilon=2.0, **kw).inner.base  # type: ignore[arg-type]
    for sim in (event, user):
        sim.release()
    mech = next(m for m in event.mechanisms if m is not None)
    assert user.views[0].noise_std == pytest.approx(participation_factor(mech, 2) * event.views[0].noise_std,
                                                    rel=1e-9)
