"""producers.lastfm on small synthetic HetRec-format files written to tmp dirs."""

from __future__ import annotations

import doctest
import importlib
import json
from pathlib import Path

import numpy as np
import pytest

from producers.lastfm import (
    DatasetNotFoundError,
    DataFormatError,
    LastFMEvent,
    compare_with_authors_sample,
    load_catalog,
)
from producers.lastfm.clusters import cluster_users, colin_w, friend_edges, gob_adjacency
from producers.lastfm.raw import REQUIRED_FILES, read_raw

PARAMS = {"d": 4, "n_clusters": 4, "pool_size": 6, "seed": 0}
TAGS = {
    1: "rock",
    2: "hard-rock",
    3: "indie_pop",
    4: "pop",
    5: "electronic",
    6: "die Ärzte",  # written as latin-1, like the real tags.dat
    7: "hip hop",
    8: "jazz",
    9: "post-rock",
    10: "classic rock",
}
USERS = list(range(2, 16))  # 14 users; 15 has no friends
N_TAGGED_ARTISTS = 40  # artists 1..40 can be tagged; 41..46 are only listened to


def _write(path: Path, header: str, rows: list[str], encoding: str = "utf-8") -> None:
    path.write_bytes(("\r\n".join([header, *rows]) + "\r\n").encode(encoding))


