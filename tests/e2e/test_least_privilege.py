"""Least privilege, proven by the API server (issue 17).

The chart is installed with the real helm (mode enforce) into a namespace that enforces the
restricted Pod Security Standard; a token for its ServiceAccount is minted with the TokenRequest
API (`kubectl create token`) and written into a kubeconfig; `pyctl run --kubeconfig <that> --mode
enforce --redis ...` runs as deployed (a subprocess, its settings taken from the ConfigMap the
chart installed) with only that identity, through

- a full compaction: a fragmented kwok cluster (two 2-NUMA 8-GPU nodes under
  ``single-numa-node``, 1-GPU replicas one per zone on one node, stranded GPUs on the other, the
  topology-updater played by the test) and a pending 4-GPU replica, placed by a second
  kube-scheduler with pyctl's extender once compaction freed a zone;
- a full MIG reconfiguration of a kwok A100 node, through the simulated mig-manager
  (pyctl/dev/mig_manager.py), for two pending `3g.20gb` pods;
- the fabric's sources: the CRDs of Kueue's and KAI's `Topology`, the NVIDIA DRA driver's
  `ComputeDomainClique` and Volcano's `HyperNode` and `PodGroup` (pyctl/dev/fabric_crds.py), an
  object of each, the Topology objects' levels and the HyperNodes' tiers read
  (`pyctl_level_source`).

The API server's audit log (its policy records ServiceAccount requests at Metadata level) gives the
calls the controller made: the test prints them as a table, asserts that none was refused (no 403)
and that every grant of the chart's RBAC is used by some call, or is listed in `UNUSED_OK` with
the path that needs it. Then, with the same token: the ValidatingAdmissionPolicy refuses a change
of another label, an annotation, the removal or addition of a taint not under pyctl.io/, and an
eviction in an excluded namespace, and allows what pyctl does (spec.unschedulable, pyctl.io/
taints, nvidia.com/mig.config); RBAC refuses secrets and deletes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.actuator import KubeActuator
from pyctl.cluster.kube.client import KubeApiError, connect
from pyctl.dev.control_plane import ControlPlane, ExtraScheduler, free_port
from pyctl.dev.extender import strict_config
from pyctl.dev.fabric_crds import (
    apply_fabric_crds,
    clique_manifest,
    delete_crds,
    hypernode_manifest,
    pod_group_manifest,
    topology_manifest,
)
from pyctl.dev.gpu_nodes import GpuNodeSpec, apply_nrt_crd, body
from pyctl.dev.mig_manager import (
    STATE_LABEL,
    MigManagerSim,
    a100_all_1g,
    create_mig_node,
    mig_pod,
)
from pyctl.dev.topology import TopologyUpdater
from pyctl.state.redis_client import RedisConfig, close_client
from pyctl.state.redis_client import connect as redis_connect
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.workflows.dra_taints import TaintRule
from pyctl.workflows.engine import Workflow, WorkflowData, decode
from pyctl.workflows.kinds import builtin_registry
from pyctl.workflows.mig_reconfig import TAINT_KEY
from tests.deploy import audit
from tests.deploy.tools import (
    CHART,
    apply_monitoring_crds,
    helm,
    kubectl,
    restricted_namespace,
    token_kubeconfig,
)
from tests.e2e.conftest import if_present, wait_until
from tests.e2e.test_placement_e2e import (
    create_nodes,
    delete_nodes,
    gpu_deployment,
    gpu_pod,
)
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

NS = "pyctl-lp"
USER = f"system:serviceaccount:{NS}:pyctl"
CLUSTER = "lp"
LABEL = "lp-e2e"
SEL = {"pyctl.e2e/lp": "true"}
GPU_NS = "gpu-operator"
CONFIGMAP = "pyctl-mig-parted-config"
MIG_NODE = "lp-a100"
PROTECTED = "lp-protected"  # an excluded namespace of the evictor rules
LEADER = re.compile(rf'^pyctl_leader\{{cluster="{CLUSTER}"\}} 1(\.0)?$', re.M)
#: grants the run may leave unused, each with the path that needs it (none today)
UNUSED_OK: dict[str, str] = {}
#: non-resource URLs every authenticated user may GET (the API server's default ClusterRoles)
DEFAULTS = {
    "/apis/topology.node.k8s.io/v1alpha2": "system:discovery (default)",
    # whether the API server serves DeviceTaintRules (DRA steering)
    "/apis/resource.k8s.io/v1": "system:discovery (default)",
    # the fabric's sources (docs/fabric.md): Kueue's Topology at v1beta2, else v1beta1
    "/apis/kueue.x-k8s.io/v1beta2": "system:discovery (default)",
    "/apis/kueue.x-k8s.io/v1beta1": "system:discovery (default)",
    "/apis/kai.scheduler/v1alpha1": "system:discovery (default)",
    "/apis/resource.nvidia.com/v1beta1": "system:discovery (default)",
    "/apis/topology.volcano.sh/v1alpha1": "system:discovery (default)",
    "/apis/scheduling.volcano.sh/v1beta1": "system:discovery (default)",
}


def install(kubeconfig: Path, redis_url: str) -> None:
    helm(
        "install", "pyctl", str(CHART), "--namespace", NS, "--kubeconfig", str(kubeconfig),
        "--set", "mode=enforce", "--set", f"cluster={CLUSTER}",
        # the controller runs here as a subprocess (the test), not as the Deployment's pods
        "--set", "replicas=0",
        "--set", "redis.bundled=false", "--set", f"redis.external.url={redis_url}",
        "--set-json", f'evictor.excludedNamespaces=["kube-system","{PROTECTED}"]',
        "--set", f"mig.gpuOperatorNamespace={GPU_NS}", "--set", f"mig.configMap={CONFIGMAP}",
    )  # fmt: skip


class Pyctl:
    """`pyctl run` as deployed: the chart's ConfigMap as its environment, the ServiceAccount's
    kubeconfig instead of the in-cluster credentials, quick intervals and loose limits."""

    def __init__(
        self,
        config: dict[str, str],
        kubeconfig: Path,
        log: Path,
        namespace: str = NS,
        mode: str = "enforce",
    ) -> None:
        self.port = free_port()
        self.extender_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
        env.update(config)
        env.update(
            PYCTL_IN_CLUSTER="false",
            PYCTL_METRICS_HOST="127.0.0.1",
            PYCTL_METRICS_PORT=str(self.port),
            PYCTL_EXTENDER_HOST="127.0.0.1",
            PYCTL_EXTENDER_PORT=str(self.extender_port),
            PYCTL_LEASE_NAMESPACE=namespace,  # the Deployment's downward API
            PYCTL_LEASE_IDENTITY="pyctl-lp-0",
            PYCTL_LEASE_DURATION="3",
            PYCTL_WORKFLOW_INTERVAL="0.5",
            PYCTL_SUMMARY_INTERVAL="0.5",
            PYCTL_LOG_FORMAT="text",
        )
        for scope in ("GLOBAL", "NODE", "NAMESPACE", "WORKLOAD"):
            env[f"PYCTL_LIMIT_{scope}_BURST"] = "100"
            env[f"PYCTL_LIMIT_{scope}_PER_MINUTE"] = "600"
        env.update(PYCTL_LIMIT_NODE_COOLDOWN_SECONDS="0", PYCTL_LIMIT_DISRUPTIONS_PER_HOUR="0")
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY"), "127.0.0.1,localhost"]))
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        argv = [sys.executable, "-m", "pyctl.cli.main", "run", "--kubeconfig", str(kubeconfig)]
        argv += ["--mode", mode, "--no-live"]
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def metrics(self) -> str:
        try:
            with self._opener.open(f"http://127.0.0.1:{self.port}/metrics", timeout=1.0) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    async def leader(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"pyctl exited ({self.proc.returncode}): {self.log.read_text()[-3000:]}"
            )
        return bool(LEADER.search(await anyio.to_thread.run_sync(self.metrics)))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


async def workflows(store: RedisWorkflowStore) -> list[Workflow[WorkflowData]]:
    registry = builtin_registry()
    return [decode(r.data, registry) for r in (await store.list()).values()]


def refused(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, f"allowed: {proc.stdout}"
    return proc.stderr


async def rbac(
    api: client.ApiClient, namespace: str = NS, account: str = "pyctl"
) -> list[audit.Grant]:
    r = client.RbacAuthorizationV1Api(api)
    roles = [
        *[
            api.sanitize_for_serialization(x) | {"kind": "ClusterRole"}
            for x in (await r.list_cluster_role()).items
        ],
        *[
            api.sanitize_for_serialization(x) | {"kind": "Role"}
            for x in (await r.list_role_for_all_namespaces()).items
        ],
    ]
    bindings = [
        *[
            api.sanitize_for_serialization(x) | {"kind": "ClusterRoleBinding"}
            for x in (await r.list_cluster_role_binding()).items
        ],
        *[
            api.sanitize_for_serialization(x) | {"kind": "RoleBinding"}
            for x in (await r.list_role_binding_for_all_namespaces()).items
        ],
    ]
    return audit.grants(roles, bindings, namespace, account)


async def steer_as(kubeconfig: Path) -> None:
    """DRA steering's calls (`DraSteering.tick`: discovery, list, create, delete), made by the
    product's actuator with `kubeconfig`'s credentials: this cluster has no DRA devices for the
    controller to steer, so its DeviceTaintRule grants are exercised here, inside the audit
    window."""
    rule = TaintRule(
        "pyctl-steer-lp-check", "gpu.nvidia.com", "lp-pool", "gpu-0", "pyctl.io/steer", "x", "test"
    )
    async with await connect(kubeconfig=kubeconfig) as k:
        act = KubeActuator(k, instance="lp")
        assert await act.device_taint_rules() == {}
        await act.put_device_taint_rule(rule.manifest(), on=True)
        assert list(await act.device_taint_rules() or {}) == [rule.name]
        await act.put_device_taint_rule(rule.manifest(), on=False)
        assert await act.device_taint_rules() == {}


async def refused_foreign_rule(kubeconfig: Path) -> None:
    """The admission policy: a DeviceTaintRule that is not pyctl's is refused to its account."""
    rule = TaintRule("vendor-rule", "gpu.nvidia.com", "lp-pool", "gpu-0", "vendor/x", "x", "test")
    foreign = rule.manifest()
    foreign["metadata"]["labels"] = {}
    async with await connect(kubeconfig=kubeconfig) as k:
        with pytest.raises(KubeApiError, match="only its own DeviceTaintRules"):
            await KubeActuator(k, instance="lp").put_device_taint_rule(foreign, on=True)


