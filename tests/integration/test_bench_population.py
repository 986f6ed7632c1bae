"""``privrec bench population`` end to end at tiny sizes: the live default stack (its own broker, redis-server,
worker and web server), the CLI's JSON and plot, nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from privrec.bench.population import HEADLINE

from stacks import REPO

pytestmark = pytest.mark.integration


def test_bench_population_at_two_tiny_sizes_loses_nothing_and_names_its_headline(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "privrec.cli", "bench", "population", "--sizes", "200,400",
                           "--active", "100", "--requests", "20", "--no-progress", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((out / "population.json").read_text())
    assert all(k in doc for k in HEADLINE)
    # every event released, or refused by the cap (a user's events straddling a fold: ingest batches of a wave of
    # 100 users rarely split one); nothing unaccounted
    assert doc["unaccounted_events"] == 0 and doc["lost_events"] == doc["capped_events"] <= 10
    assert [r["users"] for r in doc["rows"]] == [200, 400]
    assert all(r["released"] + r["capped_events"] == r["events"] and 3 * r["users"] <= r["events"] <= 5 * r["users"]
               for r in doc["rows"])
    # every user was folded once, and the leader's tick log saw every tick that folded
    assert sum(t.get("folded", 0) for t in doc["ticks"]) == 400
    assert doc["redis_marginal_bytes_per_user"] > 0 and doc["ingest_ratio"] > 0
    assert doc["settings"]["model"] == "hierarchy" and doc["settings"]["relation"] == "add-remove"
    assert doc["settings"]["privacy_unit"] == "user"
    assert (out / "population.png").stat().st_size > 10_000
