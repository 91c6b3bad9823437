"""What `pyctl.dev.kueue` makes of Kueue's kustomize config (the Kueue e2e runs the real thing):
which CRDs get a conversion webhook, which webhooks are kept and where they point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from pyctl.dev.control_plane import Binaries, ControlPlane
from pyctl.dev.kueue import MUTATING, QUEUE_LABEL, VALIDATING, KueueManager

KUSTOMIZATION = """
resources:
- bases/kueue.x-k8s.io_workloads.yaml
- bases/kueue.x-k8s.io_resourceflavors.yaml
patches:
- path: patches/webhook_in_workloads.yaml
#- path: patches/webhook_in_resourceflavors.yaml
"""


def crd(plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kueue.x-k8s.io"},
        "spec": {"group": "kueue.x-k8s.io", "names": {"plural": plural}},
    }


def hook(name: str, path: str) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": {"service": {"name": "webhook-service", "path": path}},
        "failurePolicy": "Fail",
    }


def manager(tmp_path: Path) -> KueueManager:
    config = tmp_path / "config"
    (config / "crd" / "bases").mkdir(parents=True)
    (config / "webhook").mkdir()
    (config / "crd" / "kustomization.yaml").write_text(KUSTOMIZATION)
    for plural in ("workloads", "resourceflavors"):
        path = config / "crd" / "bases" / f"kueue.x-k8s.io_{plural}.yaml"
        path.write_text(yaml.safe_dump(crd(plural)))
    docs = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-webhook-configuration"},
            "webhooks": [
                hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset"),
                hook("mpod.kb.io", "/mutate--v1-pod"),
                hook("mworkload.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-workload"),
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "validating-webhook-configuration"},
            "webhooks": [hook("vdeployment.kb.io", "/validate-apps-v1-deployment")],
        },
    ]
    (config / "webhook" / "manifests.yaml").write_text(yaml.safe_dump_all(docs))
    binaries = Binaries(
        tmp_path / "bin", tmp_path / "stages", kueue=tmp_path / "kueue", kueue_config=config
    )
    m = KueueManager(ControlPlane(binaries, tmp_path / "plane"), binaries)
    m.pki.mkdir(parents=True)
    (m.pki / "ca.crt").write_bytes(b"CA")
    return m


def test_only_the_crds_the_kustomization_patches_get_a_conversion_webhook(tmp_path: Path) -> None:
    m = manager(tmp_path)
    crds: list[dict[str, Any]] = json.loads(json.dumps(m.crds()))
    got = {c["metadata"]["name"]: c["spec"].get("conversion") for c in crds}
    assert got["resourceflavors.kueue.x-k8s.io"] is None  # its patch is commented out
    assert got["workloads.kueue.x-k8s.io"] == {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {"url": f"{m.url}/convert", "caBundle": "Q0E="},
            "conversionReviewVersions": ["v1"],
        },
    }


def test_the_webhooks_kept_point_at_the_local_port(tmp_path: Path) -> None:
    m = manager(tmp_path)
    got = json.loads(json.dumps(m.webhook_configurations()))
    assert [c["metadata"]["name"] for c in got] == [MUTATING, VALIDATING]
    mutating, validating = got
    assert validating["webhooks"] == []  # the Deployment integration is off: no such path
    pod, workload = mutating["webhooks"]
    assert pod["clientConfig"] == {"url": f"{m.url}/mutate--v1-pod", "caBundle": "Q0E="}
    assert pod["objectSelector"] == {
        "matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]
    }
    assert workload["clientConfig"]["url"] == f"{m.url}/mutate-kueue-x-k8s-io-v1beta2-workload"
    assert "objectSelector" not in workload
    assert m.url.startswith("https://127.0.0.1:")
