"""Configuration: defaults, then a file (YAML or JSON), then the environment (`PYCTL_*`), then
command-line flags; read once at start, validated with a clear error, and passed down."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MODES = ("observe", "enforce")
CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")


class ConfigError(ValueError):
    """Invalid configuration; the message names the setting and where it came from."""


@dataclass(frozen=True)
class Config:
    #: the cluster's name (labels, Redis hash tag, federation member)
    cluster: str = "default"
    #: "sim" (the built-in simulated cluster), "kube" (kubeconfig or in-cluster)
    source: str = "sim"
    kubeconfig: str = ""
    in_cluster: bool = False
    #: redis://... or rediss://...; empty = the in-memory store
    redis_url: str = ""
    redis_cluster: bool = False
    redis_password: str = field(default="", repr=False)
    mode: str = "observe"
    metrics_host: str = "127.0.0.1"
    #: 0 = no HTTP server
    metrics_port: int = 0
    summary_interval: float = 1.0
    #: a workload file ({shapes: [...]}); empty = derived from the observed pods
    workload_file: str = ""
    default_topology_policy: str = "none"
    lease_name: str = "pyctl-leader"
    lease_namespace: str = "pyctl-system"
    lease_duration: float = 15.0
    identity: str = ""
    log_format: str = "json"
    log_level: str = "info"
    #: simulated cluster: virtual seconds per wall second (0 = as fast as possible), loop forever
    sim_speed: float = 480.0
    sim_forever: bool = False
    sim_seed: int = 7
    #: seconds between two compaction/MIG planning rounds on a real cluster
    workflow_interval: float = 30.0
    #: safety limits of the acting workflows (shared through Redis by replicas and clusters):
    #: token buckets (burst, refill per minute) globally, per node, per namespace, per workload;
    #: a cooldown per node; concurrent MIG reconfigurations; disruptions per hour (0: no limit)
    limit_global_burst: int = 10
    limit_global_per_minute: float = 1.0
    limit_node_burst: int = 2
    limit_node_per_minute: float = 0.2
    limit_namespace_burst: int = 5
    limit_namespace_per_minute: float = 0.5
    limit_workload_burst: int = 1
    limit_workload_per_minute: float = 0.5
    node_cooldown_seconds: float = 300.0
    mig_concurrency: int = 1
    disruptions_per_hour: int = 20
    #: after a node's MIG reconfiguration ends, seconds before it is re-partitioned again
    mig_node_holdoff_seconds: float = 600.0
    #: the mig-parted ConfigMap mig-manager reads (named in the GPU Operator's ClusterPolicy)
    mig_configmap_namespace: str = "gpu-operator"
    mig_configmap_name: str = "pyctl-mig-parted-config"
    #: which pods compaction may evict (the descheduler's DefaultEvictor rules): namespaces never
    #: touched (comma-separated), local-storage and system-critical pods, a priority at or above
    #: which pods stay (-1: no threshold), the replicas an owner must have
    evictor_excluded_namespaces: str = "kube-system"
    evictor_evict_local_storage_pods: bool = False
    evictor_evict_system_critical_pods: bool = False
    evictor_priority_threshold: int = -1
    evictor_min_replicas: int = 1

    def validate(self) -> Config:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"config {name}: {why}")

        if not CLUSTER_NAME.match(self.cluster):
            raise bad("cluster", f"{self.cluster!r} must be a DNS label (a-z, 0-9, '-', '.')")
        if self.source not in ("sim", "kube"):
            raise bad("source", f"{self.source!r} is not one of sim, kube")
        if self.mode not in MODES:
            raise bad("mode", f"{self.mode!r} is not one of {', '.join(MODES)}")
        if not 0 <= self.metrics_port <= 65535:
            raise bad("metrics_port", f"{self.metrics_port} is not a port")
        if self.summary_interval <= 0:
            raise bad("summary_interval", "must be positive")
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise bad(
                "redis_url", f"{self.redis_url!r} must start with redis://, rediss:// or unix://"
            )
        if self.log_format not in ("json", "text"):
            raise bad("log_format", "must be json or text")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise bad("log_level", "must be debug, info, warning or error")
        if self.default_topology_policy not in (
            "none",
            "best-effort",
            "restricted",
            "single-numa-node",
        ):
            raise bad(
                "default_topology_policy", f"{self.default_topology_policy!r} is not a policy"
            )
        if self.sim_speed < 0:
            raise bad("sim_speed", "must not be negative")
        if self.lease_duration < 2:
            raise bad("lease_duration", "must be at least 2 seconds")
        if self.workflow_interval <= 0:
            raise bad("workflow_interval", "must be positive")
        for name in (
            "limit_global_burst",
            "limit_node_burst",
            "limit_namespace_burst",
            "limit_workload_burst",
            "mig_concurrency",
        ):
            if getattr(self, name) < 1:
                raise bad(name, "must be at least 1")
        for name in (
            "limit_global_per_minute",
            "limit_node_per_minute",
            "limit_namespace_per_minute",
            "limit_workload_per_minute",
            "node_cooldown_seconds",
            "mig_node_holdoff_seconds",
        ):
            if getattr(self, name) < 0:
                raise bad(name, "must not be negative")
        if self.evictor_min_replicas < 1:
            raise bad("evictor_min_replicas", "must be at least 1")
        if not self.mig_configmap_namespace or not self.mig_configmap_name:
            raise bad("mig_configmap_namespace/name", "must not be empty")
        if self.disruptions_per_hour < 0:
            raise bad("disruptions_per_hour", "must not be negative (0: no limit)")
        return self

    def evictor_options(self) -> Any:
        """The evictor rules of compaction (`pyctl.workflows.evictor.EvictorOptions`)."""
        from pyctl.workflows.evictor import EvictorOptions

        excluded = tuple(
            n.strip() for n in self.evictor_excluded_namespaces.split(",") if n.strip()
        )
        return EvictorOptions(
            evict_local_storage_pods=self.evictor_evict_local_storage_pods,
            evict_system_critical_pods=self.evictor_evict_system_critical_pods,
            priority_threshold=(
                None if self.evictor_priority_threshold < 0 else self.evictor_priority_threshold
            ),
            min_replicas=self.evictor_min_replicas,
            excluded_namespaces=excluded,
        )


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def _coerce(name: str, value: Any, where: str) -> Any:
    kind = type(getattr(Config(), name))
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(value)
        if kind is int:
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if not isinstance(value, str | int | float):
            raise ValueError(value)
        return str(value)
    except ValueError:
        raise ConfigError(
            f"config {name} ({where}): {value!r} is not a valid {kind.__name__}"
        ) from None


def load_config(
    file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Merge the sources in order of precedence and validate."""
    values: dict[str, Any] = {}
    if file:
        try:
            data = yaml.safe_load(Path(file).read_text(encoding="utf-8")) or {}
        except OSError as e:
            raise ConfigError(f"config file {file}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {file}: not valid YAML/JSON: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {file}: expected a mapping")
        for k, v in data.items():
            name = str(k).replace("-", "_")
            if name not in _FIELDS:
                raise ConfigError(f"config file {file}: unknown setting {k!r}")
            values[name] = _coerce(name, v, f"file {file}")
    for k, v in (env if env is not None else os.environ).items():
        if k.startswith("PYCTL_") and k != "PYCTL_CACHE":
            name = k[len("PYCTL_") :].lower()
            if name not in _FIELDS:
                raise ConfigError(f"environment {k}: unknown setting")
            values[name] = _coerce(name, v, f"environment {k}")
    for k, v in (flags or {}).items():
        if v is not None:
            values[k] = _coerce(k, v, f"flag --{k.replace('_', '-')}")
    return Config(**values).validate()