def write_dataset(root: Path, seed: int = 1) -> Path:
    """Write a tiny, consistent HetRec-format dataset and return its folder."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    names = [f"{a}\tArtist {a}{' Café' if a == 3 else ''}\thttp://x/{a}\thttp://y/{a}.jpg" for a in range(1, 47)]
    _write(root / "artists.dat", "id\tname\turl\tpictureURL", names)
    _write(root / "tags.dat", "tagID\ttagValue", [f"{t}\t{v}" for t, v in TAGS.items()], encoding="latin-1")
    tagged, listened = [], []
    for u in USERS:
        for a in rng.choice(np.arange(1, N_TAGGED_ARTISTS + 1), size=5, replace=False):
            for t in rng.choice(list(TAGS), size=int(rng.integers(1, 4)), replace=False):
                tagged.append(f"{u}\t{a}\t{t}\t1\t{int(rng.integers(1, 13))}\t{int(rng.integers(2005, 2011))}")
        for a in rng.choice(np.arange(1, 47), size=6, replace=False):
            listened.append(f"{u}\t{a}\t{int(rng.integers(1, 500))}")
    # Every tagged artist gets at least one tag row, so 1..40 all have features.
    for a in range(1, N_TAGGED_ARTISTS + 1):
        tagged.append(f"{USERS[a % len(USERS)]}\t{a}\t{1 + a % len(TAGS)}\t1\t5\t2009")
    _write(root / "user_taggedartists.dat", "userID\tartistID\ttagID\tday\tmonth\tyear", tagged)
    _write(root / "user_artists.dat", "userID\tartistID\tweight", listened)
    # Two communities (2..8, 9..14) joined by one edge, user 15 isolated; both directions listed.
    pairs = [(2, 3), (3, 4), (4, 5), (5, 2), (6, 7), (7, 8), (8, 6), (2, 6), (9, 10), (10, 11), (11, 9),
             (12, 13), (13, 14), (14, 12), (9, 12), (8, 9)]
    rows = [f"{a}\t{b}" for a, b in pairs] + [f"{b}\t{a}" for a, b in pairs]
    _write(root / "user_friends.dat", "userID\tfriendID", rows)
    return root


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "lastfm")


@pytest.fixture
def catalog(data_dir: Path, tmp_path: Path):
    return load_catalog(data_dir, cache_dir=tmp_path / "cache", progress=False, **PARAMS)


def _user_artists(data_dir: Path) -> dict[str, set[str]]:
    raw = read_raw(data_dir)
    out: dict[str, set[str]] = {}
    for u, a in np.r_[raw.listened[:, :2], raw.tagged[:, :2]].tolist():
        out.setdefault(str(u), set()).add(str(a))
    return out


# --- loading ------------------------------------------------------------------------------


def test_reads_latin1_and_utf8(data_dir: Path) -> None:
    raw = read_raw(data_dir)
    assert raw.tags[6] == "die Ärzte"
    assert raw.artist_names[3] == "Artist 3 Café"
    assert raw.listened.shape[1] == 3 and raw.tagged.shape[1] == 6


@pytest.mark.parametrize("name", sorted(REQUIRED_FILES))
def test_missing_file_error_names_dir_file_and_url(data_dir: Path, name: str) -> None:
    (data_dir / name).unlink()
    with pytest.raises(DatasetNotFoundError) as info:
        load_catalog(data_dir, use_cache=False, progress=False, **PARAMS)
    msg = str(info.value)
    assert name in msg and str(data_dir) in msg and "grouplens.org/datasets/hetrec-2011" in msg
    assert info.value.missing == [name]


def test_missing_dir_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="does not exist") as info:
        load_catalog(tmp_path / "nowhere", use_cache=False, progress=False)
    assert "nowhere" in str(info.value) and "hetrec-2011" in str(info.value)


def test_env_var_selects_data_dir(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIVREC_DATA_DIR", str(data_dir))
    monkeypatch.setenv("PRIVREC_CACHE_DIR", str(tmp_path / "envcache"))
    cat = load_catalog(progress=False, **PARAMS)
    assert cat.data_dir == data_dir
    assert Path(cat.info["cache"]["entry"]).parent == tmp_path / "envcache"


def test_malformed_line_names_file_and_line(data_dir: Path) -> None:
    path = data_dir / "user_artists.dat"
    path.write_bytes(path.read_bytes() + b"7\tseven\t3\r\n")
    n_lines = path.read_bytes().count(b"\n")
    with pytest.raises(DataFormatError, match=rf"user_artists.dat line {n_lines}: .*'7\\tseven\\t3'"):
        read_raw(data_dir)


def test_wrong_header_is_reported(data_dir: Path) -> None:
    path = data_dir / "user_friends.dat"
    path.write_bytes(b"a\tb\r\n2\t3\r\n")
    with pytest.raises(DataFormatError, match="user_friends.dat line 1: expected header"):
        read_raw(data_dir)


# --- features -----------------------------------------------------------------------------


def test_features_unit_norm_and_only_tagged_artists(catalog) -> None:
    norms = np.linalg.norm(catalog.feature_matrix, axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-12)
    assert catalog.d == PARAMS["d"]
    assert set(catalog.artist_ids) == {str(a) for a in range(1, N_TAGGED_ARTISTS + 1)}
    assert not catalog.feature_matrix.flags.writeable
    with pytest.raises(KeyError, match="'44' has no features"):
        catalog.feature("44")
    np.testing.assert_array_equal(catalog.features_of(["3", "1"])[0], catalog.feature("3"))


# --- events -------------------------------------------------------------------------------


def test_pools_have_distinct_arms_with_the_positive(catalog) -> None:
    events = list(catalog.events())
    assert len(events) == catalog.n_events > 0
    for ev in events:
        assert len(ev.pool) == PARAMS["pool_size"] == len(set(ev.pool))
        assert ev.arm in ev.pool and ev.reward == 1.0
        assert all(a in catalog.artist_index for a in ev.pool)


def test_no_positive_of_the_user_among_negatives(catalog, data_dir: Path) -> None:
    theirs = _user_artists(data_dir)
    for ev in catalog.events():
        negatives = set(ev.pool) - {ev.arm}
        assert not negatives & theirs[ev.user], ev.event_id


def test_one_event_per_tagged_pair_with_stable_ids(catalog, data_dir: Path) -> None:
    raw = read_raw(data_dir)
    pairs = {(str(u), str(a)) for u, a in raw.tagged[:, :2].tolist()}
    events = list(catalog.events())
    assert {(e.user, e.arm) for e in events} == pairs
    assert len({e.event_id for e in events}) == len(events)
    assert all(e.event_id == f"lastfm:tagged:{e.user}:{e.arm}" for e in events)
    assert all(e.ts is not None for e in events)


def test_events_are_shuffled_and_positive_slot_varies(catalog) -> None:
    events = list(catalog.events())
    users = [int(e.user) for e in events]
    assert users != sorted(users)
    slots = {e.pool.index(e.arm) for e in events}
    assert len(slots) > 1


def test_events_limit_and_start(catalog) -> None:
    all_ids = [e.event_id for e in catalog.events()]
    assert [e.event_id for e in catalog.events(limit=3)] == all_ids[:3]
    assert [e.event_id for e in catalog.events(limit=2, start=4)] == all_ids[4:6]
    with pytest.raises(ValueError, match="`limit` must be non-negative"):
        next(catalog.events(limit=-1))


def test_event_arrays_match_events(catalog) -> None:
    table = catalog.event_arrays()
    first = next(catalog.events())
    assert first.user == str(table.users[0]) and first.arm == str(table.arms[0])
    assert first.pool == tuple(str(a) for a in table.pools[0])


def test_listened_positives(data_dir: Path) -> None:
    cat = load_catalog(data_dir, positives="listened", use_cache=False, progress=False, **PARAMS)
    raw = read_raw(data_dir)
    listened = {(str(u), str(a)) for u, a in raw.listened[:, :2].tolist()}
    with_features = {p for p in listened if p[1] in cat.artist_index}
    events = list(cat.events())
    assert {(e.user, e.arm) for e in events} == with_features
    assert cat.info["counts"]["positives_dropped_no_features"] == len(listened - with_features) > 0
    tagged = {(str(u), str(a)) for u, a in raw.tagged[:, :2].tolist()}
    assert all((e.ts is None) == ((e.user, e.arm) not in tagged) for e in events)


def test_same_seed_same_stream_other_seed_differs(data_dir: Path) -> None:
    a = load_catalog(data_dir, use_cache=False, progress=False, **PARAMS)
    b = load_catalog(data_dir, use_cache=False, progress=False, **PARAMS)
    c = load_catalog(data_dir, use_cache=False, progress=False, **{**PARAMS, "seed": 1})
    assert list(a.events()) == list(b.events())
    np.testing.assert_array_equal(a.feature_matrix, b.feature_matrix)
    assert [e.pool for e in a.events()] != [e.pool for e in c.events()]


def test_to_interaction_fits_the_contract() -> None:
    ev = LastFMEvent("lastfm:tagged:2:52", "2", "52", 1.0, ("7", "52", "9"), 1.5e12)
    assert ev.to_interaction() == {
        "event_id": "lastfm:tagged:2:52", "user": "2", "arm": "52", "context": None,
        "reward": 1.0, "ts": 1.5e12, "rec_id": None,
    }
    assert ev.to_interaction("9", ts=2.0, rec_id="r1")["reward"] == 0.0
    with pytest.raises(ValueError, match="`chosen_arm` must be one of"):
        ev.to_interaction("8")
    no_ts = LastFMEvent("lastfm:listened:2:52", "2", "52", 1.0, ("52",), None)
    with pytest.raises(ValueError, match="`ts` is required"):
        no_ts.to_interaction()


def test_pool_too_large_for_user_is_refused(data_dir: Path) -> None:
    with pytest.raises(ValueError, match="`pool_size` 40 needs 39 negatives"):
        load_catalog(data_dir, use_cache=False, progress=False, **{**PARAMS, "pool_size": 40})


# --- clusters and W -----------------------------------------------------------------------


def test_w_columns_sum_to_one_with_positive_diagonal(catalog) -> None:
    W = catalog.W
    assert W.shape == (PARAMS["n_clusters"],) * 2
    np.testing.assert_allclose(W.sum(axis=0), 1.0, atol=1e-12)
    assert (np.diag(W) > 0).all() and (W >= 0).all()
    A = catalog.adjacency
    np.testing.assert_array_equal(A, A.T)
    assert set(np.unique(A)) <= {0.0, 1.0} and not np.diag(A).any()
    off = ~np.eye(len(W), dtype=bool)
    np.testing.assert_array_equal(A[off] > 0, W[off] > 0)


def test_w_counts_edges_between_clusters(catalog, data_dir: Path) -> None:
    raw = read_raw(data_dir)
    users = np.array([int(u) for u in catalog.users])
    edges = friend_edges(raw.friends, users)
    labels = np.array([catalog.cluster_of(str(u)) for u in users])
    k = catalog.n_clusters
    counts = np.eye(k)
    for i, j in edges.tolist():
        a, b = labels[i], labels[j]
        counts[a, b] += 1
        if a != b:
            counts[b, a] += 1
    np.testing.assert_allclose(catalog.W, counts / counts.sum(axis=0))


def test_every_user_has_a_cluster(catalog) -> None:
    assert set(catalog.users) == {str(u) for u in USERS}
    assert set(catalog.user_cluster.values()) == set(range(PARAMS["n_clusters"]))
    sizes = catalog.cluster_sizes
    assert sizes.sum() == len(USERS) and (np.diff(sizes) <= 0).all()
    with pytest.raises(KeyError, match="'999' is not a LastFM user"):
        catalog.cluster_of("999")


def test_cluster_users_keeps_components_apart() -> None:
    # Two triangles and a pair: 3 clusters must be exactly the 3 components.
    edges = np.array([[0, 1], [1, 2], [0, 2], [3, 4], [4, 5], [3, 5], [6, 7]])
    labels = cluster_users(8, edges, n_clusters=3, seed=0)
    assert labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]


def test_cluster_users_more_components_than_clusters() -> None:
    # One edge and five isolated users, 3 clusters: the 2 largest components (the pair, then
    # user 2) are clusters; users 3..6 share the last one, which is the largest, hence label 0.
    labels = cluster_users(7, np.array([[0, 1]]), n_clusters=3, seed=0)
    assert labels.tolist() == [1, 1, 2, 0, 0, 0, 0]


def test_cluster_users_splits_a_big_component_exactly() -> None:
    rng = np.random.default_rng(0)
    edges = np.array([(i, j) for i in range(30) for j in range(i + 1, 30) if rng.random() < 0.2])
    labels = cluster_users(30, edges, n_clusters=7, seed=0)
    assert sorted(set(labels.tolist())) == list(range(7))


def test_cluster_users_rejects_bad_n_clusters() -> None:
    with pytest.raises(ValueError, match=r"`n_clusters` must be in \[1, 3\].*got 4"):
        cluster_users(3, np.array([[0, 1]]), n_clusters=4, seed=0)


def test_colin_w_and_gob_adjacency_small() -> None:
    W = colin_w(np.array([0, 0, 1]), np.array([[0, 1], [1, 2]]), n_clusters=2)
    np.testing.assert_allclose(W, [[2 / 3, 1 / 2], [1 / 3, 1 / 2]])
    np.testing.assert_array_equal(gob_adjacency(W), [[0, 1], [1, 0]])


# --- cache --------------------------------------------------------------------------------


def test_cache_hit_then_rebuild_when_an_input_changes(data_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = load_catalog(data_dir, cache_dir=cache, progress=False, **PARAMS)
    again = load_catalog(data_dir, cache_dir=cache, progress=False, **PARAMS)
    assert not first.info["cache"]["hit"] and again.info["cache"]["hit"]
    assert list(first.events()) == list(again.events())
    np.testing.assert_array_equal(first.W, again.W)
    assert first.artist_names == again.artist_names
    # Only .npz and .json files, loadable without pickle.
    entry = Path(first.info["cache"]["entry"])
    assert {p.suffix for p in entry.iterdir()} == {".npz", ".json"}
    # A new tagged pair for user 15 -> a new key, a rebuild, and the new event.
    path = data_dir / "user_taggedartists.dat"
    path.write_bytes(path.read_bytes() + b"15\t39\t1\t1\t1\t2010\r\n")
    changed = load_catalog(data_dir, cache_dir=cache, progress=False, **PARAMS)
    assert not changed.info["cache"]["hit"]
    assert changed.info["key"] != first.info["key"]
    assert any(e.event_id == "lastfm:tagged:15:39" for e in changed.events())
    was_there = any(e.event_id == "lastfm:tagged:15:39" for e in first.events())
    assert changed.n_events == first.n_events + (0 if was_there else 1)


def test_cache_key_depends_on_params(data_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a = load_catalog(data_dir, cache_dir=cache, progress=False, **PARAMS)
    b = load_catalog(data_dir, cache_dir=cache, progress=False, **{**PARAMS, "pool_size": 5})
    assert a.info["key"] != b.info["key"] and not b.info["cache"]["hit"]
    assert len(next(b.events()).pool) == 5


def test_corrupt_cache_entry_is_rebuilt(data_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = load_catalog(data_dir, cache_dir=cache, progress=False, **PARAMS)
    entry = Path(first.info["cache"]["entry"])
    (entry / "events.npz").write_bytes(b"not a zip")
    again = load_catalog(data_dir, cache_dir=cache, progress=False, **PARAMS)
    assert not again.info["cache"]["hit"]
    assert list(again.events()) == list(first.events())
    assert load_catalog(data_dir, cache_dir=cache, progress=False, **PARAMS).info["cache"]["hit"]


def test_invalid_params_are_named(data_dir: Path) -> None:
    with pytest.raises(ValueError, match="`positives` must be 'tagged' or 'listened', got 'played'"):
        load_catalog(data_dir, positives="played", use_cache=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`pool_size` must be at least 2, got 1"):
        load_catalog(data_dir, pool_size=1, use_cache=False)


# --- comparison with a BanditLib-format sample --------------------------------------------


def test_compare_with_a_sample_built_from_our_own_events(catalog, tmp_path: Path) -> None:
    users = [int(u) for u in catalog.users]
    rank = {u: i + 1 for i, u in enumerate(users)}
    bandit = tmp_path / "bandit"
    bandit.mkdir()
    rows = ["userid\ttimestamp\tarm_pool"]
    for ev in catalog.events():
        pool = [ev.arm] + [a for a in ev.pool if a != ev.arm]
        rows.append(f"{rank[int(ev.user)]}\t{int(ev.ts)}\t[{', '.join(pool)}]")
    (bandit / "processed_events_shuffled_select100_max_observation_part2.dat").write_text("\n".join(rows) + "\n")
    labels = [catalog.cluster_of(str(u)) for u in users]
    (bandit / "user_friends.dat.mapped.cluster").write_text("\n".join(map(str, [0, *labels])) + "\n")
    (bandit / "user_relation_adjacency_list.dat.part.200.select.100").write_text(
        "\n".join(map(str, labels)) + "\n"
    )
    out = compare_with_authors_sample(catalog, bandit)
    json.dumps(out)  # plain JSON
    assert out["overlap"]["sample_pairs_in_ours_fraction"] == 1.0
    assert out["sample"]["positives_tagged_fraction"] == 1.0
    assert out["sample"]["ts_equals_first_tag_day_fraction"] == 1.0
    assert out["sample"]["negatives_tagged_by_user_fraction"] == 0.0
    assert out["clusters"]["ours_vs_banditlib_spectral_ari"] == 1.0
    assert out["sample"]["pool_sizes"] == {PARAMS["pool_size"]: catalog.n_events}


def test_compare_names_missing_sample_files(catalog, tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="user_friends.dat.mapped.cluster"):
        compare_with_authors_sample(catalog, tmp_path)


# --- doctests of the package (pytest's testpaths do not include producers/) ----------------


@pytest.mark.parametrize("module", ["raw", "features", "events", "clusters", "cache", "catalog", "compare"])
def test_doctests(module: str) -> None:
    mod = importlib.import_module(f"producers.lastfm.{module}")
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    result = doctest.testmod(mod, optionflags=flags)
    assert result.failed == 0
