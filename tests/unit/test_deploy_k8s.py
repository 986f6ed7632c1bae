"""deploy/k8s is checked, not only written: API schemas (kubernetes-validate, offline), settings, replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.settings import Settings

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
VERSION = "1.30.0"
MANIFESTS = sorted(K8S.glob("*.yaml"))


def _docs() -> list[dict[str, Any]]:
    return [d for p in MANIFESTS for d in yaml.safe_load_all(p.read_text()) if d]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_against_the_api_schemas(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            kubernetes_validate.validate(doc, VERSION, strict=True)


def test_the_validation_can_fail(tmp_path: Path) -> None:
    """A deployment with a wrong type and an unknown field is refused (the check is not vacuous)."""
    worker = next(d for d in _docs() if d["kind"] == "Deployment" and d["metadata"]["name"] == "privrec-worker")
    broken = {**worker, "spec": {**worker["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)
    unknown = {**worker, "spec": {**worker["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, VERSION, strict=True)


def test_the_settings_they_set_are_valid_and_the_workers_fit_the_partitions() -> None:
    docs = _docs()
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    secret = next(d for d in docs if d["kind"] == "Secret")["stringData"]
    env = {**config, **{k: v for k, v in secret.items() if k.startswith(("PRIVREC_", "KAFKA_", "REDIS_URL"))}}
    settings = Settings.from_mapping({}, environ=env)  # a bad name or value raises SettingsError
    assert settings.kafka_security_protocol == "SASL_SSL" and settings.web_processes >= 1
    worker = next(d for d in docs if d["kind"] == "Deployment" and "worker" in d["metadata"]["name"])
    assert 1 <= worker["spec"]["replicas"] <= settings.partitions
    for d in docs:
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                assert c["securityContext"]["readOnlyRootFilesystem"] and "limits" in c["resources"]
                refs = {e["valueFrom"]["secretKeyRef"]["key"] for e in c.get("env", []) if "valueFrom" in e}
                assert refs <= set(secret), f"{c['name']} reads secret keys that do not exist: {refs - set(secret)}"
