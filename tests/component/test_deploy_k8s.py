"""deploy/k8s is checked, not only written: the Kubernetes API schemas, offline, and the structure around them.

Every manifest is validated against the Kubernetes 1.30 API schemas that kubernetes-validate ships
(``--strict``: unknown fields are errors too); a broken copy is shown to fail. The rest: the ConfigMap is
privrec.env.example's settings (plus named overrides), the workers fit the partitions, every Secret key a
container reads exists, every path the processes write is a writable volume (read-only root filesystem),
the ports, probes, selectors and image agree. The names and values of every variable are checked against
the code with the other deploy files in tests/component/test_ops_deploy.py.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.config.settings import Settings

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
VERSION = "1.30.0"
MANIFESTS = sorted(K8S.glob("*.yaml"))
CLI = [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", VERSION]
#: Where the ConfigMap departs from privrec.env.example (the cluster's choices; see configmap.yaml).
CONFIGMAP_OVERRIDES = {"PRIVREC_CATALOG": "lastfm", "PRIVREC_DATA_DIR": "/data/lastfm-2k",
                       "PRIVREC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "PRIVREC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                       "PRIVREC_WEB_PROCESSES": "2"}
#: In the Secret, not the ConfigMap.
SECRET_VARS = {"KAFKA_BOOTSTRAP", "REDIS_URL", "PRIVREC_KAFKA_SASL_USERNAME", "PRIVREC_KAFKA_SASL_PASSWORD"}


def _docs(paths: tuple[Path, ...] = tuple(MANIFESTS)) -> list[dict[str, Any]]:
    return _parsed(paths)


@functools.lru_cache(maxsize=None)
def _parsed(paths: tuple[Path, ...]) -> list[dict[str, Any]]:
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in _docs() if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _env_example() -> dict[str, str]:
    """The variables privrec.env.example sets (commented lines are not set)."""
    lines = (DEPLOY / "privrec.env.example").read_text().splitlines()
    return {m[1]: m[2] for ln in lines if (m := re.match(r"^([A-Z][A-Z0-9_]*)=(.+)$", ln))}


def _container_env(container: dict[str, Any]) -> dict[str, str]:
    """ConfigMap (envFrom) under the container's env; Secret references as the placeholders' values."""
    config, secret = _one("ConfigMap")["data"], _one("Secret")["stringData"]
    env = {}
    for source in container.get("envFrom", []):
        assert source["configMapRef"]["name"] == _one("ConfigMap")["metadata"]["name"]
        env.update(config)
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == _one("Secret")["metadata"]["name"]
            assert ref["key"] in secret, f"{container['name']} reads secret key {ref['key']!r}, not in secret.yaml"
        env[e["name"]] = secret[ref["key"]] if ref else e["value"]
    return env


def _deployments() -> list[dict[str, Any]]:
    return [d for d in _docs() if d["kind"] == "Deployment"]


# --- the API schemas --------------------------------------------------------------------------------------

def test_the_manifests_are_the_expected_objects() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in _docs())
    assert kinds == [("ConfigMap", "privrec-settings"), ("Deployment", "privrec-web"), ("Deployment", "privrec-worker"),
                     ("PodDisruptionBudget", "privrec-web"), ("PodDisruptionBudget", "privrec-worker"),
                     ("Secret", "privrec-endpoints"), ("Service", "privrec-web")]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_against_the_api_schemas(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            kubernetes_validate.validate(doc, VERSION, strict=True)


def test_the_cli_accepts_the_manifests_and_refuses_a_broken_copy(tmp_path: Path) -> None:
    """What deploy/README.md tells people to run, on a copy; then on a copy broken in two ways."""
    good = tmp_path / "good"
    shutil.copytree(K8S, good)
    proc = subprocess.run([*CLI, *sorted(map(str, good.glob("*.yaml")))], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("passed") + proc.stderr.count("passed") == len(_docs())

    broken = tmp_path / "broken"
    shutil.copytree(K8S, broken)
    worker = broken / "worker.yaml"
    text = worker.read_text()
    assert "  replicas: 2\n" in text and "terminationGracePeriodSeconds" in text
    worker.write_text(text.replace("  replicas: 2\n", '  replicas: "two"\n'))  # wrong type
    web = broken / "web.yaml"
    web.write_text(web.read_text().replace("readinessProbe:", "readynessProbe:"))  # unknown field (strict)
    for path in (worker, web):
        proc = subprocess.run([*CLI, str(path)], capture_output=True, text=True)
        assert proc.returncode != 0, f"{path.name}: the broken copy passed\n{proc.stdout}{proc.stderr}"
        with pytest.raises(kubernetes_validate.ValidationError):
            for doc in _parsed((path,)):
                kubernetes_validate.validate(doc, VERSION, strict=True)


def test_the_validation_is_offline(tmp_path: Path) -> None:
    """The schemas ship with the package: validation works in a network namespace with no network at all."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode:
        pytest.skip("unshare -rn (an unprivileged network namespace) is not available")
    proc = subprocess.run(["unshare", "-rn", *CLI, *map(str, MANIFESTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- structure --------------------------------------------------------------------------------------------

def test_the_configmap_is_the_env_example_with_named_overrides() -> None:
    example = _env_example()
    expected = {k: v for k, v in example.items() if k not in SECRET_VARS} | CONFIGMAP_OVERRIDES
    assert _one("ConfigMap")["data"] == expected
    assert set(_one("Secret")["stringData"]) >= SECRET_VARS
    assert all("CHANGE-ME" in v for k, v in _one("Secret")["stringData"].items() if "PASSWORD" in k or "REDIS" in k)


def test_the_workers_fit_the_partitions_and_expose_their_metrics() -> None:
    worker = _one("Deployment", "privrec-worker")
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    env = _container_env(container)
    settings = Settings.from_mapping({}, environ=env)
    assert 1 <= worker["spec"]["replicas"] <= settings.partitions
    port = int(env["PRIVREC_METRICS_PORT"])
    assert env["PRIVREC_METRICS_ADDR"] == "0.0.0.0"
    assert {"name": "metrics", "containerPort": port} in container["ports"]
    assert worker["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert "PRIVREC_WORKER_ID=" in " ".join(container["command"])  # a distinct id per pod


def test_the_web_serves_its_port_with_probes_behind_the_service() -> None:
    web = _one("Deployment", "privrec-web")
    (container,) = web["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:3] == ["python", "-m", "pipeline.apps.web"]
    port = int(command[command.index("--port") + 1])
    assert {"name": "http", "containerPort": port} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert "livenessProbe" in container
    service = _one("Service", "privrec-web")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert service["spec"]["selector"] == web["spec"]["template"]["metadata"]["labels"]
    assert Settings.from_mapping({}, environ=_container_env(container)).web_processes >= 1


def test_pods_are_non_root_read_only_bounded_and_disruption_budgeted() -> None:
    budgets = {d["metadata"]["name"]: d for d in _docs() if d["kind"] == "PodDisruptionBudget"}
    for d in _deployments():
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] > 0
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"] == labels
        budget = budgets[d["metadata"]["name"]]
        assert budget["spec"]["selector"]["matchLabels"] == labels
        assert budget["spec"]["minAvailable"] < d["spec"]["replicas"]  # a node drain can proceed
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"], c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert set(c["resources"]["requests"]) == set(c["resources"]["limits"]) == {"cpu", "memory"}, c["name"]


def test_every_path_the_processes_write_is_a_writable_volume() -> None:
    """A read-only root filesystem: faust's data directory, the LastFM cache and /tmp must be mounts."""
    for d in _deployments():
        pod = d["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            env = _container_env(c)
            settings = Settings.from_mapping({}, environ=env)
            mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
            assert {m["name"] for m in mounts.values()} <= set(volumes)

            def mount_of(path: str) -> dict[str, Any]:
                found = [m for p, m in mounts.items() if path == p or path.startswith(p.rstrip("/") + "/")]
                assert found, f"{c['name']}: {path} is on the read-only root filesystem"
                return max(found, key=lambda m: len(m["mountPath"]))

            writable = ["/tmp"]
            if "pipeline.apps.worker" in " ".join(c["command"]):
                writable.append(env["PRIVREC_STATE_DIR"] + "/faust")  # pipeline.apps.worker_app: $PRIVREC_STATE_DIR/faust
            if settings.catalog == "lastfm":
                assert "PRIVREC_CACHE_DIR" in env, f"{c['name']}: the LastFM cache would go to ~/.cache (read-only)"
                writable.append(env["PRIVREC_CACHE_DIR"])
                data = mount_of(settings.data_dir or "")
                assert data.get("readOnly") and volumes[data["name"]]["persistentVolumeClaim"]["readOnly"]
            for path in writable:
                m = mount_of(path)
                assert not m.get("readOnly"), f"{c['name']}: {path} is mounted read-only"
                assert "emptyDir" in volumes[m["name"]], f"{c['name']}: {path} is not on a scratch volume"


def test_the_image_is_the_one_deploy_builds() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    images = {s["image"] for s in compose["services"].values() if s.get("build", {}).get("dockerfile") == "deploy/Dockerfile"}
    assert images == {"privrec:latest"}
    assert "-t privrec " in (DEPLOY / "Dockerfile").read_text()
    assert {c["image"] for d in _deployments() for c in d["spec"]["template"]["spec"]["containers"]} == images