@pytest.mark.anyio
async def test_the_controller_needs_exactly_the_charts_rbac_and_admission_confines_it(
    control_plane: ControlPlane,
    api: client.ApiClient,
    redis_server: RedisServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert control_plane.audit_log is not None, "the session's API server writes no audit log"
    admin = control_plane.kubeconfig
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    specs = [GpuNodeSpec(n, labels=SEL) for n in ("lp-frag", "lp-full")]
    mig_spec = a100_all_1g(MIG_NODE)
    updater = TopologyUpdater(api, specs, LABEL)
    sched: ExtraScheduler | None = None
    pyctl: Pyctl | None = None
    redis = None
    fabric_crds: list[str] = []
    try:
        # -- the chart, installed as users install it ---------------------------------------------
        apply_monitoring_crds(admin, tmp_path)
        restricted_namespace(admin, NS)
        kubectl(admin, "create", "namespace", PROTECTED)
        await apply_nrt_crd(api)
        # the fabric's sources: a Kueue and a KAI Topology, a ComputeDomainClique (of a node this
        # cluster does not have: the run's placements stay as they were)
        fabric_crds = await apply_fabric_crds(api)
        custom = client.CustomObjectsApi(api)
        for group, version, levels in (
            ("kueue.x-k8s.io", "v1beta1", ["example.com/block", "example.com/rack"]),
            ("kai.scheduler", "v1alpha1", ["example.com/hall", "example.com/rack"]),
        ):
            await custom.create_cluster_custom_object(
                group, version, "topologies", topology_manifest(group, version, "lp", levels)
            )
        await custom.create_namespaced_custom_object(
            "resource.nvidia.com", "v1beta1", PROTECTED, "computedomaincliques",
            clique_manifest(PROTECTED, "lp.u-1.1", {"lp-absent": "u-1.1"}),
        )  # fmt: skip
        # Volcano: a rack of a node this cluster does not have, under a block, and a hard PodGroup
        # of no pods
        for hn in (
            hypernode_manifest("lp-rack", 1, nodes=["lp-absent"]),
            hypernode_manifest("lp-block", 2, children=["lp-rack"]),
        ):
            await custom.create_cluster_custom_object(
                "topology.volcano.sh", "v1alpha1", "hypernodes", hn
            )
        await custom.create_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", PROTECTED, "podgroups",
            pod_group_manifest(PROTECTED, "lp", 2, 1),
        )  # fmt: skip
        await if_present(core.delete_namespaced_config_map(CONFIGMAP, GPU_NS))
        await create_mig_node(api, mig_spec, CONFIGMAP, GPU_NS)  # + the GPU Operator's namespace
        install(admin, redis_server.url)
        config = (await core.read_namespaced_config_map("pyctl-config", NS)).data
        sa_kubeconfig = token_kubeconfig(admin, NS, "pyctl", tmp_path / "pyctl-sa.kubeconfig")
        who = kubectl(sa_kubeconfig, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
        assert who.stdout == USER

        # -- the fragmented cluster (test_crash_e2e's), the MIG node and mig-manager ------------
        await create_nodes(api, specs)
        mgr = MigManagerSim(api, [mig_spec], namespace=GPU_NS, configmap=CONFIGMAP, delay=0.3)
        log_start = control_plane.audit_log.stat().st_size
        pyctl = Pyctl(config, sa_kubeconfig, tmp_path / "pyctl.log")
        sched = ExtraScheduler(
            control_plane,
            "pyctl-lp",
            strict_config(f"http://127.0.0.1:{pyctl.extender_port}/scheduler"),
            ["--pod-max-in-unschedulable-pods-duration=5s"],
        )
        sched.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(updater.run)
            tg.start_soon(mgr.run)
            await wait_until(pyctl.leader, "pyctl leader (as its ServiceAccount)", within=60)

            def fabric_levels_read() -> bool:
                text = pyctl.metrics()
                return all(
                    f'level="{lv}",source="{src}"}} 1' in text
                    for lv, src in (
                        ("example.com/rack", "kueue/lp"),
                        ("example.com/block", "kueue/lp"),
                        ("example.com/hall", "kai/lp"),
                        ("volcano.sh/hypernode-tier-1", "volcano/hypernodes"),
                        ("volcano.sh/hypernode-tier-2", "volcano/hypernodes"),
                    )
                )

            # the Topology objects' levels and the HyperNodes' tiers, read through the API
            # server as the ServiceAccount
            await wait_until(fabric_levels_read, "the fabric's sources' levels", within=60)
            await core.patch_node("lp-full", body({"spec": {"unschedulable": True}}))
            updater.hints["small-"] = [0, 1]
            small = gpu_deployment("small", 2, 1, "s", label=LABEL, selector=SEL)
            await apps.create_namespaced_deployment("default", body(small))

            async def tier(t: str) -> list[Any]:
                got = await core.list_namespaced_pod(
                    "default", label_selector=f"app={LABEL},tier={t}"
                )
                return list(got.items)

            async def smalls_split() -> bool:
                zones = {updater.where.get(f"default/{p.metadata.name}") for p in await tier("s")}
                return {(z[0], z[1]) for z in zones if z} == {("lp-frag", 0), ("lp-frag", 1)}

            await wait_until(smalls_split, "one small replica per NUMA zone of lp-frag", within=60)
            await core.patch_node("lp-full", body({"spec": {"unschedulable": None}}))
            for name, zone in (("fill-0", 0), ("fill-1", 1)):
                updater.pinned[f"default/{name}"] = zone
                pod = gpu_pod(name, 3, label=LABEL, node="lp-full")
                await core.create_namespaced_pod("default", body(pod))
            await wait_until(lambda: updater.gpus_used("lp-full") == [3, 3], "the fill pods")
            big = gpu_deployment("big", 1, 4, "b", label=LABEL, selector=SEL)
            await apps.create_namespaced_deployment("default", body(big))
            for i in range(2):
                await core.create_namespaced_pod(
                    "default", body(mig_pod(f"lp-mig-{i}", MIG_NODE, "3g.20gb", "lp-mig"))
                )

            async def big_on_frag() -> bool:
                got = await tier("b")
                return len(got) == 1 and got[0].spec.node_name == "lp-frag"

            async def mig_served() -> bool:
                pods = await core.list_namespaced_pod("default", label_selector="app=lp-mig")
                node = await core.read_node(MIG_NODE)
                taints = [t.key for t in node.spec.taints or []]
                return (
                    len(pods.items) == 2
                    and all(p.spec.node_name == MIG_NODE for p in pods.items)
                    and (node.metadata.labels or {}).get(STATE_LABEL) == "success"
                    and TAINT_KEY not in taints
                )

            rc = RedisConfig(url=redis_server.url)
            redis = redis_connect(rc)
            store = RedisWorkflowStore(redis, rc, CLUSTER)

            async def finished() -> bool:
                wfs = await workflows(store)
                kinds = Counter(w.kind for w in wfs if w.step == "done")
                return (
                    all(w.finished for w in wfs)
                    # the 4-GPU replica's room: made by a rescue (or a defragmentation move)
                    and kinds["rescue"] + kinds["compaction"] >= 1
                    and kinds["mig-reconfigure"] >= 1
                )

            await wait_until(big_on_frag, "compaction: the 4-GPU replica on lp-frag", within=120)
            await wait_until(mig_served, "MIG reconfiguration: the 3g.20gb pods bound", within=120)
            await wait_until(finished, "every workflow finished", within=60)
            tg.cancel_scope.cancel()
        pyctl.stop()
        await steer_as(sa_kubeconfig)
        log_end = control_plane.audit_log.stat().st_size
        await refused_foreign_rule(sa_kubeconfig)

        # -- the audit log: what the controller did, against what the chart grants -------------
        found = audit.calls(control_plane.audit_log, USER, log_start, log_end)
        granted = [g for g in await rbac(api) if not g.role.startswith("ClusterRole/system:")]
        with capsys.disabled():  # the table is part of the test's output
            print(f"\nleast privilege: {len(found)} calls of {USER} (audit log, during the run)")
            print(audit.table(found, granted, DEFAULTS))
        assert found, "no call of the ServiceAccount in the audit log"
        denied = sorted({(c.verb, c.resource, c.namespace) for c in found if c.code == 403})
        assert not denied, f"refused calls (403): {denied}"
        uncovered = sorted(
            {
                (c.verb, c.group, c.resource, c.namespace)
                for c in found
                if not c.non_resource and not any(g.covers(c) for g in granted)
            }
        )
        assert not uncovered, f"calls no grant of the chart covers: {uncovered}"
        assert {c.resource for c in found if c.non_resource} <= set(DEFAULTS)
        unused = sorted(
            {g.label() for g in granted if not any(g.covers(c) for c in found)} - set(UNUSED_OK)
        )
        assert not unused, (
            f"grants no call used (remove them, or name the path in UNUSED_OK): {unused}"
        )

        # -- admission: the same identity cannot do more to nodes and evictions -----------------
        await core.patch_node(
            "lp-full",
            body(
                {
                    "spec": {
                        "taints": [
                            {"key": "example.com/dedicated", "value": "x", "effect": "NoSchedule"}
                        ]
                    }
                }
            ),
        )
        sa = ["--kubeconfig", str(sa_kubeconfig)]

        def as_pyctl(*args: str) -> subprocess.CompletedProcess[str]:
            return kubectl(None, *sa, *args, check=False)

        node_rule = "pyctl may change only the node label nvidia.com/mig.config"
        taint_rule = "pyctl may add or remove only node taints whose key starts with pyctl.io/"
        assert node_rule in refused(as_pyctl("label", "node", "lp-full", "team=ml"))
        assert node_rule in refused(as_pyctl("label", "node", "lp-full", "nvidia.com/gpu.product-"))
        assert taint_rule in refused(as_pyctl("taint", "node", "lp-full", "example.com/dedicated-"))
        assert taint_rule in refused(
            as_pyctl("taint", "node", "lp-full", "other.io/x=y:NoSchedule")
        )
        assert "annotations" in refused(as_pyctl("annotate", "node", "lp-full", "a=b"))
        # what pyctl does is allowed
        for args in (
            ("cordon", "lp-full"),
            ("uncordon", "lp-full"),
            ("taint", "node", "lp-full", "pyctl.io/test=x:NoSchedule"),
            ("taint", "node", "lp-full", "pyctl.io/test-"),
            (
                "label",
                "--overwrite",
                "node",
                MIG_NODE,
                f"nvidia.com/mig.config={mig_spec.mig_config}",
            ),
        ):
            got = as_pyctl(*args)
            assert got.returncode == 0, (args, got.stderr)
        # RBAC: no secrets, no deletes
        assert "forbidden" in refused(as_pyctl("get", "secrets", "-n", NS)).lower()
        assert "forbidden" in refused(as_pyctl("delete", "node", "lp-full")).lower()
        assert "forbidden" in refused(as_pyctl("delete", "pod", "fill-0")).lower()
        # evictions in excluded namespaces are refused by the API server (pyctl's own client)
        for ns in ("kube-system", PROTECTED, NS):
            pod = gpu_pod(f"keep-{ns}", 0, label=LABEL, node="lp-full")
            pod["metadata"]["namespace"] = ns
            pod["spec"]["securityContext"] = {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            }
            pod["spec"]["containers"][0]["securityContext"] = {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }
            await core.create_namespaced_pod(ns, body(pod))
        kube = await connect(kubeconfig=sa_kubeconfig)
        try:
            for ns in ("kube-system", PROTECTED, NS):
                name = f"keep-{ns}"
                eviction = {
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": name, "namespace": ns},
                }
                resp = await kube.request(
                    "POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction", body=eviction
                )
                assert resp.status == 403, (ns, resp.status, resp.data[:300])
                assert f"pyctl may not evict pods in namespace {ns}" in resp.error().message
        finally:
            await kube.close()
        print(
            "admission: refused a foreign label (set and removed), a foreign taint (removed and "
            "added), an annotation, evictions in kube-system, lp-protected and pyctl-lp; allowed "
            "cordon/uncordon, a pyctl.io/ taint, nvidia.com/mig.config"
        )
    finally:
        if pyctl is not None:
            pyctl.stop()
        if sched is not None:
            sched.stop()
        if redis is not None:
            await close_client(redis)
        for name in ("small", "big"):
            await if_present(apps.delete_namespaced_deployment(name, "default"))
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={LABEL}", grace_period_seconds=0
        )
        await core.delete_collection_namespaced_pod(
            "default", label_selector="app=lp-mig", grace_period_seconds=0
        )
        helm("uninstall", "pyctl", "--namespace", NS, "--kubeconfig", str(admin), check=False)
        for ns in (NS, PROTECTED):
            kubectl(admin, "delete", "namespace", ns, "--wait=false", check=False)
        kubectl(
            admin,
            "delete",
            "pod",
            "keep-kube-system",
            "-n",
            "kube-system",
            "--grace-period=0",
            check=False,
        )
        await if_present(core.delete_namespaced_config_map(CONFIGMAP, GPU_NS))
        await delete_nodes(api, [*specs, mig_spec])
        await delete_crds(api, fabric_crds)


