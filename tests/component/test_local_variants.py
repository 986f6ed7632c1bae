"""The local variants by name (models.local.config.VARIANTS): the table, ``variant_of``, and ``privrec up
--local-variant``'s settings (spelled out, overridden by explicit flags, refused when the run cannot be the variant)."""

from __future__ import annotations

from typing import Any

import pytest

from models.local.config import DEFAULT_VARIANT, VARIANTS, variant_of
from pipeline.config.settings import Settings, SettingsError
from privrec.commands.ops import _settings_of_variant


def _flags(**kw: Any) -> dict[str, Any]:
    """``privrec up``'s flags as argparse gives them: every setting unset unless named."""
    return {"mode": "local", "n_users": "400", "local_variant": None, **kw}


def test_the_default_variant_is_the_one_that_learns_and_the_only_non_research_one() -> None:
    assert DEFAULT_VARIANT == "shuffled-items"
    assert [n for n, v in VARIANTS.items() if not v.research] == [DEFAULT_VARIANT]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variants_config_is_named_back(name: str) -> None:
    assert variant_of(VARIANTS[name].config(d=4, epsilon=2.0)) == name


def test_local_mode_with_no_flag_runs_the_default_variant() -> None:
    settings = Settings.from_mapping(_flags(), environ={})
    assert variant_of(settings.local_config(settings.d)) == DEFAULT_VARIANT
    named = _settings_of_variant(_flags(local_variant=DEFAULT_VARIANT))
    assert named.local_config(named.d) == settings.local_config(settings.d)  # naming the default changes nothing


@pytest.mark.parametrize("name", ["tree", "round", "shuffled-vectors"])
def test_a_research_variant_sets_what_it_stands_for(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIVREC_SHUFFLE_BATCH", raising=False)
    settings = _settings_of_variant(_flags(local_variant=name))
    assert variant_of(settings.local_config(settings.d)) == name
    assert (settings.local_algorithm, settings.shuffle_batch, settings.local_codewords) == (
        VARIANTS[name].algorithm, VARIANTS[name].shuffle_batch, 0)


def test_explicit_flags_win_over_the_variant() -> None:
    settings = _settings_of_variant(_flags(local_variant="shuffled-vectors", shuffle_batch="50"))
    assert settings.shuffle_batch == 50 and variant_of(settings.local_config(settings.d)) == "shuffled-vectors"


def test_a_run_that_cannot_be_the_variant_is_refused_naming_it() -> None:
    with pytest.raises(SettingsError) as err:  # 10 synthetic users cannot fill a batch: the tree it would be
        _settings_of_variant(_flags(local_variant="shuffled-items", n_users="10"))
    assert err.value.setting == "local_variant" and "'tree'" in str(err.value)
    with pytest.raises(SettingsError, match="local mode only"):
        _settings_of_variant(_flags(local_variant="tree", mode="global"))
