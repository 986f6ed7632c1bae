"""LastFM through the generic catalog path: its export, built as any directory, is LastFM exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.data.catalog import LastFMCatalogAdapter, load_catalog
from pipeline.data.catalog_open import LastFMOpenCatalog
from pipeline.config.settings import Settings
from producers.catalog import read_events
from producers.lastfm import load_catalog as load_lastfm
from producers.lastfm.raw import data_dir_or_reason

DATA_DIR, WHY = data_dir_or_reason()

pytestmark = pytest.mark.skipif(DATA_DIR is None, reason=f"real LastFM data not available: {WHY}")


def test_the_generic_path_gives_lastfm_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIVREC_CACHE_DIR", str(tmp_path / "cache"))
    lf = load_lastfm(DATA_DIR, progress=False)
    old = LastFMCatalogAdapter(lf)
    new = load_catalog(Settings.from_mapping({"catalog": "lastfm", "data_dir": str(DATA_DIR)}))
    assert isinstance(new, LastFMOpenCatalog) and new.name == "lastfm"
    assert list(new.arm_ids) == list(old.arm_ids)
    assert np.array_equal(new.feature_matrix, old.feature_matrix)  # features read back bit for bit
    assert np.array_equal(np.asarray(new.W), np.asarray(old.W))  # CoLin's W from users.csv units + edges.csv
    assert all(new.unit_of(u) == old.unit_of(u) for u in lf.users)
    assert new.fingerprint == old.fingerprint  # namespaces made before keep working
    assert list(new.default_pool) == list(old.default_pool) and new.arm_name("52") == old.arm_name("52")
    assert 0 <= new.unit_of("someone new") < 100  # and a new user is served (the public rule)
    # the export's events.csv is the replay's stream, in LastFM's replay order
    root = Path(new.built.root)
    ev = read_events(root / "events.csv")
    arrays = lf.event_arrays()
    assert len(ev.users) == lf.n_events and ev.items[:100] == [str(a) for a in arrays.arms[:100]]
    assert np.array_equal(ev.times, np.arange(lf.n_events, dtype=np.float64))
