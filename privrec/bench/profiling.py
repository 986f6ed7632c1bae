"""Where a worker's time goes: cProfile summaries and py-spy samples sorted into categories."""

from __future__ import annotations

import pstats
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = ["SPY_RATE", "SPY_CATEGORIES", "cprofile_summary", "py_spy_binary", "spy_summary", "start_py_spy",
           "stop_py_spy"]


def cprofile_summary(path: Path, top: int = 30) -> dict[str, Any]:
    """Top functions of a cProfile dump by own and cumulative time."""
    stats = pstats.Stats(str(path))
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({func})", "calls": nc, "tottime_s": round(tt, 3),
                     "cumtime_s": round(ct, 3)})
    return {"tool": "cProfile (main thread only)", "total_s": round(stats.total_tt, 3),  # type: ignore[attr-defined]
            "by_tottime": sorted(rows, key=lambda r: -r["tottime_s"])[:top],
            "by_cumtime": sorted(rows, key=lambda r: -r["cumtime_s"])[:top]}


#: py-spy sampling rate (Hz) of ``--profile``.
SPY_RATE = 250

#: Leaf frames of a thread that waits (py-spy's own idle detection does not see them here).
SPY_IDLE = ("EpollSelector.select (selectors.py", "_worker (concurrent/futures/thread.py", "wait (threading.py",
            "select (selectors.py")

#: Where the worker's ingest time goes: the first category whose marker is in a sample's
#: stack wins, so the more specific markers come first.
SPY_CATEGORIES = (
    ("JSON decoding (json.loads)", ("json/decoder.py", "json/__init__.py", "_loads (pipeline/data/records.py")),
    ("parsing and validation (records.py): checks, numpy conversion, norm", ("parse_interaction", "parse_batch")),
    ("UnitStats.add (rank-1 updates of the statistics)", ("UnitStats.add",)),
    ("Redis commit (Lua script, sync client)", ("commit_partition",)),
    ("IngestProcessor.prepare: rest (sort, lists, vstack, stats copy)", ("IngestProcessor.prepare",)),
    ("Kafka fetch and record decoding (aiokafka)", ("aiokafka/",)),
    ("release/solve tick (leader timer, executor thread)", ("tick (pipeline/release/timers.py",)),
    ("status report, offsets commit, loop (agents.py)", ("pipeline/ingestion/agents.py",)),
)


def py_spy_binary() -> str | None:
    """``py-spy`` next to our interpreter or on ``PATH`` (``pip install py-spy``), else ``None``."""
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def start_py_spy(pid: int, path: Path) -> Any:
    import subprocess

    binary = py_spy_binary()
    assert binary is not None
    # raw (collapsed) stacks, every thread, on-CPU samples only (no --idle)
    return subprocess.Popen([binary, "record", "--pid", str(pid), "--rate", str(SPY_RATE), "--format", "raw",
                             "--threads", "--output", str(path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stop_py_spy(proc: Any) -> None:
    import signal

    proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    try:
        proc.wait(timeout=30)
    except Exception:
        proc.kill()
        proc.wait()


def spy_summary(path: Path, *, rate_hz: int = SPY_RATE, top: int = 25) -> dict[str, Any]:
    """Summarize a py-spy raw file: sampled seconds per thread, per category and per leaf frame.

    Samples are wall-clock stacks; those whose leaf frame waits (:data:`SPY_IDLE`) are
    dropped. A busy thread that the OS has descheduled (other jobs on the machine) still
    counts, so the shares within the main thread are the meaningful numbers.

    Examples
    --------
    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "s.raw"
    >>> _ = p.write_text("thread (1): MainThread;run (a.py:1);loads (json/__init__.py:346) 30\\n"
    ...                  "thread (1): MainThread;run (a.py:1);UnitStats.add (models/streaming.py:103) 10\\n")
    >>> s = spy_summary(p, rate_hz=100)
    >>> s["threads"], s["main_thread_categories"][0]
    ({'MainThread': 0.4}, {'category': 'JSON decoding (json.loads)', 'seconds': 0.3, 'share': 0.75})
    """
    from collections import Counter

    threads: Counter[str] = Counter()
    cats: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if frames[-1].startswith(SPY_IDLE):
            continue
        thread = frames[0].split(": ", 1)[-1]
        threads[thread] += n
        if thread != "MainThread":
            continue
        leaves[frames[-1]] += n
        for name, markers in SPY_CATEGORIES:
            if any(m in stack for m in markers):
                cats[name] += n
                break
        else:
            cats["other (faust, mode, asyncio loop)"] += n
    main = threads.get("MainThread", 0) or 1
    return {
        "tool": f"py-spy record --rate {rate_hz} --threads, ingest window only, waiting frames dropped",
        "threads": {t: round(c / rate_hz, 2) for t, c in threads.most_common()},
        "main_thread_categories": [{"category": c, "seconds": round(k / rate_hz, 2), "share": round(k / main, 3)}
                                   for c, k in cats.most_common()],
        "main_thread_top_frames": [{"frame": f, "seconds": round(k / rate_hz, 2), "share": round(k / main, 3)}
                                   for f, k in leaves.most_common(top)],
    }
