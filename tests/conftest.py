"""Settings shared by every test folder.

- numpy math at d ≈ 25 is faster single-threaded (DESIGN §5), and tests must not fight over
  the 2 cores, so BLAS threads are pinned before anything imports numpy.
- Tests under ``tests/integration/`` get the ``integration`` marker automatically, so
  ``pytest -m 'not integration'`` runs the offline suite alone.
- Tests marked ``slow`` (the 10,000-example fuzz and schemathesis twins, the privacy audit's larger twins) run
  only when the ``-m`` expression names ``slow`` (``pytest -m slow tests/fuzz tests/privacy
  tests/integration/test_api_contract.py``) or ``PRIVREC_FUZZ_SLOW=1`` is set; the default run
  (``./scripts/test.sh``, whose ``-m`` is the configured ``not benchmark``) deselects them.
- At the end of the session (in the controller, once every pytest-xdist worker has finished), the run
  **fails if a process the tests started still runs**: a broker, redis-server, worker, web server or
  supervisor recorded by :mod:`pipeline.services` anywhere under the session's temporary directory
  (``*.service.json``), or any process whose environment names a state directory there
  (``PRIVREC_STATE_DIR``). Each one found is stopped by PID and named in the report.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

_INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)
    if "slow" in (config.getoption("markexpr", "") or "") or os.environ.get("PRIVREC_FUZZ_SLOW") == "1":
        return  # pytest's own -m selection decides (`-m slow` keeps them, `-m 'not slow'` drops them)
    drop = [item for item in items if item.get_closest_marker("slow") is not None]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


def _leaked(root: Path) -> list[tuple[str, int, str]]:
    """Live processes started under ``root``: ``(name, pid, where)``; each is stopped (by PID) on the way."""
    from pipeline import services
    from pipeline.services import ServiceHandle

    found: dict[int, tuple[str, int, str]] = {}
    for path in root.rglob("*.service.json"):
        try:
            handle = ServiceHandle.from_json(path.read_text())
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if services.is_running(handle):
            found[handle.pid] = (handle.name, handle.pid, str(path.parent))
            services.stop(handle, grace_seconds=2)
    # a process whose parent was just stopped may still be on its way out (a forked web server process ends
    # with its parent): give those 5 s
    deadline = time.monotonic() + 5.0
    while (alive := _with_state_dir(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid, cmd in alive.items():
        found.setdefault(pid, (cmd[:120], pid, "environment"))
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return sorted(found.values(), key=lambda f: f[1])


def _with_state_dir(root: Path) -> dict[int, str]:
    """Live processes (not zombies) whose environment has a ``PRIVREC_STATE_DIR`` under ``root``: pid -> command."""
    needle = f"PRIVREC_STATE_DIR={root}".encode()
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] != "Z" and any(v.startswith(needle) for v in env):
            out[int(entry.name)] = cmd
    return out


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a process the tests started is still alive (see the module docstring)."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks after every worker
        return
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    try:
        root = factory.getbasetemp().resolve()
    except OSError:
        return
    leaked = _leaked(root)
    if not leaked:
        return
    lines = [f"  {name} (pid {pid}) in {where}" for name, pid, where in leaked]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = "processes started by the tests were still running at the end (now stopped):\n" + "\n".join(lines)
    if reporter is not None:
        reporter.write_sep("=", "leaked processes", red=True)
        reporter.write_line(text)
    else:
        print(text)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
