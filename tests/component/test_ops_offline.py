"""Offline parts of ``privrec up/status/down``: child environments, the stack file, the CLI surface."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from pipeline.config.settings import Settings
from privrec import ops
from privrec.cli import build_parser


@pytest.mark.parametrize("settings", [
    Settings(),
    Settings(epsilon=math.inf, algorithm="colin", delta=1e-7, tick_seconds=0.1, alpha=0.0),
    Settings(epsilon=0.1, lambda_=0.3, namespace="demo", kafka="h:9092", redis_url="redis://h:6379/2",
             partitions=8, batch_size=5000, batch_seconds=0.02, data_dir="/data/lastfm", catalog="lastfm"),
], ids=["defaults", "noise_off_colin", "external_lastfm"])
def test_child_env_rebuilds_exactly_the_same_settings(settings: Settings) -> None:
    env = ops.child_env(settings, Path("/state"), base={"PATH": "/bin"})
    assert Settings.from_mapping({}, environ=env) == settings
    assert env["PRIVREC_STATE_DIR"] == "/state" and env["PATH"] == "/bin"


def test_child_env_drops_stale_variables_of_unset_settings() -> None:
    base = {"KAFKA_BOOTSTRAP": "stale:1", "REDIS_URL": "redis://stale", "PRIVREC_DATA_DIR": "/stale"}
    env = ops.child_env(Settings(kafka="k:1"), Path("/s"), base=base, loglevel="WARNING")
    assert env["KAFKA_BOOTSTRAP"] == "k:1"
    assert "REDIS_URL" not in env and "PRIVREC_DATA_DIR" not in env
    assert env["PRIVREC_LOGLEVEL"] == "WARNING"


def test_settings_are_written_as_json_with_inf_spelled_out() -> None:
    doc = ops.stackfile.settings_dict(Settings(epsilon=math.inf))
    text = json.dumps(doc, allow_nan=False)  # valid JSON, no bare Infinity
    assert json.loads(text)["epsilon"] == "inf"
    assert Settings.from_mapping(json.loads(text), environ={}).epsilon == math.inf
    assert set(doc) == {f.name for f in dataclasses.fields(Settings)}


def test_status_of_a_directory_without_a_stack(tmp_path: Path) -> None:
    st = ops.status(tmp_path)
    assert st["running"] is False and st["processes"] == {}
    assert {"kafka", "redis", "http", "processes"} <= set(st)
    assert "stack.json missing" in st["error"]


def test_down_of_a_missing_directory_stops_nothing(tmp_path: Path) -> None:
    assert ops.down(tmp_path / "never") == []
    assert not (tmp_path / "never").exists()


def test_corrupt_stack_file_is_reported_with_its_path(tmp_path: Path) -> None:
    (tmp_path / ops.STACK_FILE).write_text("{half")
    with pytest.raises(ops.OpsError, match="stack.json is not valid JSON"):
        ops.status(tmp_path)


@pytest.mark.parametrize("workers", [0, 5])
def test_worker_count_is_checked_before_anything(tmp_path: Path, workers: int) -> None:
    with pytest.raises(ops.OpsError, match=rf"`--workers` must be between 1 and the partition count \(4.*got {workers}"):
        ops.up(Settings(), tmp_path / "s", workers=workers)
    assert not (tmp_path / "s").exists()


def test_already_running_error_names_the_processes_and_the_way_out() -> None:
    err = ops.AlreadyRunningError(Path("/st"), {"kafka": 10, "worker-0": 12})
    assert "kafka pid 10, worker-0 pid 12" in str(err)
    assert "privrec down --state-dir /st" in str(err)


def test_state_dir_default_and_environment(tmp_path: Path) -> None:
    assert ops.default_state_dir({}) == Path(".privrec")
    assert ops.default_state_dir({"PRIVREC_STATE_DIR": str(tmp_path)}) == tmp_path


def test_cli_has_up_status_down_with_settings_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["up", "--workers", "2", "--epsilon", "inf", "--http-port", "0", "--kafka", "h:1"])
    assert (args.workers, args.epsilon, args.http_port, args.kafka) == (2, "inf", 0, "h:1")
    assert parser.parse_args(["status", "--json"]).json is True
    assert parser.parse_args(["down", "--grace", "3"]).grace == 3.0
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--http-port", "70000"])


def test_a_taken_http_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ops.OpsError, match=f"`--http-port` {port} is already in use"):
            ops.up(Settings(), tmp_path / "s", http_port=port)
    assert not (tmp_path / "s").exists()