@pytest.mark.anyio
async def test_observe_mode_uses_exactly_its_read_only_grants(
    control_plane: ControlPlane,
    api: client.ApiClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The chart in observe mode (no write verb but the Lease's): `pyctl run --mode observe` with
    its ServiceAccount's token, on a cluster with a GPU node and a pod, uses every grant and is
    refused nothing."""
    assert control_plane.audit_log is not None
    admin = control_plane.kubeconfig
    ns, name = "pyctl-obs", "pyctl-obs"
    user = f"system:serviceaccount:{ns}:{name}"
    core = client.CoreV1Api(api)
    spec = GpuNodeSpec("obs-gpu", labels={"pyctl.e2e/obs": "true"})
    pyctl: Pyctl | None = None
    fabric_crds: list[str] = []
    try:
        apply_monitoring_crds(admin, tmp_path)
        restricted_namespace(admin, ns)
        await apply_nrt_crd(api)
        fabric_crds = await apply_fabric_crds(api)
        await create_nodes(api, [spec])
        await core.create_namespaced_pod(
            "default", body(gpu_pod("obs-pod", 1, label="obs-e2e", node="obs-gpu"))
        )
        helm(
            "install", "pyctl", str(CHART), "--namespace", ns, "--kubeconfig", str(admin),
            "--set", "mode=observe", "--set", f"fullnameOverride={name}",
            "--set", f"cluster={CLUSTER}", "--set", f"priorityClass.name={name}",
            "--set", "replicas=0",
            "--set", "redis.bundled=false", "--set", "redis.external.url=redis://127.0.0.1:1/0",
        )  # fmt: skip
        config = dict((await core.read_namespaced_config_map(f"{name}-config", ns)).data)
        config.pop("PYCTL_REDIS_URL")  # the in-memory store: this run is about the API server
        sa_kubeconfig = token_kubeconfig(admin, ns, name, tmp_path / "obs.kubeconfig")
        start = control_plane.audit_log.stat().st_size
        pyctl = Pyctl(config, sa_kubeconfig, tmp_path / "pyctl.log", namespace=ns, mode="observe")
        await wait_until(pyctl.leader, "pyctl leader (observe)", within=60)
        await anyio.sleep(4.0)  # a few Lease renewals (duration 3 s)
        pyctl.stop()
        found = audit.calls(
            control_plane.audit_log, user, start, control_plane.audit_log.stat().st_size
        )
        granted = await rbac(api, ns, name)
        with capsys.disabled():
            print(f"\nobserve mode: {len(found)} calls of {user}")
            print(audit.table(found, granted, DEFAULTS))
        assert not [c for c in found if c.code == 403]
        writes = {"create", "update", "patch", "delete"}
        assert {(c.verb, c.resource) for c in found if c.verb in writes} <= {
            ("create", "leases"),
            ("update", "leases"),
        }
        unused = sorted({g.label() for g in granted if not any(g.covers(c) for c in found)})
        assert not unused, f"grants no call used: {unused}"
        uncovered = [
            c for c in found if not c.non_resource and not any(g.covers(c) for g in granted)
        ]
        assert not uncovered
    finally:
        if pyctl is not None:
            pyctl.stop()
        helm("uninstall", "pyctl", "--namespace", ns, "--kubeconfig", str(admin), check=False)
        kubectl(admin, "delete", "namespace", ns, "--wait=false", check=False)
        kubectl(admin, "delete", "pod", "obs-pod", "--grace-period=0", check=False)
        await delete_nodes(api, [spec])
        await delete_crds(api, fabric_crds)
