"""The setting ``local_item_term`` (local mode with codewords: the codebook is the catalog itself, and the messages'
histogram is also the item term): its conditions, its record in the namespace's config, and ``privrec up``'s check
against the catalog before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.settings import Settings, SettingsError

LOCAL = {"mode": "local", "local_algorithm": "round", "shuffle_batch": 150, "user_cap": 2, "catalog": "synthetic",
         "n_users": 200, "n_arms": 40}


@pytest.mark.parametrize("changes", [{"local_item_term": 2}, {"local_item_term": -1},
                                     {"local_item_term": 1, "local_codewords": 0}])
def test_the_item_term_needs_codewords_and_is_a_switch(changes: dict[str, int]) -> None:
    with pytest.raises(SettingsError) as err:
        Settings(**{**LOCAL, "local_codewords": 40, **changes})  # type: ignore[arg-type]
    assert err.value.setting == "local_item_term"


def test_it_is_recorded_only_when_on() -> None:
    assert "local_item_term" not in Settings(**LOCAL, local_codewords=40).model_config()  # type: ignore[arg-type]
    assert Settings(**LOCAL, local_codewords=40, local_item_term=1).model_config()["local_item_term"] == 1  # type: ignore[arg-type]


def test_up_refuses_a_codebook_that_is_not_the_catalog_before_starting_anything(tmp_path: Path) -> None:
    from privrec import ops

    settings = Settings(**LOCAL, local_codewords=39, local_item_term=1)  # type: ignore[arg-type]
    state = tmp_path / "stack"
    with pytest.raises(SettingsError, match="its number of items, 40, got 39") as err:
        ops.up(settings, state, timeout=5)
    assert err.value.setting == "local_codewords"
    assert not (state / "stack.json").exists()


def test_up_sizes_a_population_wide_batch_by_the_whole_population(tmp_path: Path) -> None:
    """With codewords a batch holds distinct users of every unit: it is refused only beyond the catalog's users (a
    per-unit bound would refuse any batch here, where every synthetic user is a unit of their own)."""
    from privrec import ops

    settings = Settings(**{**LOCAL, "shuffle_batch": 250}, local_codewords=40)  # type: ignore[arg-type]
    with pytest.raises(ops.OpsError, match="exceeds the 200 users"):
        ops.up(settings, tmp_path / "stack", timeout=5)
