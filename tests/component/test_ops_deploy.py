"""deploy/ stays consistent with the code: setting names, values, commands, unit and compose syntax.

The files cannot be run here (no Docker engine, no Kafka cluster, systemd is not PID 1); these
checks catch the drift that would break them: a renamed setting, an invalid default, a command
or flag that no longer exists. The environment every deploy file gives a process (compose,
systemd, Procfile, k8s) is rebuilt and checked name by name and value by value against what the
code reads (pipeline.config.settings, and the os.environ reads found in the source).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from pipeline.config.settings import Settings, SettingsError, env_name

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DEPLOY_FILES = [p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "NOTES-broker.md"]
SETTING_VARS = {env_name(f.name) for f in dataclasses.fields(Settings)}
ENDPOINT_VARS = {"KAFKA_BOOTSTRAP", "REDIS_URL"}


def _port(lo: int) -> Callable[[str], bool]:
    return lambda v: v.isdigit() and lo <= int(v) <= 65535


def _host(v: str) -> bool:
    try:
        ipaddress.ip_address(v)
        return True
    except ValueError:
        return bool(re.fullmatch(r"[A-Za-z0-9.-]+", v))


#: Process-level variables (not settings) that deploy files may set, each with the values the code accepts
#: (pipeline.apps.worker_app: metrics port 0..65535, 0 = a free one; pipeline.apps.web: --port from PRIVREC_HTTP_PORT; the
#: log level goes to logging.basicConfig). Each must be one the code reads (CODE_VARS).
PROCESS_VARS: dict[str, Callable[[str], bool]] = {
    "PRIVREC_WORKER_ID": bool,
    "PRIVREC_STATE_DIR": lambda v: v.startswith("/"),
    "PRIVREC_CACHE_DIR": lambda v: v.startswith("/"),
    "PRIVREC_LOGLEVEL": lambda v: isinstance(logging.getLevelName(v), int),
    "PRIVREC_HTTP_HOST": _host,
    "PRIVREC_HTTP_PORT": _port(1),
    "PRIVREC_WEB_PORT": _port(1),
    "PRIVREC_METRICS_ADDR": _host,
    "PRIVREC_METRICS_PORT": _port(0),
    # the web server's tokens (pipeline.serve.auth): any value here; the server refuses one under 32 characters at
    # start, so a placeholder left in a Secret stops it with that message
    "PRIVREC_TOKEN_SECRET": lambda v: not any(c.isspace() for c in v),
    "PRIVREC_OPERATOR_TOKEN": lambda v: not any(c.isspace() for c in v),
}


def _env_example(*, commented: bool = True) -> dict[str, str]:
    """The example's variables; with ``commented``, also the documented ``#NAME=value`` lines."""
    out = {}
    for line in (DEPLOY / "privrec.env.example").read_text().splitlines():
        m = re.match(r"^#?([A-Z][A-Z0-9_]*)=(.*)$" if commented else r"^([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = m.group(2)
    return out


def _source() -> str:
    return "\n".join(p.read_text() for pkg in ("pipeline", "producers", "privrec")
                     for p in (REPO / pkg).rglob("*.py"))


def _code_vars() -> set[str]:
    """The PRIVREC_* variables the code reads: os.environ[...] / .get / .setdefault / os.getenv, or a
    module constant ``*_ENV = "PRIVREC_..."`` that it reads through (producers.lastfm)."""
    source = _source()
    read = re.findall(r"(?:os\.environ(?:\.get|\.setdefault)?\s*[(\[]|os\.getenv\()\s*\"(PRIVREC_[A-Z0-9_]+)\"", source)
    constants = re.findall(r"^[A-Z_]*_ENV\s*=\s*\"(PRIVREC_[A-Z0-9_]+)\"", source, re.M)
    return set(read) | set(constants)


CODE_VARS = _code_vars()
#: Read by the code, but never for a deployment (fault injection in the tests).
TEST_ONLY_VARS = {"PRIVREC_FAULT"}

_ASSIGN = re.compile(r"\b((?:PRIVREC_[A-Z0-9_]+)|KAFKA_BOOTSTRAP|REDIS_URL)=(\S+)")
_SHELL_DEFAULT = re.compile(r"\$\{((?:PRIVREC_[A-Z0-9_]+)|KAFKA_BOOTSTRAP|REDIS_URL):-([^}$]*)\}")


def _deployed_environments() -> Iterator[tuple[str, dict[str, str]]]:
    """(where, environment) of every process a deploy file starts: privrec.env.example under the compose
    environment, systemd ExecStart assignments and Procfile defaults; k8s ConfigMap, Secret and env."""
    example = {k: v for k, v in _env_example(commented=False).items() if v}  # what an env file sets
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        if service.get("env_file") != "privrec.env":
            continue
        env = {**example, **{k: str(v) for k, v in (service.get("environment") or {}).items()}}
        command = service.get("command", [])
        env.update(_ASSIGN.findall(" ".join(command) if isinstance(command, list) else command))
        yield f"docker-compose.yml:{name}", env
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        text = unit.read_text()
        assert "EnvironmentFile=/etc/privrec/privrec.env" in text, unit.name
        env = dict(example)
        for line in text.replace("\\\n", " ").splitlines():  # continuation lines joined
            if line.startswith(("Environment=", "ExecStart=")):  # ExecStart: /usr/bin/env NAME=value ...
                env.update(_ASSIGN.findall(line))
        yield f"systemd/{unit.name}", env
    for line in (DEPLOY / "Procfile").read_text().splitlines():
        if line and not line.startswith("#"):
            kind, command = line.split(":", 1)
            # ${NAME:-default}: the default unless the environment file sets NAME
            yield f"Procfile:{kind}", {**dict(_SHELL_DEFAULT.findall(command)), **example,
                                       **dict(_ASSIGN.findall(command))}
    docs = [d for p in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    config = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    secrets = {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            env = {}
            for source in c.get("envFrom", []):
                env.update(config[source["configMapRef"]["name"]] if "configMapRef" in source
                           else secrets[source["secretRef"]["name"]])
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                env[e["name"]] = secrets[ref["name"]][ref["key"]] if ref else e["value"]
            env.update(_ASSIGN.findall(" ".join(c.get("command", []))))
            yield f"k8s/{d['metadata']['name']}:{c['name']}", env


def _check_environment(env: Mapping[str, str]) -> None:
    """Raise if a PRIVREC_* name is not read by the code or a value is not accepted by it."""
    privrec = {k: v for k, v in env.items() if k.startswith("PRIVREC_") or k in ENDPOINT_VARS}
    unknown = set(privrec) - SETTING_VARS - set(PROCESS_VARS)
    if unknown:
        raise ValueError(f"variables no code reads: {sorted(unknown)}")
    Settings.from_mapping({}, environ=privrec)  # SettingsError on a bad value
    bad = {k: v for k, v in privrec.items() if k in PROCESS_VARS and not PROCESS_VARS[k](v)}
    if bad:
        raise ValueError(f"values the code refuses: {bad}")


def test_env_example_names_every_setting_with_a_valid_value() -> None:
    example = _env_example()
    assert SETTING_VARS <= set(example), f"missing from privrec.env.example: {sorted(SETTING_VARS - set(example))}"
    active = {k: v for k, v in example.items() if v}  # with the documented values of the commented lines
    _check_environment(active)  # names the code reads, values it accepts (SettingsError / ValueError)
    settings = Settings.from_mapping({}, environ=active)
    defaults = Settings()
    for f in dataclasses.fields(Settings):  # the example documents the defaults, except the endpoints
        if f.name not in ("kafka", "redis_url", "data_dir"):
            assert getattr(settings, f.name) == getattr(defaults, f.name), f.name


def test_every_privrec_variable_in_deploy_is_known_and_read_by_the_code() -> None:
    assert CODE_VARS >= {"PRIVREC_WORKER_ID", "PRIVREC_STATE_DIR", "PRIVREC_METRICS_PORT", "PRIVREC_CACHE_DIR"}, \
        "the scan of os.environ reads found too little"
    assert not set(PROCESS_VARS) - CODE_VARS, f"no code reads {sorted(set(PROCESS_VARS) - CODE_VARS)}"
    assert not SETTING_VARS & set(PROCESS_VARS)
    for path in DEPLOY_FILES:  # every file under deploy/: compose, Dockerfile, systemd, Procfile, k8s, README
        used = set(re.findall(r"\bPRIVREC_[A-Z0-9_]*[A-Z0-9_]", path.read_text()))
        unknown = used - SETTING_VARS - set(PROCESS_VARS)
        assert not unknown, f"{path.relative_to(REPO)} uses unknown variables {sorted(unknown)}"
        assert not used & TEST_ONLY_VARS, f"{path.relative_to(REPO)} sets a test-only variable"


def test_every_deployed_environment_is_accepted_by_the_code() -> None:
    """The environment each deploy file gives a process, names and values, as the code reads them."""
    seen = []
    for where, env in _deployed_environments():
        seen.append(where)
        try:
            _check_environment(env)
        except (SettingsError, ValueError) as e:
            pytest.fail(f"{where}: {e}")
        starts = "worker" in where or "web" in where
        assert not starts or ENDPOINT_VARS <= set(env), f"{where}: no {sorted(ENDPOINT_VARS - set(env))}"
    assert {"docker-compose.yml:worker", "docker-compose.yml:web", "systemd/privrec-worker@.service",
            "systemd/privrec-web.service", "Procfile:worker", "Procfile:web", "k8s/privrec-worker:worker",
            "k8s/privrec-web:web"} <= set(seen), seen


@pytest.mark.parametrize("bad", [{"PRIVREC_EPSILON": "-1"}, {"PRIVREC_PARTITIONS": "four"},
                                 {"PRIVREC_METRICS_PORT": "99999"}, {"PRIVREC_LOGLEVEL": "LOUD"},
                                 {"PRIVREC_EPSLION": "2"}, {"PRIVREC_FAULT": "x"}])
def test_the_environment_check_can_fail(bad: dict[str, str]) -> None:
    env = {**{k: v for k, v in _env_example().items() if v}, **bad}
    with pytest.raises((SettingsError, ValueError)):
        _check_environment(env)


def test_commands_name_existing_modules_and_flags() -> None:
    web = (REPO / "pipeline" / "apps" / "web.py").read_text()
    found = set()
    for path in DEPLOY_FILES:
        text = path.read_text()
        for module in re.findall(r"-m\"?,? \"?(pipeline(?:\.[a-z_]+)+)", text):
            assert importlib.util.find_spec(module) is not None, f"{path.name}: no module {module}"
            found.add((path.name, module))
        if "pipeline.apps.web" in text:
            assert '"--host"' in web and '"--port"' in web
    assert {m for _, m in found} == {"pipeline.apps.worker", "pipeline.apps.web"}
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
    proc = subprocess.run(["docker-compose", "-f", str(work / "docker-compose.yml"), "config"],
                          capture_output=True, text=True, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert not proc.stderr.strip(), proc.stderr  # no warnings either (unset variables, deprecated keys)
    # the environment as Compose resolves it (env_file under environment) is the one checked above
    resolved = yaml.safe_load(proc.stdout)["services"]
    ours = {where.split(":", 1)[1]: env for where, env in _deployed_environments()
            if where.startswith("docker-compose.yml:")}
    for name, service in resolved.items():
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        if name in ours:
            assert {k: v for k, v in ours[name].items() if k != "PRIVREC_WORKER_ID"} == env, name
            _check_environment(env)
        else:
            assert not any(k.startswith("PRIVREC_") for k in env), name
