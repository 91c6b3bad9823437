"""The Actuator of the simulated cluster: evictions go to the simulation (whose ReplicaSets
recreate the pods and whose scheduler places them); cordons and taints keep its scheduler off a
node; a `nvidia.com/mig.config` label is answered by the simulated mig-manager, reading the
mig-parted config from the ConfigMaps kept here; everything is recorded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pyctl.cluster.sim.source import SimClusterSource
from pyctl.cluster.source import ActuatorError, EvictionOutcome
from pyctl.core.mig import MIG_CONFIG_LABEL, parse_mig_parted, to_yaml

#: the mig-parted config file of the simulated GPU Operator (MigOptions' default location)
SIM_CONFIGMAP = ("gpu-operator", "pyctl-mig-parted-config")
_BASE = {"all-1g.5gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}]}


def _default_configmaps() -> dict[tuple[str, str], dict[str, str]]:
    return {SIM_CONFIGMAP: {"config.yaml": to_yaml({"version": "v1", "mig-configs": _BASE})}}


@dataclass
class SimActuator:
    source: SimClusterSource
    calls: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)
    configmaps: dict[tuple[str, str], dict[str, str]] = field(default_factory=_default_configmaps)

    async def cordon(self, node: str, on: bool) -> None:
        self.calls.append(("cordon", (node, on)))
        await self.source.isolate(node, cordon=on)

    #: injected faults: "namespace/pod" -> the error status the simulated API server answers
    #: that pod's evictions with (`ActuatorError`), as a real one does when it fails
    fail_evictions: dict[str, int] = field(default_factory=dict)

    async def try_evict(self, namespace: str, pod: str, uid: str = "") -> EvictionOutcome:
        """The simulated cluster has no PodDisruptionBudgets: every eviction is accepted, but
        those of the pods in `fail_evictions`."""
        self.calls.append(("evict", (namespace, pod)))
        status = self.fail_evictions.get(f"{namespace}/{pod}")
        if status is not None:
            raise ActuatorError(status, f"{status} InternalError: eviction of {namespace}/{pod}")
        ok = await self.source.evict(namespace, pod)
        return EvictionOutcome(ok, 201 if ok else 429)

    async def label_node(self, node: str, labels: Mapping[str, str | None]) -> None:
        self.calls.append(("label_node", (node, dict(labels))))
        config = labels.get(MIG_CONFIG_LABEL)
        if config:
            await self.source.mig_config(node, config, self._layouts(node, config))

    def _layouts(self, node: str, config: str) -> list[dict[str, int] | None] | None:
        """Per MIG GPU of the node (zone order): the layout `config` selects (None: not
        selected); None when no ConfigMap holds `config`."""
        text = self.configmaps.get(SIM_CONFIGMAP, {}).get("config.yaml")
        entries = parse_mig_parted(text).get(config) if text else None
        if entries is None:
            return None
        n = self.source.cluster.by_name[node]
        gpus = [m.gpu for z in n.zones for m in z.mig]
        listed = sorted({d for e in entries if e["devices"] != "all" for d in e["devices"]})
        # the controller numbers MIG GPUs as the simulation does; else they are matched by rank
        same = set(listed) <= set(gpus)
        rank = {d: d for d in listed} if same else dict(zip(listed, gpus, strict=False))
        out: list[dict[str, int] | None] = []
        for g in gpus:
            layout: dict[str, int] | None = None
            for e in entries:
                dev = e["devices"]
                if dev == "all" or g in [rank.get(d) for d in dev]:
                    if not e["mig-enabled"]:
                        return None  # MIG mode changes are not simulated: failed
                    layout = dict(e.get("mig-devices") or {})
                    break
            out.append(layout)
        return out

    async def device_taint_rules(self) -> dict[str, dict[str, object]] | None:
        """The simulated cluster has no DRA driver: no DeviceTaintRules."""
        return None

    async def put_device_taint_rule(self, manifest: Mapping[str, object], on: bool) -> None:
        self.calls.append(("put_device_taint_rule", (dict(manifest), on)))

    async def taint(
        self, node: str, key: str, effect: str = "NoSchedule", *, value: str = "", on: bool = True
    ) -> bool:
        self.calls.append(("taint", (node, key, effect, value, on)))
        await self.source.isolate(node, taint=key, on=on)
        return True

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        got = self.configmaps.get((namespace, name))
        return None if got is None else dict(got)

    async def apply_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        self.calls.append(("apply_configmap", (namespace, name)))
        self.configmaps.setdefault((namespace, name), {}).update(data)

    async def event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        *,
        uid: str = "",
        warning: bool = False,
    ) -> None:
        self.calls.append(("event", (kind, namespace, name, reason, message)))
