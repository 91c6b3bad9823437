"""The real kube-scheduler calls pyctl's extender over mutual TLS, configured as
docs/http.md says (``enableHTTPS``, ``tlsConfig`` with ``caFile``, ``certFile``, ``keyFile``,
``serverName``), with certificates made by trustme: a pod is placed as pyctl advises (its filter
removes the one node whose GPUs are all used in pyctl's view, and the pod lands on the other);
a scheduler without a client certificate is refused at the TLS handshake, and with
``ignorable: false`` its pod is not scheduled at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import trustme
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from pyctl.controller.placement import PlacementAdvisor
from pyctl.dev.control_plane import ControlPlane, ExtraScheduler
from pyctl.dev.extender import strict_config
from pyctl.dev.gpu_nodes import GpuNodeSpec, apply_nrt_crd, body
from pyctl.serve.extender import ExtenderHandler
from pyctl.serve.extender_server import ExtenderOptions, ExtenderServer, HttpMetrics
from tests.e2e.conftest import wait_until
from tests.e2e.test_placement_e2e import (
    create_nodes,
    delete_nodes,
    gpu_pod,
    pod_node,
)
from tests.unit.test_placement import W, node

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

LABEL = "tls-e2e"


def scheduler_config(url: str, name: str, tls: dict[str, str]) -> dict[str, Any]:
    config = strict_config(url, scheduler_name=name)
    (ext,) = config["extenders"]
    ext["enableHTTPS"] = True
    ext["tlsConfig"] = tls
    return config


async def test_real_scheduler_over_mutual_tls(
    control_plane: ControlPlane, api: client.ApiClient, tmp_path: Path
) -> None:
    ca = trustme.CA()
    files = {k: tmp_path / f"{k}.pem" for k in ("ca", "cert", "key", "ccert", "ckey")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    served = ca.issue_cert("localhost", "127.0.0.1")
    served.cert_chain_pems[0].write_to_path(str(files["cert"]))
    served.private_key_pem.write_to_path(str(files["key"]))
    scheduler = ca.issue_cert("kube-scheduler")
    scheduler.cert_chain_pems[0].write_to_path(str(files["ccert"]))
    scheduler.private_key_pem.write_to_path(str(files["ckey"]))

    # pyctl's view: every GPU of tls-full is used (single-numa-node); tls-free is not modelled
    models = {"tls-full": node("tls-full", 4, 4)}
    registry = CollectorRegistry()
    metrics = HttpMetrics(registry, "tls")
    server = ExtenderServer(
        lambda: ExtenderHandler(PlacementAdvisor(models, lambda: W)),
        ExtenderOptions(
            tls_cert_file=str(files["cert"]),
            tls_key_file=str(files["key"]),
            client_ca_file=str(files["ca"]),
        ),
        metrics,
    )
    port = await server.start()
    url = f"https://127.0.0.1:{port}/scheduler"
    trust = {"caFile": str(files["ca"]), "serverName": "localhost"}
    with_cert = {**trust, "certFile": str(files["ccert"]), "keyFile": str(files["ckey"])}
    good = ExtraScheduler(control_plane, "pyctl-tls", scheduler_config(url, "pyctl-tls", with_cert))
    bad = ExtraScheduler(
        control_plane, "pyctl-tls-nocert", scheduler_config(url, "pyctl-tls-nocert", trust)
    )
    specs = [GpuNodeSpec(n, labels={"pyctl.e2e/tls": "true"}) for n in ("tls-full", "tls-free")]
    sel = {"pyctl.e2e/tls": "true"}
    core = client.CoreV1Api(api)

    def count(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {"cluster": "tls", **labels}) or 0.0

    try:
        await apply_nrt_crd(api)
        await create_nodes(api, specs)
        good.start()
        bad.start()
        for i in range(3):
            await core.create_namespaced_pod(
                "default",
                body(gpu_pod(f"tls-{i}", 1, label=LABEL, selector=sel, scheduler="pyctl-tls")),
            )
        for i in range(3):
            name = f"tls-{i}"

            async def placed(name: str = name) -> bool:
                return bool(await pod_node(core, name))

            await wait_until(placed, f"{name} scheduled", within=60)
            assert await pod_node(core, name) == "tls-free"  # pyctl's filter, over mTLS
        answered = count("pyctl_extender_requests_total", verb="choose", outcome="ok")
        assert answered >= 3

        await core.create_namespaced_pod(
            "default",
            body(gpu_pod("tls-nocert", 1, label=LABEL, selector=sel, scheduler="pyctl-tls-nocert")),
        )
        await wait_until(
            lambda: count("pyctl_http_refused_total", server="extender", reason="tls") > 0,
            "the scheduler without a client certificate refused",
            within=60,
        )
        await anyio.sleep(3.0)
        assert not await pod_node(core, "tls-nocert")  # ignorable: false: no advice, no placement
        # its requests never reached the extender
        assert count("pyctl_extender_requests_total", verb="choose", outcome="ok") == answered
    finally:
        good.stop()
        bad.stop()
        await server.stop()
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={LABEL}", grace_period_seconds=0
        )
        await delete_nodes(api, specs)
