"""Every command README.md and docs/*.md show is run by a test, with the smallest settings that exercise it.

The commands are read from the pages: each line of a shell code block (in a console transcript, only the ``$`` lines)
and each inline code span that starts with ``privrec``, ``.venv/bin/privrec``, ``./scripts/`` or ``python -m``. A
command is named by its program and subcommand (``privrec experiment modes``, ``python -m pipeline.apps.web``) and
the options it passes. :data:`COVERED` names, for each command, the tests that run it; the check fails when

* a page shows a command that :data:`COVERED` does not list (write the test, then add it here),
* a listed test does not exist, or
* an option a page shows is named by none of its tests' files (as ``--shuffle-batch``, or as the setting
  ``shuffle_batch`` where the test passes :class:`~pipeline.config.settings.Settings` to :func:`privrec.ops.up`).

Two commands are not run: ``./scripts/test.sh`` is this suite's runner (running it here would run the suite inside
itself), and ``./scripts/run.sh`` is ``privrec up --catalog lastfm`` followed by ``privrec replay lastfm``, each
run by the tests listed for it. The commands no other test ran are run, with their smallest settings, by
``tests/integration/test_documented_runs.py``; ``privrec up --help`` runs here. Every path a page names under
``tests/`` exists, too.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: Subcommands that take a second word (``privrec bench core``); the others take none (``privrec up``).
TWO_WORDS = {"bench", "experiment", "replay", "items"}

#: Not run, with the reason (the module docstring says more).
NOT_RUN = {
    "./scripts/test.sh": "the suite's own runner",
    "./scripts/run.sh": "privrec up --catalog lastfm, then privrec replay lastfm: each is covered below",
}


@dataclass(frozen=True)
class Command:
    """A command as a page shows it: ``name`` (program and subcommand), the ``options`` it passes, where it is."""

    name: str
    options: frozenset[str]
    text: str
    page: str


def _parse(text: str, page: str) -> Command | None:
    words = text.replace("[", " ").replace("]", " ").split()
    if not words:
        return None
    if words[0].endswith("bin/privrec"):
        words[0] = "privrec"
    if words[0] == "privrec":
        if len(words) < 2 or not re.fullmatch(r"[a-z][a-z0-9-]*", words[1]):
            return None  # "privrec (namespace ...)", output rather than a command
        if words[1] in TWO_WORDS:
            if len(words) < 3 or not re.fullmatch(r"[a-z][a-z0-9-]*", words[2]):
                return None  # "privrec bench ...": the family, whose members the pages show one by one
            depth = 3
        else:
            depth = 2
    elif words[0].startswith("./scripts/"):
        depth = 1
    elif words[:2] == ["python", "-m"] and len(words) > 2:
        depth = 3
    else:
        return None
    options = frozenset(w.split("=")[0] for w in words[depth:] if w.startswith("--"))
    return Command(" ".join(words[:depth]), options, " ".join(text.split()), page)


def documented_commands() -> list[Command]:
    """Every command the pages show, in page order (a command shown twice is listed twice)."""
    out: list[Command] = []
    for page in PAGES:
        text = page.read_text()
        name = str(page.relative_to(REPO))
        for lang, block in re.findall(r"```([a-z]*)\n(.*?)```", text, flags=re.S):
            if lang not in ("", "sh", "bash", "console", "shell"):
                continue
            lines = re.sub(r"\\\n\s*", " ", block).splitlines()
            if any(line.startswith("$ ") for line in lines):
                lines = [line[2:] for line in lines if line.startswith("$ ")]
            for line in lines:
                command = _parse(line.split(" #")[0].strip(), name)
                if command is not None:
                    out.append(command)
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for span in re.findall(r"`([^`]+)`", prose):
            if re.match(r"(\S*/)?privrec |\./scripts/|python -m ", span):
                command = _parse(span, name)
                if command is not None:
                    out.append(command)
    return out


_RUNS = "tests/integration/test_documented_runs.py"
_OPS = "tests/integration/test_ops.py"
_HTTP = "tests/integration/test_http.py"

#: command -> the tests (``path::name``) that run it. An option a page shows must appear in one of their files.
COVERED: dict[str, tuple[str, ...]] = {
    "privrec up": (
        f"{_OPS}::test_up_status_refuse_down_then_up_again",
        f"{_OPS}::test_invalid_settings_fail_before_anything_starts",
        "tests/integration/test_open_catalog.py::test_privrec_up_serves_a_catalog_directory",
        "tests/integration/test_least_privilege.py::test_external_redis_needs_the_users_or_no_acl",
        "tests/integration/test_local_shuffler.py::test_each_party_sees_only_its_part",
        "tests/integration/test_local_codewords_stack.py::test_a_replay_with_codewords_moves_the_released_b_and_the_served_scores",
        "tests/integration/test_federated_mode.py::test_ring_views_converge_to_the_average_at_the_spectral_rate",
        "tests/integration/test_pipeline.py::test_noise_off_stream_equals_offline_computation",
        "tests/integration/test_item_term.py::test_noise_off_released_item_sums_are_exact_and_served",
        "tests/component/test_documented_commands.py::test_up_help_lists_every_option_the_pages_pass_to_up",
        "tests/component/test_local_variants.py::test_explicit_flags_win_over_the_variant",
    ),
    "privrec settings": ("tests/component/test_settings_files.py::test_check_catches_a_stale_file_and_write_mends_it",),
    "privrec down": (f"{_OPS}::test_up_status_refuse_down_then_up_again",),
    "privrec status": (f"{_OPS}::test_up_status_refuse_down_then_up_again",
                       "tests/component/test_ops_offline.py::test_cli_has_up_status_down_with_settings_flags"),
    "privrec budget": (f"{_HTTP}::test_privrec_budget_and_token_commands_use_the_stacks_tokens",),
    "privrec token": (f"{_HTTP}::test_privrec_budget_and_token_commands_use_the_stacks_tokens",
                      f"{_RUNS}::test_token_operator"),
    "privrec items add": ("tests/integration/test_open_catalog.py::test_privrec_items_add_posts_a_file_of_items",),
    "privrec replay lastfm": ("tests/integration/test_replay.py::test_replay_writes_reward_ratio_and_learns",
                              "tests/integration/test_local_shuffler.py::test_the_lastfm_replay_reports_through_the_shuffler",
                              "tests/integration/test_fullgraph_stack.py::test_every_user_is_a_unit_and_the_release_stays_sparse",
                              f"{_RUNS}::test_replay_lastfm_without_listens",
                              f"{_RUNS}::test_replay_lastfm_local_with_devices"),
    "privrec replay events": ("tests/integration/test_open_catalog.py::test_replay_events_writes_the_ratio_and_baselines",),
    "privrec bench core": ("tests/unit/test_cli_experiment.py::test_bench_core_writes_json",),
    "privrec bench ingest": (f"{_RUNS}::test_bench_ingest",),
    "privrec bench serve": (f"{_RUNS}::test_bench_serve",),
    "privrec bench noise": (f"{_RUNS}::test_bench_noise",),
    "privrec bench acl": (f"{_RUNS}::test_bench_acl",),
    "privrec bench catalog": (f"{_RUNS}::test_bench_catalog",),
    "privrec bench all": (f"{_RUNS}::test_bench_all_quick",),
    "privrec bench population": (
        "tests/integration/test_bench_population.py::test_bench_population_at_two_tiny_sizes_loses_nothing_and_names_its_headline",),
    "privrec experiment table1": ("tests/unit/test_cli_experiment.py::test_table1_writes_every_output",
                                  "tests/unit/test_cli_experiment.py::test_table1_runs_the_mechanism_it_is_given",
                                  f"{_RUNS}::test_experiment_table1_quick"),
    "privrec experiment modes": ("tests/unit/test_cli_experiment.py::test_modes_writes_every_output_with_the_schema",
                                 "tests/unit/test_modes_local.py::test_the_json_has_the_issues_shape_with_local_rows_and_scaling",
                                 f"{_RUNS}::test_experiment_modes_quick"),
    "privrec experiment lastfm": (f"{_RUNS}::test_experiment_on_lastfm",),
    "privrec experiment fullgraph": (f"{_RUNS}::test_experiment_on_lastfm",),
    "privrec experiment relation": (f"{_RUNS}::test_experiment_on_lastfm",),
    "privrec experiment frontier": ("tests/component/test_frontier.py::test_frontier_cli_tiny",),
    "privrec experiment mechanisms": ("tests/unit/test_mechanisms_advanced.py::test_experiment_mechanisms_writes_every_output",),
    "privrec experiment userlevel": ("tests/component/test_user_level.py::test_experiment_userlevel_writes_every_output",),
    "python -m pipeline.apps.web": (f"{_HTTP}::test_recommend_feedback_release_budget",),
    "python -m pipeline.apps.worker": ("tests/integration/test_pipeline.py::test_noise_off_stream_equals_offline_computation",),
    "python -m pipeline.modes.local.shuffler_service": (
        "tests/integration/test_local_shuffler.py::test_the_shuffler_is_a_party_apart_in_redis_and_in_its_environment",),
    "python -m privrec.ops.supervise": ("tests/integration/test_supervisor.py::test_kill9_of_a_worker_is_restarted",),
    "python -m producers.lastfm": (f"{_RUNS}::test_producers_lastfm",),
}


def _test_exists(node: str) -> bool:
    path, _, name = node.partition("::")
    file = REPO / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text())
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in ast.walk(tree))


def _names_option(files: list[Path], option: str) -> bool:
    """One of ``files`` passes ``option``: as the flag (``"--shuffle-batch"``), or as its setting, by keyword
    (``shuffle_batch=``) or by environment variable (``PRIVREC_SHUFFLE_BATCH``)."""
    setting = option.removeprefix("--").replace("-", "_")
    pattern = re.compile(rf"""["']{re.escape(option)}["'=]|\b{setting}=|\bPRIVREC_{setting.upper()}\b""")
    return any(pattern.search(file.read_text()) for file in files)


COMMANDS = documented_commands()


def test_the_pages_show_commands() -> None:
    """The reader finds commands (a broken extraction would pass every check below vacuously)."""
    names = {c.name for c in COMMANDS}
    assert {"privrec up", "privrec experiment modes", "./scripts/run.sh"} <= names, sorted(names)


@pytest.mark.parametrize("name", sorted({c.name for c in COMMANDS}))
def test_each_documented_command_is_run_by_a_test(name: str) -> None:
    if name in NOT_RUN:
        return
    shown = [c for c in COMMANDS if c.name == name]
    assert name in COVERED, f"{name!r} is shown ({shown[0].page}: `{shown[0].text}`) but no test is listed as running it"
    nodes = COVERED[name]
    missing = [n for n in nodes if not _test_exists(n)]
    assert not missing, f"{name!r}: the listed tests do not exist: {missing}"
    files = sorted({REPO / n.partition("::")[0] for n in nodes})
    for command in shown:
        unnamed = sorted(o for o in command.options if not _names_option(files, o))
        assert not unnamed, (f"{command.page}: `{command.text}` passes {unnamed}, which none of the tests of "
                             f"{name!r} names ({', '.join(map(str, nodes))})")


def test_every_test_path_a_page_names_exists() -> None:
    named = {m for page in [*PAGES, REPO / "deploy" / "README.md"]
             for m in re.findall(r"tests/[\w/]+\.py", page.read_text())}
    missing = sorted(p for p in named if not (REPO / p).is_file())
    assert not missing, f"the pages name test files that do not exist: {missing}"


def _privrec(*args: str, tmp_path: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "privrec.cli", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)


def test_up_help_lists_every_option_the_pages_pass_to_up(tmp_path: Path) -> None:
    """``privrec up --help`` as shown; every ``privrec up`` option on the pages is one it knows."""
    proc = _privrec("up", "--help", tmp_path=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    shown = {o for c in COMMANDS if c.name == "privrec up" for o in c.options}
    unknown = sorted(o for o in shown if o not in proc.stdout)
    assert not unknown, f"the pages pass options `privrec up --help` does not list: {unknown}"
