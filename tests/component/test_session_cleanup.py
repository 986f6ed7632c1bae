"""The suite's own check that nothing it started survives it (``pytest_sessionfinish`` in ``tests/conftest.py``).

An inner pytest session, with the suite's ``tests/conftest.py``, runs a test that starts a tracked process
(:func:`pipeline.services.start_process`), or an untracked one whose environment names a state directory of
the session, and never stops it: the session must fail, name the process and leave it stopped. The same
session without the leak passes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).parents[1] / "conftest.py"

LEAKY = '''
from pipeline import services


def test_starts_and_forgets(tmp_path):
    services.start_process("forgotten", ["sleep", "120"], tmp_path)
'''

UNTRACKED = '''
import os
import subprocess


def test_starts_an_untracked_process(tmp_path):
    subprocess.Popen(["sleep", "121"], env={**os.environ, "PRIVREC_STATE_DIR": str(tmp_path)},
                     start_new_session=True)
'''

CLEAN = '''
from pipeline import services


def test_starts_and_stops(tmp_path):
    handle = services.start_process("tidy", ["sleep", "120"], tmp_path)
    services.stop(handle)
'''


def _inner(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--basetemp", str(tmp_path / "bt"), "-c", str(tmp_path / "pytest.ini"),
                           "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_a_leaked_process_fails_the_session_and_is_stopped(tmp_path: Path) -> None:
    run = _inner(tmp_path, LEAKY)
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "1 passed" in run.stdout and "leaked processes" in run.stdout, run.stdout
    found = re.search(r"forgotten \(pid (\d+)\)", run.stdout)
    assert found, run.stdout
    stat = Path(f"/proc/{found.group(1)}/stat")
    assert not stat.exists() or stat.read_text().split(") ")[1].startswith("Z")  # stopped (a zombie at most)


def test_an_untracked_process_with_a_state_dir_of_the_session_fails_it(tmp_path: Path) -> None:
    run = _inner(tmp_path, UNTRACKED)
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    found = re.search(r"sleep 121 \(pid (\d+)\) in environment", run.stdout)
    assert found, run.stdout
    stat = Path(f"/proc/{found.group(1)}/stat")
    assert not stat.exists() or stat.read_text().split(") ")[1].startswith("Z")


def test_a_session_that_stops_what_it_starts_passes(tmp_path: Path) -> None:
    run = _inner(tmp_path, CLEAN)
    assert run.returncode == pytest.ExitCode.OK, run.stdout + run.stderr
    assert "leaked processes" not in run.stdout
