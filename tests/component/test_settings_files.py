"""One source per setting: the flags, MODEL_FIELDS and the generated files all come from the declarations.

The committed env example, ConfigMap and docs table must be what ``privrec settings --write`` gives, so
a declaration edited without regenerating fails here; the renderers are shown to follow a declaration
(a setting added to a copy of ``Settings`` appears in every file), and ``--check`` to catch a stale file.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

import pytest

from pipeline.config.fields import GROUPS, declared, env_name, flag_name, info, setting
from pipeline.config.settings import MODEL_FIELDS, Settings, add_arguments
from privrec.cli import main
from privrec.ops import settings_files
from privrec.ops.settings_files import GENERATED, configmap, env_example, settings_table

REPO = Path(__file__).resolve().parents[2]

#: The model settings as they were before the declarations: stored namespaces compare against this set.
MODEL_SETTINGS = {
    "mode", "model", "hierarchy_shares", "privacy_relation", "local_algorithm", "local_mechanism", "local_capacity",
    "shuffle_batch", "local_codewords", "local_item_term", "sites", "topology", "fed_schedule", "consensus_kappa",
    "item_weight", "listen_weight", "item_share", "privacy_unit", "user_cap", "b_clip", "item_clip", "algorithm",
    "mechanism", "epsilon", "delta", "tree_levels", "catalog", "graph", "d", "n_users", "n_arms", "world_seed",
    "lambda_", "alpha", "noise_ridge", "prior_strength", "prior_reward", "partitions"}


@pytest.mark.parametrize("rel", sorted(GENERATED))
def test_the_committed_file_is_what_the_declarations_give(rel: str) -> None:
    assert (REPO / rel).read_text() == GENERATED[rel](), f"{rel} is out of date: run `privrec settings --write`"


def test_every_setting_is_declared_with_a_group_and_a_help() -> None:
    for f, meta in declared(Settings):
        assert meta.group in GROUPS and meta.help and not meta.help.endswith("."), f.name
    assert set(MODEL_FIELDS) == MODEL_SETTINGS


def test_every_setting_reaches_the_flags_the_example_and_the_table() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {a.dest: a for a in parser._actions if a.dest != "help"}
    example, table = env_example(), settings_table()
    for f, meta in declared(Settings):
        assert flags[f.name].option_strings == [flag_name(f.name)] and flags[f.name].default is None
        assert meta.help.split(";")[0] in " ".join(flags[f.name].help.split()), f.name
        assert f"{env_name(f.name)}=" in example, f.name
        assert f"| `{f.name}` |" in table, f.name
        model = f"| `{f.name}` | `{flag_name(f.name)}` `{env_name(f.name)}` | `{f.default!r}` | **model** |"
        assert (model in table) == meta.model, f.name


def test_a_new_declaration_appears_in_every_generated_file() -> None:
    extra = dataclasses.make_dataclass(
        "Extra", [("queue_depth", int, setting(7, group="operations", help="a made-up setting for this test"))],
        bases=(Settings,), frozen=True)
    assert info(dataclasses.fields(extra)[-1]).help == "a made-up setting for this test"
    assert "# a made-up setting for this test\nPRIVREC_QUEUE_DEPTH=7\n" in env_example(extra)
    assert '  PRIVREC_QUEUE_DEPTH: "7"\n' in configmap(extra)
    assert "| `queue_depth` | `--queue-depth` `PRIVREC_QUEUE_DEPTH` | `7` |" in settings_table(extra)
    assert "PRIVREC_QUEUE_DEPTH" not in env_example()


def test_secrets_stay_out_of_the_configmap() -> None:
    text = configmap()
    for f, meta in declared(Settings):
        assert (f"  {env_name(f.name)}:" in text) is (not meta.secret and f"\n{env_name(f.name)}=" in env_example()
                                                      or env_name(f.name) in settings_files.CONFIGMAP_OVERRIDES), f.name


def test_check_catches_a_stale_file_and_write_mends_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rel in GENERATED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    assert main(["settings", "--check", "--root", str(tmp_path)]) == 0
    example = tmp_path / "deploy" / "privrec.env.example"
    example.write_text(example.read_text().replace("PRIVREC_EPSILON=2.0", "PRIVREC_EPSILON=3.0"))
    assert main(["settings", "--check", "--root", str(tmp_path)]) == 1
    assert "deploy/privrec.env.example is out of date" in capsys.readouterr().err
    assert main(["settings", "--write", "--root", str(tmp_path)]) == 0
    assert "PRIVREC_EPSILON=2.0" in example.read_text()
    assert main(["settings", "--check", "--root", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["settings"]) == 0 and capsys.readouterr().out == settings_table()
