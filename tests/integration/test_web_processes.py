"""Serving that scales with cores: ``PRIVREC_WEB_PROCESSES=N`` forks N server processes on one port."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path

import pytest

from pipeline import services

from stacks import wait_for, web_stack

pytestmark = pytest.mark.integration

WORLD = {"PRIVREC_CATALOG": "synthetic", "PRIVREC_D": "5", "PRIVREC_N_USERS": "6", "PRIVREC_N_ARMS": "40",
         "PRIVREC_TICK_SECONDS": "0.3", "PRIVREC_LOGLEVEL": "WARNING", "PRIVREC_WEB_PROCESSES": "3"}


def _children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(entry.name))
    return out


def test_three_server_processes_share_the_port_and_end_with_the_parent(tmp_path: Path) -> None:
    with web_stack(tmp_path / "st", settings=WORLD) as st:
        parent = st.web.pid
        kids = wait_for(lambda: _children(parent) if len(_children(parent)) == 2 else None, 20, "two forked servers")
        seen = set()
        for _ in range(300):  # a new connection each time: the kernel spreads them over the processes
            with urllib.request.urlopen(st.base_url + "/healthz", timeout=5) as resp:
                seen.add(json.loads(resp.read())["pid"])
            if len(seen) == 3:
                break
        assert seen == {parent} | kids
        status, body = st.get_json("/recommend?user=1&k=3")
        assert status == 200 and len(body["items"]) == 3
        os.kill(parent, signal.SIGKILL)  # even without the parent's cleanup, its children go with it
        wait_for(lambda: not _children(parent) and not any(Path(f"/proc/{k}").exists() and
                                                            "Z" not in Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1][:3]
                                                            for k in kids), 10, "the forked servers to end")
        assert not services.is_running(st.web)
