"""The documented commands that no other test runs, each through the CLI with the smallest settings it accepts.

``tests/component/test_documented_commands.py`` lists, for every command README.md and docs/ show, the test that
runs it; these are the ones run here. Each starts its own services (a broker, a redis-server, a worker, the web
server, as the command does), so they are integration tests. The assertions check what the command writes, not
its figures (those are the benchmarks' business, at their documented sizes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stacks import lastfm_data_or_skip, web_stack


def _privrec(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "privrec.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    return proc


def _written(proc: subprocess.CompletedProcess[str], path: Path) -> dict[str, Any]:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert path.is_file(), f"{path} was not written\n{proc.stdout[-2000:]}"
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict) and doc, doc
    return doc


def test_bench_noise(tmp_path: Path) -> None:
    """``privrec bench noise`` at its smallest (20 timed ticks)."""
    _written(_privrec("bench", "noise", "--ticks", "20", "--out", str(tmp_path), cwd=tmp_path), tmp_path / "noise.json")


def test_bench_acl(tmp_path: Path) -> None:
    """``privrec bench acl --out DIR`` with one round of 5 events and 5 requests a side."""
    _written(_privrec("bench", "acl", "--rounds", "1", "--batch", "5", "--block", "5", "--out", str(tmp_path),
                      cwd=tmp_path), tmp_path / "acl.json")


def test_bench_catalog(tmp_path: Path) -> None:
    """``privrec bench catalog --out DIR`` on a catalog of 200 items and 20 users, the build only."""
    _written(_privrec("bench", "catalog", "--items", "200", "--users", "20", "--no-serve", "--out", str(tmp_path),
                      cwd=tmp_path), tmp_path / "catalog.json")


def test_bench_ingest(tmp_path: Path) -> None:
    """``privrec bench ingest --events N --users U --out DIR`` at its smallest (1,000 events, 10 users, one
    phase)."""
    _written(_privrec("bench", "ingest", "--events", "1000", "--users", "10", "--no-concurrent", "--no-two-workers",
                      "--out", str(tmp_path), cwd=tmp_path), tmp_path / "ingest.json")


def test_bench_serve(tmp_path: Path) -> None:
    """``privrec bench serve --concurrency 8 --duration D --repeats R --out DIR`` with one 1-second run."""
    _written(_privrec("bench", "serve", "--concurrency", "8", "--duration", "1", "--repeats", "1", "--warmup", "0",
                      "--events", "50", "--no-peers", "--out", str(tmp_path), cwd=tmp_path), tmp_path / "serve.json")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_experiment_modes_quick(tmp_path: Path) -> None:
    """``privrec experiment modes --quick`` exactly as the docs show it: about 17 minutes, so ``slow``; the default run
    has its whole grid at the smallest sizes (``tests/unit/test_modes_uncalibrated.py``)."""
    lastfm_data_or_skip()
    _written(_privrec("experiment", "modes", "--quick", "--no-progress", "--out", str(tmp_path), cwd=tmp_path,
                      timeout=1400), tmp_path / "modes.json")


@pytest.mark.slow
def test_bench_all_quick(tmp_path: Path) -> None:
    """``privrec bench all --quick --out DIR`` (every benchmark at its quick size, minutes: marked ``slow``), with
    the smallest ingest phase it accepts."""
    proc = _privrec("bench", "all", "--quick", "--ingest-events", "1000", "--out", str(tmp_path), cwd=tmp_path,
                    timeout=1800)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert [p for p in tmp_path.iterdir() if p.suffix == ".json"], "no JSON result written"


@pytest.mark.slow
def test_experiment_table1_quick(tmp_path: Path) -> None:
    """``privrec experiment table1 --quick --out DIR``, as the README shows it: 2–3 minutes, so ``slow``; the default
    run has table1 on tiny settings (``tests/unit/test_cli_experiment.py``)."""
    proc = _privrec("experiment", "table1", "--quick", "--no-progress", "--out", str(tmp_path), cwd=tmp_path,
                    timeout=1200)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert [p for p in tmp_path.iterdir() if p.suffix == ".json"], "no JSON result written"


def test_replay_lastfm_without_listens(tmp_path: Path) -> None:
    """``privrec replay lastfm --no-listens`` against a running global stack, 40 events."""
    data = lastfm_data_or_skip()
    settings = {"PRIVREC_CATALOG": "lastfm", "PRIVREC_DATA_DIR": str(data), "PRIVREC_TICK_SECONDS": "0.3",
                "PRIVREC_LOGLEVEL": "WARNING"}
    with web_stack(tmp_path / "stack", settings=settings) as st:
        proc = _privrec("replay", "lastfm", "--events", "40", "--no-listens", "--http", st.base_url, "--out",
                        str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
        doc = _written(proc, tmp_path / "out" / "replay.json")
    assert doc["events"] == 40


def test_replay_lastfm_local_with_devices(tmp_path: Path) -> None:
    """``privrec replay lastfm --mode local --devices DIR``: the devices' state is kept in DIR (the ``round`` variant:
    a stack without the shuffler service, which the shuffled variants need)."""
    data = lastfm_data_or_skip()
    settings = {"PRIVREC_CATALOG": "lastfm", "PRIVREC_DATA_DIR": str(data), "PRIVREC_MODE": "local",
                "PRIVREC_LOCAL_ALGORITHM": "round", "PRIVREC_SHUFFLE_BATCH": "0", "PRIVREC_TICK_SECONDS": "0.3",
                "PRIVREC_LOGLEVEL": "WARNING", "PRIVREC_PRIVACY_UNIT": "event"}
    devices = tmp_path / "devices"
    with web_stack(tmp_path / "stack", settings=settings) as st:
        proc = _privrec("replay", "lastfm", "--mode", "local", "--devices", str(devices), "--events", "40", "--http",
                        st.base_url, "--out", str(tmp_path / "out"), "--no-baselines", "--no-progress", cwd=tmp_path)
        _written(proc, tmp_path / "out" / "replay.json")
    assert devices.is_dir() and any(devices.iterdir()), "no device state was kept in --devices"


@pytest.mark.parametrize("name, args", [
    ("lastfm", ["--quick", "--events", "300", "--runs", "1", "--epsilons", "2", "--jobs", "1"]),
    ("fullgraph", ["--events", "200", "--runs", "1"]),
    ("relation", ["--events", "200", "--seeds", "1", "--epsilons", "2"]),
], ids=["lastfm", "fullgraph", "relation"])
def test_experiment_on_lastfm(tmp_path: Path, name: str, args: list[str]) -> None:
    """``privrec experiment lastfm --quick`` / ``fullgraph`` / ``relation`` with ``--out DIR``, on a few hundred
    events and one seed."""
    data = lastfm_data_or_skip()
    proc = _privrec("experiment", name, *args, "--data-dir", str(data), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert [p for p in (tmp_path / "out").iterdir() if p.suffix == ".json"], "no JSON result written"


@pytest.mark.parametrize("command", ["build", "compare"])
def test_producers_lastfm(tmp_path: Path, command: str) -> None:
    """``python -m producers.lastfm build|compare --data-dir D --cache-dir C --seed S --positives P`` (and
    ``--no-cache``): each prints its manifest as JSON."""
    data = lastfm_data_or_skip()
    for cache in (["--cache-dir", str(tmp_path / "cache")], ["--no-cache"]):
        proc = subprocess.run([sys.executable, "-m", "producers.lastfm", command, "--data-dir", str(data), *cache,
                               "--seed", "0", "--positives", "tagged"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert isinstance(json.loads(proc.stdout), dict)


def test_token_operator(tmp_path: Path) -> None:
    """``privrec token --operator --state-dir D`` prints the stack's operator token (``tokens.json``, as ``privrec
    up`` makes it)."""
    from privrec.ops.stackfile import stack_tokens

    tokens = stack_tokens(tmp_path, {})
    proc = _privrec("token", "--operator", "--state-dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == tokens.operator
