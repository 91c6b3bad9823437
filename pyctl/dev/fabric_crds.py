"""The CRDs of the fabric's sources (docs/fabric.md), for test clusters without Kueue, KAI or the
NVIDIA DRA driver: Kueue's `Topology` (kueue.x-k8s.io/v1beta1), KAI's `Topology`
(kai.scheduler/v1alpha1) and the DRA driver's `ComputeDomainClique` (resource.nvidia.com/v1beta1),
with the fields pyctl reads as their projects' CRDs declare them (Kueue's
`apis/kueue/v1beta1/topology_types.go`, KAI's `kai.scheduler_topologies.yaml`, the driver's
`api/nvidia.com/resource/v1beta1/computedomainclique.go`) and anything else kept.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from pyctl.dev.gpu_nodes import apply_crd

#: (group, version, plural, kind, scope) of each
FABRIC_CRDS: tuple[tuple[str, str, str, str, str], ...] = (
    ("kueue.x-k8s.io", "v1beta1", "topologies", "Topology", "Cluster"),
    ("kai.scheduler", "v1alpha1", "topologies", "Topology", "Cluster"),
    ("resource.nvidia.com", "v1beta1", "computedomaincliques", "ComputeDomainClique", "Namespaced"),
)

_LEVELS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "levels": {
            "type": "array",
            "minItems": 1,
            "maxItems": 16,
            "items": {
                "type": "object",
                "required": ["nodeLabel"],
                "properties": {"nodeLabel": {"type": "string", "minLength": 1, "maxLength": 316}},
            },
        }
    },
}
_DAEMONS: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["cliqueID", "ipAddress", "nodeName"],
        "properties": {
            "nodeName": {"type": "string"},
            "ipAddress": {"type": "string"},
            "cliqueID": {"type": "string"},
            "index": {"type": "integer"},
            "status": {"type": "string", "enum": ["Ready", "NotReady"]},
        },
    },
}


def crd_manifest(group: str, version: str, plural: str, kind: str, scope: str) -> dict[str, Any]:
    top: dict[str, Any] = {"spec": _LEVELS} if kind == "Topology" else {"daemons": _DAEMONS}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": top}},
                }
            ],
        },
    }


async def apply_fabric_crds(api: client.ApiClient, within: float = 30.0) -> list[str]:
    """Create the CRDs that are missing and wait until each is Established; returns the names of
    those it created (a cluster with the real Kueue keeps its own)."""
    created = []
    for spec in FABRIC_CRDS:
        crd = crd_manifest(*spec)
        if await apply_crd(api, crd, within):
            created.append(str(crd["metadata"]["name"]))
    return created


async def delete_crds(api: client.ApiClient, names: list[str]) -> None:
    """Delete the CRDs named (their objects go with them)."""
    ext = client.ApiextensionsV1Api(api)
    for name in names:
        try:
            await ext.delete_custom_resource_definition(name)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def topology_manifest(group: str, version: str, name: str, levels: list[str]) -> dict[str, Any]:
    """A `Topology` of Kueue or KAI: `levels` (node label keys), the widest first."""
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": k} for k in levels]},
    }


def clique_manifest(namespace: str, name: str, nodes: dict[str, str]) -> dict[str, Any]:
    """A `ComputeDomainClique` naming `nodes` (node -> clique id), as the DRA driver writes it."""
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainClique",
        "metadata": {"name": name, "namespace": namespace},
        "daemons": [
            {"nodeName": n, "ipAddress": f"10.0.0.{i}", "cliqueID": c, "index": i}
            for i, (n, c) in enumerate(sorted(nodes.items()))
        ],
    }
