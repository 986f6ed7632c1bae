"""deploy/ stays consistent with the code: setting names, values, commands, unit and compose syntax.

The files cannot be run here (no Docker engine, no Kafka cluster, systemd is not PID 1); these
checks catch the drift that would break them: a renamed setting, an invalid default, a command
or flag that no longer exists.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.settings import Settings, env_name

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DEPLOY_FILES = [p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "NOTES-broker.md"]
SETTING_VARS = {env_name(f.name) for f in dataclasses.fields(Settings)}
#: Process-level variables (not settings) that deploy files may set; each must be read by the code.
PROCESS_VARS = {"PRIVREC_WORKER_ID", "PRIVREC_STATE_DIR", "PRIVREC_LOGLEVEL", "PRIVREC_HTTP_HOST",
                "PRIVREC_HTTP_PORT", "PRIVREC_CACHE_DIR", "PRIVREC_METRICS_ADDR", "PRIVREC_METRICS_PORT"}


def _env_example() -> dict[str, str]:
    out = {}
    for line in (DEPLOY / "privrec.env.example").read_text().splitlines():
        m = re.match(r"^#?([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = m.group(2)
    return out


def _source() -> str:
    return "\n".join(p.read_text() for pkg in ("pipeline", "producers", "privrec")
                     for p in (REPO / pkg).rglob("*.py"))


def test_env_example_names_every_setting_with_a_valid_value() -> None:
    example = _env_example()
    assert SETTING_VARS <= set(example), f"missing from privrec.env.example: {sorted(SETTING_VARS - set(example))}"
    active = {k: v for k, v in example.items() if v}
    settings = Settings.from_mapping({}, environ=active)  # raises SettingsError on a bad value
    defaults = Settings()
    for f in dataclasses.fields(Settings):  # the example documents the defaults, except the endpoints
        if f.name not in ("kafka", "redis_url", "data_dir"):
            assert getattr(settings, f.name) == getattr(defaults, f.name), f.name


def test_every_privrec_variable_in_deploy_is_known_and_read_by_the_code() -> None:
    source = _source()
    for var in PROCESS_VARS:
        assert var in source, f"{var} is set by deploy/ but no code reads it"
    for path in DEPLOY_FILES:
        used = set(re.findall(r"\bPRIVREC_[A-Z0-9_]*[A-Z0-9_]", path.read_text()))
        unknown = used - SETTING_VARS - PROCESS_VARS
        assert not unknown, f"{path.relative_to(REPO)} uses unknown variables {sorted(unknown)}"


def test_commands_name_existing_modules_and_flags() -> None:
    web = (REPO / "pipeline" / "web.py").read_text()
    found = set()
    for path in DEPLOY_FILES:
        text = path.read_text()
        for module in re.findall(r"-m\"?,? \"?(pipeline\.[a-z_]+)", text):
            assert importlib.util.find_spec(module) is not None, f"{path.name}: no module {module}"
            found.add((path.name, module))
        if "pipeline.web" in text:
            assert '"--host"' in web and '"--port"' in web
    assert {m for _, m in found} == {"pipeline.worker", "pipeline.web"}
    assert {f for f, _ in found} >= {"docker-compose.yml", "Procfile", "privrec-worker@.service",
                                      "privrec-web.service", "Dockerfile"}


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_units_verify(tmp_path: Path) -> None:
    for unit in (DEPLOY / "systemd").glob("*.service"):
        target = tmp_path / unit.name.replace("@.service", "@0.service")
        target.write_text(unit.read_text())
        proc = subprocess.run(["systemd-analyze", "verify", str(target)], capture_output=True, text=True)
        # a missing /opt/privrec/.venv is expected here; syntax and directive errors are not
        problems = [ln for ln in (proc.stdout + proc.stderr).splitlines()
                    if ln.strip() and "/opt/privrec" not in ln and "not executable" not in ln]
        assert not problems, f"{unit.name}: {problems}"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (Compose 1.x) not installed")
def test_compose_file_is_valid(tmp_path: Path) -> None:
    work = tmp_path / "deploy"
    shutil.copytree(DEPLOY, work)
    (work / "privrec.env").write_text((DEPLOY / "privrec.env.example").read_text())
    proc = subprocess.run(["docker-compose", "-f", str(work / "docker-compose.yml"), "config", "--quiet"],
                          capture_output=True, text=True, cwd=work)
    assert proc.returncode == 0, proc.stderr
