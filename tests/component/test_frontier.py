"""``privrec experiment frontier`` through its CLI on tiny settings: the JSON's shape, sane shares of the gain, and an
uncalibrated local cell reported (``n/c`` with the reason), not raised.

Populations: a stand-in for the LastFM arrays (the real files need not be here), a tiny generated catalog passed
as ``--catalog``, a tiny generated tagged catalog and a 300-user synthetic population; ε ∈ {2, ∞}, two seeds.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.local.policy import LocalItemUCB
from privrec.cli import main
from privrec.experiments import frontier
from privrec.experiments.lastfm import LastFMEvents
from producers.catalog.generate import write_catalog


def _lastfm_stand_in(n: int, data_dir: str | None, start: int) -> LastFMEvents:
    """300 events of 200 users in two units, 60 items of 6 dims, pools of 5, a planted taste."""
    rng = np.random.default_rng(7)
    n = min(n, 300)
    features = rng.normal(size=(60, 6))
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    taste = features[:4].mean(axis=0)
    users = rng.integers(0, 200, size=n)
    pools = np.stack([rng.choice(60, size=5, replace=False) for _ in range(n)])
    correct = np.array([int(np.argmax(features[p] @ taste)) for p in pools], dtype=np.int64)
    return LastFMEvents((users % 2).astype(np.int64), pools, correct, features, np.eye(2), 2, users.astype(np.int64))


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"frontier.json holds {name}: JSON has no NaN")
    return json.loads(text, parse_constant=refuse)


def test_frontier_cli_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(frontier, "_load_lastfm", _lastfm_stand_in)
    monkeypatch.setenv("PRIVREC_CACHE_DIR", str(tmp_path / "cache"))  # the catalog build's cache stays here
    catalog = write_catalog(tmp_path / "shop", n_items=120, n_users=80, n_events=700, seed=3, zipf=1.0)
    out = tmp_path / "frontier"
    rc = main(["experiment", "frontier", "--out", str(out), "--epsilons", "2,inf", "--seeds", "2",
               "--sizes", "300", "--lastfm-events", "300", "--catalog", str(catalog), "--catalog-events", "400",
               "--tagged-catalog", "120,60,600", "--tagged-events", "400", "--tagged-seed", "1",
               "--population-seed", "1", "--jobs", "1", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    doc = _strict_json((out / "frontier.json").read_text())
    assert doc["epsilons"] == [2.0, "inf"] and doc["modes"] == ["global", "federated", "local"] and doc["seeds"] == 2
    assert list(doc["populations"]) == ["lastfm", "catalog", "tagged", "population-300"]
    assert set(doc["windows"]) == set(doc["populations"])
    assert doc["windows"]["lastfm"]["events"] == [0, 299] and doc["windows"]["tagged"]["events"] == [0, 399]
    # the generated data's public seeds are the command's (held-out runs choose them): the windows name them
    assert "seed=1," in doc["windows"]["tagged"]["source"] and "seed=1)" in doc["windows"]["population-300"]["source"]
    paired_seen = 0
    for name, p in doc["populations"].items():
        assert p["nonprivate"]["ratio"] > 0 and len(p["nonprivate"]["runs"]) == 2, name
        assert p["data_free"]["which"] in ("prior", "random") and p["data_free"]["ratio"] >= 1.0
        assert p["private_popularity"]["2"]["ratio"] > 0 and p["online_popularity"]["ratio"] > 0
        for mode in doc["modes"]:
            assert set(p["cells"][mode]) == {"2", "inf"}
            for key, c in p["cells"][mode].items():
                if c["uncalibrated"]:
                    continue
                assert c["ratio"] > 0 and len(c["runs"]) == 2 and c["se"] is not None
                assert isinstance(c["floor_met"], bool) and c["floor"] >= 1.0
                if c["share_of_gain"] is not None:  # a gain to keep: the share of the reference's gain
                    assert c["share_of_gain"] == pytest.approx(frontier.share_of_gain(
                        c["ratio"], nonprivate=p["nonprivate"]["ratio"], baseline=p["data_free"]["ratio"]))
                    if key != "inf":  # under noise a sane fraction; without, another mode's twin may beat the
                        # reference on a stream this short (local's counts each report, global's each tick)
                        assert -3.0 < c["share_of_gain"] <= 1.5, (name, mode, key, c["share_of_gain"])
        assert p["cells"]["global"]["inf"]["share_of_gain"] in (1.0, None)  # the reference itself
        # federated without noise is the same model as global: the sites' exact sums add up
        assert p["cells"]["federated"]["inf"]["ratio"] == pytest.approx(p["nonprivate"]["ratio"])
        # a federated cell's floor is private popularity under its own trust model (each site its own noise)
        fed = p["cells"]["federated"]["2"]
        assert p["private_popularity_federated"]["2"]["ratio"] > 0
        if fed["floor_what"] != "best data-free (prior)" and fed["floor_what"] != "best data-free (random)":
            assert fed["floor_what"] == "private popularity, federated"
            assert fed["floor"] == p["private_popularity_federated"]["2"]["ratio"]
        assert isinstance(fed["one_server_floor_met"], bool) and fed["central_floor_met"] is None
        assert p["cells"]["global"]["2"]["one_server_floor_met"] is None
        assert p["cells"]["global"]["2"]["central_floor_met"] is None
        # a local cell's floor is private popularity under its own trust model: every catalog here is the codebook
        local_pop = p["private_popularity_local"]["2"]
        assert set(local_pop) == {"ratio", "se", "runs", "not_applicable"} and local_pop["not_applicable"] is None
        loc = p["cells"]["local"]["2"]
        assert loc["one_server_floor_met"] is None
        if loc["uncalibrated"]:  # the same twin behind the baseline: not calibrated either, nothing measured
            assert local_pop["ratio"] is None and local_pop["runs"] == [] and loc["central_floor_met"] is None
            continue
        assert local_pop["ratio"] > 0 and len(local_pop["runs"]) == 2
        assert isinstance(loc["central_floor_met"], bool)
        if not loc["floor_what"].startswith("best data-free"):
            assert loc["floor_what"] == "private popularity, local"
            assert loc["floor"] == local_pop["ratio"]
            # measured in the cell's own runs (the same twin and seed): the test takes the per-seed differences' SE
            diffs = [a - b for a, b in zip(loc["runs"], local_pop["runs"], strict=True)]
            assert loc["floor_paired"] is True
            assert loc["floor_se"] == pytest.approx(frontier.standard_error(diffs) or 0.0)
            assert loc["floor_met"] == (loc["ratio"] >= loc["floor"] - 2.0 * loc["floor_se"])
            paired_seen += 1
        assert p["cells"]["global"]["2"]["floor_paired"] is False
    assert paired_seen >= 1  # some local cell was judged against its own runs' local popularity
    # the catalog's local cell at eps = 2: local mode's default batch (150 distinct users) exceeds its 80 users
    lf = doc["populations"]["catalog"]["cells"]["local"]
    assert lf["2"]["uncalibrated"].startswith("a batch that calibrates at epsilon 2 holds 150 distinct users; the "
                                              "window has ")
    assert lf["2"]["ratio"] is None and lf["2"]["runs"] == [] and lf["2"]["floor_met"] is None
    assert lf["inf"]["uncalibrated"] is None and lf["inf"]["ratio"] > 0
    assert doc["populations"]["population-300"]["cells"]["local"]["2"]["uncalibrated"] is None  # 300 users >= 150
    md = (out / "frontier.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("|  | local | 2 |")]  # LastFM's, then the catalog's
    assert "n/c" not in rows[0] and "n/c" in rows[1]
    assert " (local " in rows[0] and " (local —)" in rows[1]  # the catalog's baseline was not calibrated either
    judged = [c for p in doc["populations"].values() for cells in p["cells"].values()
              for key, c in cells.items() if key != "inf" and c["floor_met"] is not None]
    missed = sum(not c["floor_met"] for c in judged)
    assert f"**{missed} of {len(judged)} private cells miss their floor** under their row's trust model; " in md
    assert "local, ε = 2: a batch that calibrates at epsilon 2 holds 150 distinct users" in md
    assert (out / "frontier.png").stat().st_size > 0
    assert (out / "tagged-catalog" / "events.csv").is_file()


def test_local_hierarchy_needs_the_catalog_and_the_listens() -> None:
    with pytest.raises(ValueError, match="`hierarchy` needs the catalog's `features`"):
        LocalItemUCB(d=2, n_items=4, epsilon=2.0, batch=200, cap=1, seed=0, hierarchy=True)
    with pytest.raises(ValueError, match="share"):
        LocalItemUCB(d=2, n_items=4, epsilon=2.0, batch=200, cap=1, seed=0, hierarchy=True, share=1.0,
                     features=np.eye(2)[[0, 1, 0, 1]])


def test_frontier_local_floor_not_applicable_beyond_the_codebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A catalog larger than the local codebook (here the limit lowered to 100 items, the catalog 120): the codewords
    are k-means clusters, no item's count is estimated, so local private popularity is reported not applicable
    (nothing run) and the local cell keeps the central floor."""
    up_module = importlib.import_module("privrec.ops.up")  # privrec.ops.up is also the name of a function there
    monkeypatch.setattr(up_module, "MAX_CATALOG_CODEBOOK", 100)
    out = tmp_path / "frontier"
    rc = main(["experiment", "frontier", "--out", str(out), "--epsilons", "4", "--seeds", "1", "--modes", "local",
               "--sizes", "", "--no-lastfm", "--tagged-catalog", "120,400,2000", "--tagged-events", "800",
               "--jobs", "1", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    p = _strict_json((out / "frontier.json").read_text())["populations"]["tagged"]
    local_pop = p["private_popularity_local"]["4"]
    assert local_pop["ratio"] is None and local_pop["runs"] == []
    assert local_pop["not_applicable"].startswith("the catalog's 120 items exceed the local codebook's 100")
    cell = p["cells"]["local"]["4"]
    assert cell["uncalibrated"] is None and isinstance(cell["floor_met"], bool)
    assert cell["floor_what"] in ("private popularity", "best data-free (prior)", "best data-free (random)")
    assert cell["central_floor_met"] is None  # the floor it is judged against is already the central one
    assert "| local | 4 |" in (md := (out / "frontier.md").read_text()) and " (local n/a)" in md
