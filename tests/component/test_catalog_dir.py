"""Catalog directories (producers.catalog, pipeline.data.catalog_open): shapes, features, units, cache, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.data.catalog import load_catalog
from pipeline.data.catalog_open import OpenCatalog
from pipeline.config.settings import Settings, SettingsError
from producers.catalog import CatalogFormatError, build_catalog, hash_unit
from producers.catalog.format import read_events
from producers.catalog.generate import write_catalog

SHAPES = {
    "tags_graph_users": dict(n_items=300, n_users=40),
    "no_users_file": dict(n_items=120, n_users=30, users_file=False),
    "no_edges_hash_rule": dict(n_items=80, n_users=25, edges=False),
    "unit_column": dict(n_items=60, n_users=20, units_column=True),
    "half_features": dict(n_items=200, n_users=10, feature_share=0.5, d=8),
    "all_features_no_tags": dict(n_items=50, n_users=5, feature_share=1.0, d=8, edges=False, users_file=False),
    "tiny": dict(n_items=3, n_users=2, edges=False),
    "large": dict(n_items=3000, n_users=300),
}


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_every_shape_builds_features_of_norm_at_most_one_and_units(tmp_path: Path, shape: str) -> None:
    kw = SHAPES[shape]
    root = write_catalog(tmp_path / "cat", seed=3, **kw)
    built = build_catalog(root, d=8, units=6, cache_dir=tmp_path / "cache")
    assert len(built.item_ids) == kw["n_items"] and built.features.shape == (kw["n_items"], 8)
    norms = np.linalg.norm(built.features, axis=1)
    assert np.all(norms <= 1.0 + 1e-12) and np.all(norms > 0.1)
    cat = OpenCatalog(built)
    assert cat.arm_row(built.item_ids[-1]) == kw["n_items"] - 1
    assert "«" in cat.arm_name(built.item_ids[0])  # non-ASCII names kept
    units = [cat.unit_of(u) for u in built.users]
    assert all(0 <= u < cat.n_units for u in units)
    W = np.asarray(cat.W)
    assert W.shape == (cat.n_units, cat.n_units) and np.allclose(W.sum(axis=0), 1.0)
    if kw.get("units_column"):
        assert built.unit_rule == "users.csv unit" and cat.n_units == len({u for u in units})
    elif not kw.get("edges", True):
        assert cat.n_units == 6 and units == [hash_unit(u, 6) for u in built.users]
        assert np.array_equal(W, np.eye(6))
    else:
        assert built.unit_rule.startswith("clusters of edges.csv")
        assert cat.n_units == min(6, len(built.users))


def test_tag_features_are_unit_norm_and_a_later_item_gets_the_same_transform(tmp_path: Path) -> None:
    root = write_catalog(tmp_path / "cat", n_items=400, n_users=10, seed=5)
    built = build_catalog(root, d=6, units=3, use_cache=False)
    assert np.allclose(np.linalg.norm(built.features, axis=1), 1.0)
    f = built.featurizer
    assert f is not None and len(f.vocabulary) > 6
    # the transform saved with the build gives every built item its row back: later items land in the same space
    import csv

    with (root / "items.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    tags = [r["tags"].split("|") for r in rows[:50]]
    assert np.allclose(f.transform(tags), built.features[:50], atol=1e-12)
    cat = OpenCatalog(built)
    x = cat.features_from_tags([["rock", "JAZZ"]])
    assert x.shape == (1, 6) and abs(np.linalg.norm(x) - 1.0) < 1e-12
    with pytest.raises(ValueError, match="none of the tags"):
        cat.features_from_tags([["no-such-label"]])


def test_the_build_is_cached_and_a_changed_file_rebuilds(tmp_path: Path) -> None:
    root = write_catalog(tmp_path / "cat", n_items=100, n_users=20, seed=1)
    cache = tmp_path / "cache"
    first = build_catalog(root, d=5, units=4, cache_dir=cache)
    again = build_catalog(root, d=5, units=4, cache_dir=cache)
    assert first.info["cache"]["hit"] is False and again.info["cache"]["hit"] is True
    assert np.array_equal(first.features, again.features) and first.item_names == again.item_names
    assert OpenCatalog(first).fingerprint == OpenCatalog(again).fingerprint
    assert again.featurizer is not None and again.featurizer.vocabulary == first.featurizer.vocabulary
    with (root / "edges.csv").open("a") as fh:
        fh.write("user-0@example.org,newcomer\n")
    changed = build_catalog(root, d=5, units=4, cache_dir=cache)
    assert changed.info["cache"]["hit"] is False
    assert OpenCatalog(changed).fingerprint != OpenCatalog(first).fingerprint
    (root / "users.csv").unlink()  # a removed file rebuilds too
    assert build_catalog(root, d=5, units=4, cache_dir=cache).info["cache"]["hit"] is False


def test_a_new_user_gets_the_public_unit_and_new_items_append(tmp_path: Path) -> None:
    root = write_catalog(tmp_path / "cat", n_items=20, n_users=10, seed=2, edges=False)
    cat = OpenCatalog(build_catalog(root, d=8, units=5, use_cache=False))
    fp = cat.fingerprint
    for user in ("nobody", "Jürgen", "新しい利用者"):
        assert cat.unit_of(user) == hash_unit(user, 5)
    added = cat.add_items(["new-1", "sku-000000-α", "new-2"], np.array([[3.0] + [0.0] * 7, [1.0] * 8,
                                                                       [0.1] * 8]), ["Eins", "dup", "Zwei"])
    assert added == ["new-1", "new-2"]  # a known id is skipped
    assert cat.arm_row("new-1") == 20 and cat.arm_row("new-2") == 21 and cat.arm_name("new-2") == "Zwei"
    assert np.allclose(cat.feature_matrix[20], [1.0] + [0.0] * 7)  # scaled down to norm 1
    assert cat.fingerprint == fp  # the fingerprint names the build, not the items added later


def _write(root: Path, name: str, text: str | bytes) -> None:
    root.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        (root / name).write_bytes(text)
    else:
        (root / name).write_text(text, encoding="utf-8")


BAD = {
    "missing_items": ({}, "items.csv: missing file"),
    "missing_column": ({"items.csv": "id,tags\na,x\n"}, "items.csv, line 1, column item: missing column 'item'"),
    "no_features_or_tags_column": ({"items.csv": "item,name\na,A\n"}, "items.csv, line 1: needs a 'features'"),
    "duplicate": ({"items.csv": "item,tags\na,x\nb,y\na,z\n"},
                  "items.csv, line 4, column item: duplicate item id 'a' (first on line 2)"),
    "non_numeric": ({"items.csv": "item,features\na,1 2 3\nb,1 zwei 3\n"},
                    "items.csv, line 3, column features: 'zwei' is not a number"),
    "wrong_length": ({"items.csv": "item,features\na,1 2 3\nb,1 2\n"},
                     "items.csv, line 3, column features: has 2 values, expected d = 3"),
    "not_finite": ({"items.csv": "item,features\na,1 nan 3\n"}, "items.csv, line 2, column features: 'nan' is not "
                                                                "a finite number"),
    "empty_tags_and_features": ({"items.csv": "item,tags,features\na,x,\nb,,\n"},
                                "items.csv, line 3, column tags: empty 'tags' and 'features'"),
    "encoding": ({"items.csv": b"item,tags\na,x\nb,caf\xe9\n"}, "items.csv, line 3: not UTF-8: byte 0xe9"),
    "field_count": ({"items.csv": "item,tags\na,x,extra\n"}, "items.csv, line 2: 3 fields, the header has 2"),
    "duplicate_user": ({"items.csv": "item,tags\na,x\n", "users.csv": "user\nu1\nu2\nu1\n"},
                       "users.csv, line 4, column user: duplicate user id 'u1' (first on line 2)"),
    "empty_unit": ({"items.csv": "item,tags\na,x\n", "users.csv": "user,unit\nu1,g\nu2,\n"},
                   "users.csv, line 3, column unit: empty unit"),
    "edges_column": ({"items.csv": "item,tags\na,x\n", "edges.csv": "user,friends\nu1,u2\n"},
                     "edges.csv, line 1, column friend: missing column 'friend'"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_names_file_line_and_column(tmp_path: Path, case: str) -> None:
    files, message = BAD[case]
    root = tmp_path / "cat"
    root.mkdir()
    for name, text in files.items():
        _write(root, name, text)
    with pytest.raises(CatalogFormatError) as info:
        build_catalog(root, d=3, units=2, use_cache=False)
    assert message in str(info.value)


def test_features_given_to_a_different_d_are_refused_with_the_line(tmp_path: Path) -> None:
    root = write_catalog(tmp_path / "cat", n_items=30, n_users=4, feature_share=1.0, d=8, edges=False)
    with pytest.raises(CatalogFormatError, match=r"items.csv, line 2, column features: has 8 values, expected d = 5"):
        build_catalog(root, d=5, units=2, use_cache=False)


def test_events_file_rules(tmp_path: Path) -> None:
    _write(tmp_path, "events.csv", "user,item,timestamp,reward\nu,a,2024-01-02T03:04:05Z,1\nu,b,17,0.5\n"
                                   "v,c,18,\n")
    ev = read_events(tmp_path / "events.csv")
    assert ev.users == ["u", "u", "v"] and ev.rewards.tolist() == [1.0, 0.5, 1.0] and ev.times[1] == 17.0
    _write(tmp_path, "events.csv", "user,item,timestamp\nu,a,yesterday\n")
    with pytest.raises(CatalogFormatError, match="events.csv, line 2, column timestamp"):
        read_events(tmp_path / "events.csv")
    _write(tmp_path, "events.csv", "user,item,timestamp,reward\nu,a,1,2\n")
    with pytest.raises(CatalogFormatError, match=r"events.csv, line 2, column reward: 2.0 is outside \[0, 1\]"):
        read_events(tmp_path / "events.csv")


def test_settings_take_a_catalog_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIVREC_CACHE_DIR", str(tmp_path / "cache"))
    root = write_catalog(tmp_path / "mine", n_items=40, n_users=12, seed=4)
    monkeypatch.chdir(tmp_path)
    s = Settings.from_mapping({"catalog": "mine", "d": 6, "catalog_units": 3})
    assert s.catalog == str(root.resolve())  # absolute: every process reads the same directory
    cat = load_catalog(s)
    assert isinstance(cat, OpenCatalog) and cat.name == "mine" and cat.d == 6 and cat.n_units == 3
    assert list(cat.default_pool) == list(cat.arm_ids)  # no candidates: every item
    with pytest.raises(SettingsError, match="catalog"):
        Settings.from_mapping({"catalog": "no-such-dir"})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranking_every_item_in_float32_gives_the_float64_order(seed: int) -> None:
    from models.ground.linalg import ucb_scores
    from pipeline.serve.serving import RANKED, rank_catalog

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(20_000, 25))
    X /= np.linalg.norm(X, axis=1)[:, None]
    A = rng.normal(size=(25, 25))
    theta, M = rng.normal(size=25) * 0.3, np.linalg.inv(np.eye(25) + A @ A.T)
    pop = rng.random(15_000)  # an item term released before the last 5,000 items were added
    term = (0.2, pop)
    rows = rank_catalog(X.astype(np.float32), X, theta, M, 0.3, term)
    mean, bonus = ucb_scores(theta, M, X, 0.3)
    score = mean + bonus + 0.2 * np.concatenate([pop, np.zeros(5_000)])
    assert rows.tolist() == np.argsort(-score, kind="stable")[:RANKED].tolist()
