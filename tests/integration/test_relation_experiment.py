"""``privrec experiment relation`` on the real LastFM files (if present) and a real redis-server: both relations
through the real ingest, release, solve and serving, with the same events and noise keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privrec.experiments.relation import RelationConfig, run_relation
from producers.lastfm.raw import data_dir_or_reason

DATA_DIR, WHY = data_dir_or_reason()

pytestmark = pytest.mark.skipif(DATA_DIR is None, reason=f"real LastFM data not available: {WHY}")


def test_the_relations_earn_the_same_on_the_same_events_and_noise(tmp_path: Path) -> None:
    """The add/remove relation changes the schedule and what the released hash carries, not the noise: on a busy
    replay (every tick has events) both relations release the same vectors, so every served ranking and every
    reward is the same — and the private runs differ from the non-private one (the noise is really on)."""
    cfg = RelationConfig(events=400, epsilons=(2.0, float("inf")), seeds=(3,), per_tick=50,
                         data_dir=str(DATA_DIR))
    doc = run_relation(cfg, tmp_path)
    res = doc["results"]
    assert res["2"]["add-remove"] == res["2"]["replace"]
    assert res["inf"]["add-remove"] == res["inf"]["replace"]
    assert all(v > 0 for v in res["2"]["add-remove"] + res["inf"]["add-remove"])
    assert res["2"]["add-remove"] != res["inf"]["add-remove"]  # (measured: 2.00 against 2.50 random play)
    stored = json.loads((tmp_path / "relation.json").read_text())
    assert stored["results"] == res and stored["events"] == 400
    md = (tmp_path / "relation.md").read_text()
    assert "| 2 | " in md and "| inf | " in md
