"""deploy/crds/noderesourcetopology.yaml is accepted by a real apiserver and validates objects."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client

from pyctl.dev.gpu_nodes import (
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    GpuNodeSpec,
    apply_nrt_crd,
    nrt_manifest,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.timeout(120, func_only=True)]


async def test_nrt_crd_round_trips_and_rejects_malformed_objects(api: client.ApiClient) -> None:
    await apply_nrt_crd(api)
    custom = client.CustomObjectsApi(api)
    spec = GpuNodeSpec(f"nrt-{uuid.uuid4().hex[:6]}", mig={7: {"1g.10gb": 7}})
    good: Any = nrt_manifest(spec, used={0: {"nvidia.com/gpu": 3, "cpu": 8, "memory": 64}})

    async def create(obj: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await custom.create_cluster_custom_object(
            NRT_GROUP, NRT_VERSION, NRT_PLURAL, obj
        )
        return created

    created = await create(good)
    try:
        zones = {z["name"]: z for z in created["zones"]}
        res0 = {r["name"]: r for r in zones["node-0"]["resources"]}
        assert res0["nvidia.com/gpu"] == {
            "name": "nvidia.com/gpu",
            "capacity": "4",
            "allocatable": "4",
            "available": "1",
        }
        assert res0["memory"]["available"] == "448Gi"
        res1 = {r["name"]: r for r in zones["node-1"]["resources"]}
        assert res1["nvidia.com/gpu"]["capacity"] == "3"
        assert res1["nvidia.com/mig-1g.10gb"]["capacity"] == "7"

        broken: list[dict[str, Any]] = []
        no_zones = copy.deepcopy(good)
        del no_zones["zones"]
        broken.append(no_zones)
        bad_quantity = copy.deepcopy(good)
        bad_quantity["zones"][0]["resources"][0]["available"] = "lots"
        broken.append(bad_quantity)
        no_type = copy.deepcopy(good)
        del no_type["zones"][1]["type"]
        broken.append(no_type)
        for i, obj in enumerate(broken):
            obj["metadata"] = {"name": f"{spec.name}-bad{i}"}
            with pytest.raises(client.ApiException) as err:
                await create(obj)
            assert err.value.status == 422, err.value.body
    finally:
        await custom.delete_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, spec.name)


async def test_nested_zones_survive_the_api_server_and_are_read_as_link_groups(
    api: client.ApiClient,
) -> None:
    """A NUMA zone with two nested zones of GPUs (`parent`), created through the real API server
    with the CRD pyctl ships: what the server stores and returns decodes, through the
    controller's own decode, to the NUMA zone's two link groups, and the model's GPUs carry
    them (docs/fabric.md, "Link groups inside a node")."""
    from pyctl.cluster.kube.decode import decode_object
    from pyctl.cluster.records import NodeRecord, NrtRecord
    from pyctl.cluster.translate import node_from_records

    await apply_nrt_crd(api)
    custom = client.CustomObjectsApi(api)
    spec = GpuNodeSpec(f"nrt-{uuid.uuid4().hex[:6]}", numa_zones=1, gpus_per_zone=4)
    obj: Any = nrt_manifest(spec, used={0: {"nvidia.com/gpu": 2}})
    for name, available in (("nvlink-0", "1"), ("nvlink-1", "1")):
        obj["zones"].append(
            {
                "name": name,
                "type": "NVLink",
                "parent": "node-0",
                "resources": [
                    {
                        "name": "nvidia.com/gpu",
                        "capacity": "2",
                        "allocatable": "2",
                        "available": available,
                    }
                ],
            }
        )
    await custom.create_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, obj)
    try:
        stored = await custom.get_cluster_custom_object(
            NRT_GROUP, NRT_VERSION, NRT_PLURAL, spec.name
        )
        assert [z.get("parent") for z in stored["zones"]] == [None, "node-0", "node-0"]
        rec = decode_object("NodeResourceTopology", stored)
        assert isinstance(rec, NrtRecord)
        assert [z.links for z in rec.zones] == [((2, 1), (2, 1))]
        node = NodeRecord(spec.name, cpu_milli=64000, memory_mib=1 << 19, gpus=4)
        model = node_from_records(node, rec, [])
        got = [(g.used_milli, g.link) for z in model.zones for g in z.gpus]
        assert got == [(1000, 0), (0, 0), (1000, 1), (0, 1)]
    finally:
        await custom.delete_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, spec.name)
