"""The pure parts of ``privrec bench serve``, ``bench ingest`` and ``bench all``: wrk output parsing, request
paths, the ratios to the minimal endpoint and their verdicts, the second worker's share, and the rendering of
the summary and of bench.md. Nothing here starts a process or times anything."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from privrec.bench import all as bench_all
from privrec.bench import ingest, serve

WRK_US = """\
Running 3s test @ http://127.0.0.1:40000
  1 threads and 8 connections
  Latency Distribution
     50%  812.00us
     75%    1.01ms
     90%    1.20ms
     99%    1.50s
  12000 requests in 3.00s, 10.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 7
Requests/sec:   4000.50
"""


def run(target: str, rps: float, *, c: int = 8, p99: float = 2.0, cpu: float | None = None, non_2xx: int = 0,
        rep: int = 0) -> dict[str, Any]:
    r: dict[str, Any] = {"target": target, "concurrency": c, "duration_s": 5.0, "p50_ms": p99 / 2, "p90_ms": p99 * 0.8,
                         "p99_ms": p99, "requests_per_s": rps, "non_2xx": non_2xx, "repeat": rep}
    if cpu is not None:
        r["server_cpu_us_per_request"] = cpu
    return r


# ---------------------------------------------------------------------------------------------------------------
# wrk output and request paths
# ---------------------------------------------------------------------------------------------------------------


def test_parse_wrk_reads_every_unit_and_the_error_counts() -> None:
    out = serve.parse_wrk(WRK_US)
    assert out["p50_ms"] == 0.812
    assert out["p75_ms"] == 1.01
    assert out["p99_ms"] == 1500.0
    assert out["requests_per_s"] == 4000.5
    assert out["requests"] == 12000
    assert out["non_2xx"] == 7
    assert out["socket_errors"] == "connect 0, read 2, write 0, timeout 1"


def test_parse_wrk_without_errors_counts_zero_non_2xx() -> None:
    out = serve.parse_wrk(serve._WRK_SAMPLE)
    assert (out["non_2xx"], out["socket_errors"], out["requests"]) == (0, None, 23457)


@pytest.mark.parametrize("missing", ["99%", "Requests/sec"])
def test_parse_wrk_refuses_output_without_a_needed_line(missing: str) -> None:
    text = "\n".join(line for line in serve._WRK_SAMPLE.splitlines() if missing not in line)
    with pytest.raises(ValueError, match="wrk output has no"):
        serve.parse_wrk(text)


@pytest.mark.parametrize("text,ms", [("250us", 0.25), ("3.5ms", 3.5), ("2s", 2000.0), ("1m", 60000.0)])
def test_wrk_durations_in_ms(text: str, ms: float) -> None:
    assert serve._ms(text) == ms


def test_wrk_duration_without_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot read a wrk duration"):
        serve._ms("12")


@pytest.mark.parametrize("value", ["", "0", "4,-1", "a,b"])
def test_concurrency_list_refuses_non_positive_or_non_integers(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated positive integers"):
        serve._int_list(value)


def test_concurrency_list() -> None:
    assert serve._int_list("1, 4,8,") == [1, 4, 8]


@pytest.mark.parametrize("k", [25, 1000])
def test_request_paths_name_k_distinct_candidates_of_the_catalog(k: int) -> None:
    arms = [str(a) for a in range(1000)]
    paths = serve.request_paths(["3", "7"], arms, 50, seed=1, k_candidates=k)
    assert len(paths) == 50
    for path in paths:
        head, cands = path.split("&candidates=")
        assert head in ("/recommend?user=3&k=10", "/recommend?user=7&k=10")
        ids = cands.split(",")
        assert len(ids) == len(set(ids)) == k
        assert set(ids) <= set(arms)
    assert paths == serve.request_paths(["3", "7"], arms, 50, seed=1, k_candidates=k)
    assert paths != serve.request_paths(["3", "7"], arms, 50, seed=2, k_candidates=k)


def test_k1000_request_line_fits_aiohttp_default_line_limit() -> None:
    # synthetic arm ids are "0".."999": the GET form carries K = 1,000 under aiohttp's 8,190-byte request line
    path = serve.request_paths(["0"], [str(a) for a in range(1000)], 1, k_candidates=1000)[0]
    assert len(f"GET {path} HTTP/1.1") < 8190


def test_lua_script_cycles_through_every_path() -> None:
    paths = ["/recommend?user=1&k=10&candidates=a,b", "/recommend?user=2&k=10&candidates=c,d"]
    script = serve._lua_script(paths)
    assert all(f'"{p}"' in script for p in paths)
    assert "i = i % #paths + 1" in script
    assert 'wrk.format("GET", paths[i])' in script


# ---------------------------------------------------------------------------------------------------------------
# medians, ratios and verdicts
# ---------------------------------------------------------------------------------------------------------------


def test_median_run_takes_medians_and_sums_non_2xx() -> None:
    runs = [run("recommend_k25", r, p99=p, non_2xx=e) for r, p, e in ((100.0, 9.0, 0), (300.0, 1.0, 2), (200.0, 3.0, 1))]
    m = serve._median_run(runs)
    assert (m["requests_per_s"], m["p99_ms"], m["non_2xx"], m["repeats"]) == (200.0, 3.0, 3, 3)


def test_compare_at_ratios_use_medians_of_one_concurrency_only() -> None:
    runs = [run("recommend_k25", r, rep=i) for i, r in enumerate((2000.0, 3000.0, 9000.0))]
    runs += [run("minimal", r, rep=i) for i, r in enumerate((6000.0, 5000.0, 4000.0))]
    runs += [run("recommend_k1000", 1000.0), run("recommend_k25", 1.0, c=32), run("minimal", 1e6, c=32)]
    out = serve.compare_at(runs, 8)
    assert out["connections"] == 8
    assert out["recommend_k25"]["requests_per_s"] == 3000.0
    assert out["minimal"]["requests_per_s"] == 5000.0
    assert (out["ratio_k25"], out["ratio_k1000"]) == (0.6, 0.2)
    assert serve.compare_at(runs, 32)["ratio_k25"] == 0.0  # 1 / 1e6, rounded


def test_compare_at_cpu_ratio_is_minimal_cost_over_recommend_cost() -> None:
    runs = [run("recommend_k25", 3000.0, cpu=250.0), run("recommend_k1000", 1000.0, cpu=1000.0),
            run("minimal", 9000.0, cpu=50.0)]
    out = serve.compare_at(runs, 8)
    assert (out["cpu_ratio_k25"], out["cpu_ratio_k1000"]) == (0.2, 0.05)


def test_compare_at_without_the_minimal_endpoint_is_refused() -> None:
    with pytest.raises(ValueError, match="need both recommend_k25 and minimal"):
        serve.compare_at([run("recommend_k25", 3000.0)], 8)
    with pytest.raises(ValueError, match="at 4 connections"):
        serve.compare_at([run("recommend_k25", 3000.0), run("minimal", 5000.0)], 4)


@pytest.mark.parametrize("ratio,p99,non_2xx,expected", [
    (0.4, 5.0, 0, (True, True)),      # both bounds are inclusive
    (0.399, 5.0, 0, (False, True)),
    (0.8, 5.01, 0, (True, False)),
    (0.8, 1.0, 3, (True, False)),     # an error answer fails the latency target
])
def test_peer_verdict_bounds(ratio: float, p99: float, non_2xx: int, expected: tuple[bool, bool]) -> None:
    v = serve.peer_verdict(ratio, p99, non_2xx)
    assert (v["ratio_k25"], v["p99_ms"]) == expected
    assert v["both"] == all(expected)  # the whole target needs each condition


def test_peer_summary_verdicts_come_from_k25_at_8_connections() -> None:
    runs = [run("recommend_k25", 1000.0, p99=2.0), run("minimal", 10000.0, p99=0.5),
            run("recommend_k1000", 500.0, p99=50.0),
            run("recommend_k25", 9000.0, c=32, p99=9.0), run("minimal", 10000.0, c=32)]
    s = serve.peer_summary(runs)
    assert s["connections"] == 8
    assert s["ratio_k25"] == 0.1
    assert s["met"] == {"ratio_k25": False, "p99_ms": True, "both": False}
    assert s["target"] == {"ratio_k25": 0.4, "p99_ms": 5.0}


def test_serve_headline_is_the_fastest_level_meeting_p99() -> None:
    levels = [dict(run("recommend_k25", r, c=c, p99=p)) for c, r, p in ((1, 1500.0, 1.0), (8, 4000.0, 3.0),
                                                                         (32, 5500.0, 8.0))]
    v = serve._verdict(levels)
    assert (v["concurrency"], v["requests_per_s"], v["target_met"]) == (8, 4000.0, True)
    slow = [dict(run("recommend_k25", 1500.0, c=1, p99=6.0)), dict(run("recommend_k25", 1900.0, c=8, p99=7.0))]
    v = serve._verdict(slow)
    assert (v["concurrency"], v["target_met"]) == (1, False)


def _serve_doc(ratio_runs: list[dict[str, Any]]) -> dict[str, Any]:
    k25 = [r for r in ratio_runs if r["target"] == "recommend_k25"]
    by = [serve._median_run([r for r in k25 if r["concurrency"] == c]) for c in sorted({r["concurrency"] for r in k25})]
    return {"settings": {"repeats": 1, "duration_s": 5.0}, "by_concurrency": by, **serve._verdict(by),
            "machine": {"loadavg_before": [0.0], "loadavg_after": [1.0], "python_speed_us": 9.0},
            "peers": serve.peer_summary(ratio_runs),
            "peers_by_concurrency": [serve.compare_at(ratio_runs, c) for c in (1, 8)]}


def test_summary_lines_show_every_server_at_every_level_and_the_verdicts() -> None:
    runs = [run(t, r, c=c, cpu=u, p99=p) for c in (1, 8) for t, r, u, p in
            (("recommend_k25", 2000.0, 300.0, 2.0), ("recommend_k1000", 800.0, 1200.0, 7.0),
             ("minimal", 8000.0, 60.0, 0.4))]
    text = "\n".join(serve.summary_lines(_serve_doc(runs)))
    rows = [line for line in text.splitlines() if "/recommend K =" in line or "minimal endpoint " in line]
    assert len(rows) == 6  # three servers at two levels
    assert "0.250" in text and "0.100" in text  # req/s ratios K = 25 and K = 1,000
    assert "0.200" in text and "0.050" in text  # cpu ratios
    assert "K = 25 0.250 (target >= 0.4: MISSED)" in text
    assert "p99 at K = 25 2.00 ms (target <= 5 ms: met)" in text
    assert text.splitlines()[-1] == ("verdict (issue 24, K = 25 at 8 connections): ratio 0.250 >= 0.4 and p99 2.00 ms "
                                     "<= 5 ms: MISSED (yardstick 9.0 µs)")  # the whole target: the ratio misses
    assert "machine yardstick sum(range(1000)) = 9.0 µs" in text


def test_summary_lines_without_peers_stop_after_the_headline() -> None:
    runs = [run("recommend_k25", 2000.0, c=8), run("minimal", 8000.0, c=8)]
    doc = _serve_doc([*runs, run("recommend_k25", 1000.0, c=1), run("minimal", 1.0, c=1)])
    del doc["peers"], doc["peers_by_concurrency"]
    lines = serve.summary_lines(doc)
    assert lines[-1].startswith("headline (C=8)")


# ---------------------------------------------------------------------------------------------------------------
# ingest: the second worker's share and the CPU in use
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("one,two,share", [(100_000.0, 160_000.0, 0.6), (100_000.0, 100_000.0, 0.0),
                                           (50_000.0, 40_000.0, -0.2), (0.0, 5.0, None), (None, 5.0, None),
                                           (5.0, None, None)])
def test_second_worker_share(one: float | None, two: float | None, share: float | None) -> None:
    assert ingest.second_worker_share(one, two) == share


def test_cpu_use_sums_the_processes_and_divides_by_the_window() -> None:
    out = ingest.cpu_use({"worker-0": 2.0, "worker-1": 1.5, "kafka": 0.4, "redis": 0.1}, 2.5)
    assert out["cpu_seconds_total"] == 4.0
    assert out["cpu_busy_cores"] == 1.6
    with pytest.raises(ValueError, match="`wall_s` must be positive, got 0"):
        ingest.cpu_use({"worker-0": 1.0}, 0)


def busy_samples() -> list[tuple[float, list[int], dict[str, float]]]:
    """Worker a owns partitions 0 and 1, b owns 2; a is done at t = 3 (offsets 300 + 100), b at t = 4."""
    rows = [(0.0, [50, 0, 0], 0.0, 0.0), (1.0, [100, 20, 60], 0.9, 0.8), (2.0, [200, 60, 120], 1.9, 1.7),
            (3.0, [300, 100, 180], 2.8, 2.5), (4.0, [300, 100, 250], 2.8, 3.4)]
    return [(t, offs, {"a": ca, "b": cb}) for t, offs, ca, cb in rows]


def test_both_busy_window_ends_when_the_first_worker_is_done() -> None:
    w = ingest.both_busy_window(busy_samples(), {"a": [0, 1], "b": [2]}, 0.5)
    assert w is not None
    assert (w["events"], w["seconds"], w["events_per_s"], w["ended_by"]) == (400, 2.0, 200.0, "a")
    assert w["cpu_seconds"] == {"a": 1.9, "b": 1.7}


def test_both_busy_window_is_none_when_a_worker_had_nothing_left() -> None:
    # b's partition was drained before the group settled: no window where both work
    samples = [(t, [o, 500], {"a": 0.0, "b": 0.0}) for t, o in ((0.0, 0), (1.0, 100), (2.0, 200))]
    assert ingest.both_busy_window(samples, {"a": [0], "b": [1]}, 0.0) is None
    assert ingest.both_busy_window(busy_samples(), {"a": [0, 1], "b": [2]}, 9.0) is None  # no sample after t_start
    assert ingest.both_busy_window(busy_samples(), {"a": [0, 1], "b": [2]}, 2.5) is None  # 0 s < min_seconds


# ---------------------------------------------------------------------------------------------------------------
# bench all: one row per target, verdicts, bench.md
# ---------------------------------------------------------------------------------------------------------------


def _all_doc() -> dict[str, Any]:
    runs = [run("recommend_k25", 3000.0, p99=6.0), run("recommend_k1000", 1000.0, p99=9.0), run("minimal", 5000.0)]
    return {
        "machine": {"python_speed_us": 9.1}, "machine_after": {"python_speed_us": 9.3},
        "ingest": {"summary": {"end_to_end_events_per_s": 45_000.0, "consume_json_events_per_s": 180_000.0,
                               "ratio_end_to_end_to_consume_json": 0.25, "ratio_ingest_to_consume_json": 0.6,
                               "ingest_events_per_s": 100_000.0, "two_workers_ingest_events_per_s": 170_000.0,
                               "second_worker_share": 0.7, "two_workers_share_bound_from_balance": 0.66,
                               "second_worker_share_until_all": 0.3,
                               "two_workers_cpu_busy_cores": 1.9}},
        "serve": {"peers": serve.peer_summary(runs), "requests_per_s": 4000.0, "p99_ms": 3.0, "concurrency": 8,
                  "target_met": True},
        "freshness": {"p50_s": 1.2, "p99_s": 1.9},
        "scale": {"error": "Traceback: boom"},
    }


def test_target_rows_verdicts() -> None:
    rows = {r[0]: r for r in bench_all.target_rows(_all_doc())}
    assert rows["end-to-end ingest / (consume + json.loads), one worker"][3] == "**missed**"
    second = rows["the second worker's share of the first's rate"]
    assert second[3] == "met"
    assert "170,000 vs 100,000" in second[1] and "caps at 0.66" in second[1] and "1.9 of 2 cores busy" in second[1]
    assert "until all are committed 0.3," in second[1]
    assert rows["one worker end-to-end (issue 3)"][3] == "met"
    assert rows["/recommend K = 25 / minimal aiohttp endpoint, 8 connections"][3] == "met"  # 0.6
    assert rows["/recommend K = 25 p99, 8 connections"][3] == "**missed**"  # 6 ms
    assert rows["/recommend K = 25 headline (issue 4)"][3] == "met"
    assert "1,000 requests/s, p99 9 ms, 0.2 of the minimal endpoint" in rows[
        "/recommend K = 1,000, 8 connections (reported)"][1]
    assert rows["freshness p50 (feedback -> serving model)"][3] == "**missed**"
    assert rows["100,000 users: warm release + solve"][3] == "not measured"


def test_target_rows_of_an_empty_run_are_all_unmeasured() -> None:
    verdicts = {r[3] for r in bench_all.target_rows({})}
    assert verdicts <= {"not measured", "—"}


@pytest.mark.parametrize("value,target,at_most,expected", [(0.6, 0.6, False, "met"), (0.59, 0.6, False, "**missed**"),
                                                           (5.0, 5.0, True, "met"), (5.1, 5.0, True, "**missed**"),
                                                           (None, 1.0, False, "not measured")])
def test_all_verdict(value: float | None, target: float, at_most: bool, expected: str) -> None:
    assert bench_all._verdict(value, target, at_most=at_most) == expected


def test_markdown_has_one_table_row_per_target_and_names_errors() -> None:
    doc = _all_doc()
    md = bench_all._markdown(doc)
    lines = md.splitlines()
    header = lines.index("| target | measured | bound | verdict |")
    body = []
    for line in lines[header + 2:]:
        if not line.startswith("| "):
            break
        body.append(line)
    assert len(body) == len(bench_all.target_rows(doc))
    assert all(line.count(" | ") == 3 for line in body)
    assert "| the second worker's share of the first's rate |" in md
    assert "9.1 µs before, 9.3 µs after" in md
    assert "| scale | see scale/ (error: Traceback: boom) |" in md
    assert "| serve | see serve/ (ok) |" in md
