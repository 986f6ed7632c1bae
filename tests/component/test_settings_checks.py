"""Cross-field checks of local mode live with the devices' calibration (:class:`models.local.LocalConfig`); the
settings surface them as :class:`SettingsError` naming the setting, not the calibration's parameter."""

from __future__ import annotations

import pytest

from models.local.config import LocalConfig, LocalConfigError
from pipeline.config.settings import LOCAL_PARAMETERS, Settings, SettingsError

LOCAL = {"mode": "local", "n_users": 200, "n_arms": 40}


@pytest.mark.parametrize(("changes", "setting"), [
    ({"local_algorithm": "tree", "privacy_unit": "user", "local_mechanism": "laplace-l1"}, "privacy_unit"),
    ({"local_algorithm": "round", "shuffle_batch": 20, "local_codewords": 16, "user_cap": 2}, "shuffle_batch"),
    ({"local_algorithm": "tree", "shuffle_batch": 150}, "shuffle_batch"),
    ({"local_algorithm": "round", "shuffle_batch": 150, "local_codewords": 5000, "user_cap": 2}, "local_codewords"),
    ({"local_algorithm": "tree", "tick_seconds": float("inf")}, "tick_seconds"),
    ({"epsilon": float("inf")}, "epsilon"),
])
def test_a_local_calibration_error_names_the_setting(changes: dict[str, object], setting: str) -> None:
    with pytest.raises(SettingsError) as exc:
        Settings(**{**LOCAL, **changes})  # type: ignore[arg-type]
    assert exc.value.setting == setting and f"`{setting}`" in str(exc.value)


@pytest.mark.parametrize(("params", "parameter"), [
    ({"algorithm": "round", "shuffle_batch": 20, "codewords": 16, "unit": "user", "cap": 2}, "shuffle_batch"),
    ({"algorithm": "tree", "unit": "user", "mechanism": "laplace-l1"}, "unit"),
])
def test_check_runnable_names_the_parameter(params: dict[str, object], parameter: str) -> None:
    cfg = LocalConfig(d=4, epsilon=2.0, **params)  # type: ignore[arg-type]
    with pytest.raises(LocalConfigError) as exc:
        cfg.check_runnable()
    assert exc.value.parameter == parameter and parameter in LOCAL_PARAMETERS


def test_every_calibration_parameter_maps_to_a_setting() -> None:
    import dataclasses

    assert set(LOCAL_PARAMETERS) == {f.name for f in dataclasses.fields(LocalConfig)}
    assert set(LOCAL_PARAMETERS.values()) <= {f.name for f in dataclasses.fields(Settings)}
    LocalConfig(algorithm="round", d=4, epsilon=2.0, shuffle_batch=150, codewords=16, unit="user", cap=2).check_runnable()
