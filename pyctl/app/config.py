"""Configuration: a tree of typed sections. Defaults, then a file (YAML or JSON), then the
environment (`PYCTL_*`), then command-line flags; read once at start, validated with a clear
error that names the setting and where it came from, and passed down.

A setting has one flat name, `<section>_<field>` (`redis_url`, `limit_node_burst`,
`mig_apply_timeout`, `evictor_min_pod_age_seconds`), used in the environment (`PYCTL_REDIS_URL`)
and by flags; a file may give it flat or nested (`redis: {url: ...}`). The sections that
configure lower layers are those layers' own option types (`MigOptions`, `EvictorOptions`,
`ReflectorOptions`), so a setting reaches the code that reads it without being copied.
Every number must be finite; every setting is checked against its bounds in `validate`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import ssl
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from pyctl import safe_yaml
from pyctl.cluster.bounds import MAX_KEY_CHARS, MAX_LEVELS
from pyctl.cluster.kube.lease import LEASE_DURATION
from pyctl.cluster.kube.reflector import ReflectorOptions
from pyctl.cluster.selectors import SelectorError, parse_selector
from pyctl.cluster.sim.scenario import SEED
from pyctl.controller.controller import SUMMARY_INTERVAL, WORKLOAD_INTERVAL
from pyctl.controller.reconcile import FABRIC_INTERVAL
from pyctl.core.fabric import DEFAULT_LEVELS
from pyctl.core.policy import PlanLimits
from pyctl.model import DEFAULT_TOPOLOGY_POLICY, TOPOLOGY_POLICIES
from pyctl.recommend.prometheus import parse_duration
from pyctl.serve.extender_server import ExtenderOptions
from pyctl.serve.health import MetricsOptions
from pyctl.serve.http import TlsFiles
from pyctl.state.ratelimit import BucketLimit, SafetyLimits
from pyctl.state.redis_client import RedisConfig
from pyctl.workflows.evictor import EvictorOptions
from pyctl.workflows.loop import WORKFLOW_INTERVAL
from pyctl.workflows.mig_reconfig import MigOptions

MODES = ("observe", "enforce")
CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
#: the largest config file read (a config is a few KiB)
MAX_FILE_BYTES = 1 << 20
#: `PYCTL_*` variables that are not settings: the build's cache directory (the Makefile), and
#: tracebacks of pyctl's own failures (`pyctl.cli.errors.debug_requested`)
NOT_SETTINGS = frozenset({"PYCTL_CACHE", "PYCTL_DEBUG"})


class ConfigError(ValueError):
    """Invalid configuration; the message names the setting and where it came from."""


@dataclass(frozen=True)
class RedisSection:
    """The shared state (Redis). An empty `url` keeps everything in memory."""

    #: redis://[user[:password]@]host[:port][/db] or rediss://... (TLS)
    url: str = ""
    cluster: bool = False
    username: str = ""
    password: str = field(default="", repr=False)
    #: TLS (rediss://): the CA bundle to verify the server, and a client certificate and key
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_check_hostname: bool = True

    def client_config(self) -> RedisConfig:
        """The client configuration (raises ValueError on a bad URL or TLS setting)."""
        return RedisConfig(
            url=self.url,
            cluster=self.cluster,
            username=self.username or None,
            password=self.password or None,
            ssl_ca_file=self.tls_ca_file or None,
            ssl_cert_file=self.tls_cert_file or None,
            ssl_key_file=self.tls_key_file or None,
            ssl_check_hostname=self.tls_check_hostname,
        )


#: the HTTP servers' sections are their own option types (pyctl/serve/)
MetricsSection = MetricsOptions
ExtenderSection = ExtenderOptions


@dataclass(frozen=True)
class LeaseSection:
    name: str = "pyctl-leader"
    namespace: str = "pyctl-system"
    duration: float = LEASE_DURATION
    #: this replica's identity in the Lease (default: hostname-pid)
    identity: str = ""


@dataclass(frozen=True)
class LogSection:
    format: str = "json"
    level: str = "info"


@dataclass(frozen=True)
class SimSection:
    """The built-in simulated cluster: virtual seconds per wall second (0 = as fast as
    possible), loop forever, the scenario's seed."""

    speed: float = 480.0
    forever: bool = False
    seed: int = SEED


@dataclass(frozen=True)
class WorkloadSection:
    """Which pods shape the workload M (when no `file` gives it): pods of these namespaces
    (empty: all) except the excluded ones, matching `label_selector`; no single shape weighs
    more than `max_shape_weight` of M (so that no tenant steers what compaction optimises for
    by creating pending pods)."""

    #: a workload file ({shapes: [...]}); empty = derived from the observed pods
    file: str = ""
    namespaces: tuple[str, ...] = ()
    excluded_namespaces: tuple[str, ...] = ("kube-system",)
    label_selector: str = ""
    max_shape_weight: float = 0.5
    #: seconds between two derivations of M (a change re-scores every node)
    interval: float = WORKLOAD_INTERVAL


@dataclass(frozen=True)
class LimitSection:
    """Safety limits of the acting workflows (shared through Redis by replicas and clusters):
    token buckets (burst, refill per minute) globally, per node, per namespace, per workload; a
    cooldown per node; disruptions per hour (0: no limit). A refill rate of 0 is refused: a
    bucket that never refills is a limit that is never lifted (use the mode to stop acting)."""

    global_burst: int = 10
    global_per_minute: float = 1.0
    node_burst: int = 2
    node_per_minute: float = 0.2
    namespace_burst: int = 5
    namespace_per_minute: float = 0.5
    workload_burst: int = 1
    workload_per_minute: float = 0.5
    node_cooldown_seconds: float = 300.0
    disruptions_per_hour: int = 20

    def safety_limits(self, mig_concurrency: int) -> SafetyLimits:
        def bucket(burst: int, per_minute: float) -> BucketLimit:
            return BucketLimit(capacity=burst, per_second=per_minute / 60.0)

        return SafetyLimits(
            global_bucket=bucket(self.global_burst, self.global_per_minute),
            node_bucket=bucket(self.node_burst, self.node_per_minute),
            namespace_bucket=bucket(self.namespace_burst, self.namespace_per_minute),
            workload_bucket=bucket(self.workload_burst, self.workload_per_minute),
            node_cooldown_seconds=self.node_cooldown_seconds,
            mig_concurrency=mig_concurrency,
            disruptions_per_hour=self.disruptions_per_hour or None,
        )


@dataclass(frozen=True)
class WorkflowSection:
    #: seconds between two compaction/MIG planning rounds on a real cluster
    interval: float = WORKFLOW_INTERVAL
    #: most evictions one compaction round plans (a rescue's included)
    max_moves: int = PlanLimits.max_moves
    #: most evictions one rescue of a pending pod may take (0: no rescues)
    rescue_depth: int = PlanLimits.rescue_depth
    #: seconds a rescue may take, from its start to the pending pod bound
    rescue_deadline: float = 900.0
    #: seconds an unschedulable pod must have existed before a rescue evicts for it (0: at
    #: once); room freed by departures meanwhile costs no eviction
    rescue_after: float = 0.0
    #: smallest fall of fragment (milli-GPU) a defragmentation move must bring: an eviction
    #: restarts a replica, so a move must make at least one GPU's worth of idle capacity usable
    #: again (on the built-in scenario, moves worth less cut stranded GPU-hours by under 1% for
    #: about a hundred evictions a day: `pyctl demo`, docs/simulator.md). Rescues of pending
    #: pods are not held to it.
    min_gain: float = PlanLimits.min_gain

    def plan_limits(self) -> PlanLimits:
        return PlanLimits(
            max_moves=self.max_moves, min_gain=self.min_gain, rescue_depth=self.rescue_depth
        )


@dataclass(frozen=True)
class FabricSection:
    """The topology levels the fabric pass reads (node label keys, narrowest domain first;
    docs/fabric.md) and how often it runs (seconds; also when M changes)."""

    levels: tuple[str, ...] = DEFAULT_LEVELS
    interval: float = FABRIC_INTERVAL


@dataclass(frozen=True)
class RecommendSection:
    """The resource normalization report (`pyctl recommend`), made periodically in observe
    mode: seconds between two reports (0: none), where DCGM usage comes from (a Prometheus
    URL, empty: requests only), over what window, with what memory headroom."""

    interval: float = 300.0
    prometheus_url: str = ""
    window: str = "7d"
    headroom: float = 0.2


@dataclass(frozen=True)
class Config:
    #: the cluster's name (labels, Redis hash tag, federation member)
    cluster: str = "default"
    #: "sim" (the built-in simulated cluster), "kube" (kubeconfig or in-cluster)
    source: str = "sim"
    kubeconfig: str = ""
    in_cluster: bool = False
    mode: str = "observe"
    summary_interval: float = SUMMARY_INTERVAL
    default_topology_policy: str = DEFAULT_TOPOLOGY_POLICY
    redis: RedisSection = field(default_factory=RedisSection)
    metrics: MetricsOptions = field(default_factory=MetricsOptions)
    extender: ExtenderOptions = field(default_factory=ExtenderOptions)
    lease: LeaseSection = field(default_factory=LeaseSection)
    log: LogSection = field(default_factory=LogSection)
    sim: SimSection = field(default_factory=SimSection)
    workload: WorkloadSection = field(default_factory=WorkloadSection)
    limit: LimitSection = field(default_factory=LimitSection)
    workflow: WorkflowSection = field(default_factory=WorkflowSection)
    mig: MigOptions = field(default_factory=MigOptions)
    evictor: EvictorOptions = field(default_factory=EvictorOptions)
    reflector: ReflectorOptions = field(default_factory=ReflectorOptions)
    recommend: RecommendSection = field(default_factory=RecommendSection)
    fabric: FabricSection = field(default_factory=FabricSection)

    def validate(self) -> Config:
        _validate(self)
        return self

    def safety_limits(self) -> SafetyLimits:
        return self.limit.safety_limits(self.mig.concurrency)


# ---- the schema: flat names ↔ (section, field) --------------------------------------------------


@dataclass(frozen=True)
class _Setting:
    path: tuple[str, ...]
    kind: Any  # the field's type


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _schema(cls: type[Any] = Config, prefix: tuple[str, ...] = ()) -> dict[str, _Setting]:
    hints = typing.get_type_hints(cls)
    out: dict[str, _Setting] = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_section(tp):
            out.update(_schema(tp, (*prefix, f.name)))
        else:
            path = (*prefix, f.name)
            out["_".join(path)] = _Setting(path, tp)
    return out


SETTINGS: dict[str, _Setting] = _schema()
SECTIONS: frozenset[str] = frozenset(
    f.name for f in dataclasses.fields(Config) if _is_section(typing.get_type_hints(Config)[f.name])
)


def _coerce(name: str, tp: Any, value: Any, where: str) -> Any:
    """`value` as the setting's type; ConfigError naming the setting and source otherwise."""

    def bad(why: str = "") -> ConfigError:
        shown = "***" if "password" in name or "token" in name else repr(value)[:80]
        return ConfigError(
            f"config {name} ({where}): {shown} is not a valid {_type_name(tp)}"
            + (f" ({why})" if why else "")
        )

    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip() == ""):
            return None
        return _coerce(name, args[0], value, where)
    if origin is tuple:
        if isinstance(value, str):
            items = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, list | tuple):
            items = list(value)
        else:
            raise bad()
        if not all(isinstance(i, str | int | float) and not isinstance(i, bool) for i in items):
            raise bad("a list of names")
        return tuple(str(i) for i in items)
    if tp is bool:
        if isinstance(value, bool):
            return value
        s = str(value).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off", ""):
            return False
        raise bad()
    if tp is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise bad()
        try:
            v = int(value)
        except (TypeError, ValueError, OverflowError):
            raise bad() from None
        if abs(v) > 2**53:
            raise bad("out of range")
        return v
    if tp is float:
        if isinstance(value, bool):
            raise bad()
        try:
            f = float(value)
        except (TypeError, ValueError, OverflowError):
            raise bad() from None
        if not math.isfinite(f):
            raise bad("must be finite")
        return f
    if tp is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise bad()
        return str(value)
    raise bad()  # pragma: no cover - every setting has one of the types above


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is tuple:
        return "comma-separated list"
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    return getattr(tp, "__name__", str(tp))


def _flatten(data: Mapping[str, Any], file: str) -> dict[str, Any]:
    """A file's settings by flat name (nested sections or flat names)."""
    out: dict[str, Any] = {}

    def put(name: str, value: Any) -> None:
        if name in out:  # `mode` and `mode` spelt again, flat and nested, or with a '-'
            raise ConfigError(f"config file {file}: setting {name!r} given twice")
        out[name] = value

    for k, v in data.items():
        key = str(k).replace("-", "_")
        if key in SECTIONS and isinstance(v, Mapping):
            for kk, vv in v.items():
                put(f"{key}_{str(kk).replace('-', '_')}", vv)
        else:
            put(key, v)
    for name in out:
        if name not in SETTINGS:
            raise ConfigError(f"config file {file}: unknown setting {name!r}")
    return out


def _read_file(file: str) -> Mapping[str, Any]:
    try:
        path = Path(file)
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"config file {file}: larger than {MAX_FILE_BYTES} bytes")
        data = safe_yaml.load(path.read_text(encoding="utf-8"), f"config file {file}") or {}
    except OSError as e:
        raise ConfigError(f"config file {file}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {file}: not UTF-8 text") from None
    except safe_yaml.YamlInputError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {file}: expected a mapping")
    return data


def _build(cls: type[Any], values: Mapping[tuple[str, ...], Any], prefix: tuple[str, ...]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        path = (*prefix, f.name)
        tp = hints[f.name]
        if _is_section(tp):
            kwargs[f.name] = _build(tp, values, path)
        elif path in values:
            kwargs[f.name] = values[path]
    try:
        return cls(**kwargs)
    except ValueError as e:  # a section's own checks (ReflectorOptions)
        raise ConfigError(f"config {'_'.join(prefix) or 'settings'}: {e}") from None


def load_config(
    file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Merge the sources in order of precedence and validate."""
    values: dict[tuple[str, ...], Any] = {}

    def put(name: str, value: Any, where: str) -> None:
        s = SETTINGS.get(name)
        if s is None:
            raise ConfigError(f"{where}: unknown setting {name!r}")
        values[s.path] = _coerce(name, s.kind, value, where)

    if file:
        for name, v in _flatten(_read_file(file), file).items():
            put(name, v, f"file {file}")
    for k, v in (env if env is not None else os.environ).items():
        if k.startswith("PYCTL_") and k not in NOT_SETTINGS:
            put(k[len("PYCTL_") :].lower(), v, f"environment {k}")
    for k, v in (flags or {}).items():
        if v is not None:
            put(k, v, f"flag --{k.replace('_', '-')}")
    cfg: Config = _build(Config, values, ())
    return cfg.validate()


# ---- validation ------------------------------------------------------------------------------


def _validate(c: Config) -> None:
    def bad(name: str, why: str) -> ConfigError:
        return ConfigError(f"config {name}: {why}")

    if not CLUSTER_NAME.match(c.cluster):
        raise bad("cluster", f"{c.cluster!r} must be a DNS label (a-z, 0-9, '-', '.')")
    if c.source not in ("sim", "kube"):
        raise bad("source", f"{c.source!r} is not one of sim, kube")
    if c.mode not in MODES:
        raise bad("mode", f"{c.mode!r} is not one of {', '.join(MODES)}")
    if c.default_topology_policy not in TOPOLOGY_POLICIES:
        raise bad("default_topology_policy", f"{c.default_topology_policy!r} is not a policy")
    if len(c.fabric.levels) > MAX_LEVELS or not all(
        0 < len(k) <= MAX_KEY_CHARS for k in c.fabric.levels
    ):
        raise bad(
            "fabric_levels", f"at most {MAX_LEVELS} label keys of 1..{MAX_KEY_CHARS} characters"
        )
    for name, port in (("metrics_port", c.metrics.port), ("extender_port", c.extender.port)):
        if not 0 <= port <= 65535:
            raise bad(name, f"{port} is not a port")
    if c.extender.port and c.extender.port == c.metrics.port:
        raise bad(
            "extender_port", "must differ from metrics_port (the extender has its own server)"
        )
    if c.redis.url:
        if c.redis.url.startswith("unix://"):
            raise bad("redis_url", "unix:// sockets are not supported; use redis:// or rediss://")
        try:
            c.redis.client_config()
        except ValueError as e:
            raise bad("redis", _mask(str(e), c.redis.password)) from None
    if c.workload.label_selector.strip():
        try:
            parse_selector(c.workload.label_selector)
        except SelectorError as e:
            raise bad("workload_label_selector", str(e)) from None
    if c.log.format not in ("json", "text"):
        raise bad("log_format", "must be json or text")
    if c.log.level not in ("debug", "info", "warning", "error"):
        raise bad("log_level", "must be debug, info, warning or error")
    if (bool(c.extender.tls_cert_file) != bool(c.extender.tls_key_file)) or (
        c.extender.client_ca_file and not c.extender.tls_cert_file
    ):
        raise bad(
            "extender_tls", "tls_cert_file and tls_key_file go together (client_ca_file needs them)"
        )
    if c.recommend.prometheus_url and not c.recommend.prometheus_url.startswith(
        ("http://", "https://")
    ):
        raise bad("recommend_prometheus_url", "must start with http:// or https://")
    try:
        parse_duration(c.recommend.window)
    except ValueError as e:
        raise bad("recommend_window", str(e)) from None
    if c.extender.port:
        _extender_files(c, bad)
    _ranges(c, bad)


def _extender_files(c: Config, bad: Any) -> None:
    """The extender's certificate, key, CA and token files can be read (a typo would otherwise
    show only as every request refused)."""
    e = c.extender
    if e.tls_cert_file:
        try:
            TlsFiles(e.tls_cert_file, e.tls_key_file, e.client_ca_file)
        except (OSError, ssl.SSLError, ValueError) as err:
            why = getattr(err, "strerror", None) or str(err) or type(err).__name__
            files = ", ".join(f for f in (e.tls_cert_file, e.tls_key_file, e.client_ca_file) if f)
            raise bad("extender_tls", f"cannot load {files}: {why}") from None
    if e.token_file:
        try:
            with open(e.token_file, "rb") as f:
                empty = not f.read(64 << 10).strip()
        except OSError as err:
            raise bad("extender_token_file", f"{e.token_file}: {err.strerror or err}") from None
        if empty:
            raise bad("extender_token_file", f"{e.token_file} is empty")


# (flat name, lowest, highest): every other number only has to be finite
_RANGES: tuple[tuple[str, float, float], ...] = (
    ("summary_interval", 0.01, 3600),
    ("lease_duration", 2, 3600),
    ("sim_speed", 0, 1e7),
    ("sim_seed", 0, 2**32),
    ("workload_max_shape_weight", 0.01, 1),
    ("workload_interval", 0.1, 86400),
    ("workflow_interval", 0.01, 86400),
    ("workflow_max_moves", 0, 1000),
    ("workflow_rescue_depth", 0, 8),
    ("workflow_rescue_deadline", 1, 86400),
    ("workflow_rescue_after", 0, 86400),
    ("workflow_min_gain", 0, 1e6),
    ("limit_global_burst", 1, 1e6),
    ("limit_node_burst", 1, 1e6),
    ("limit_namespace_burst", 1, 1e6),
    ("limit_workload_burst", 1, 1e6),
    ("limit_global_per_minute", 1e-3, 1e6),
    ("limit_node_per_minute", 1e-3, 1e6),
    ("limit_namespace_per_minute", 1e-3, 1e6),
    ("limit_workload_per_minute", 1e-3, 1e6),
    ("limit_node_cooldown_seconds", 0, 86400 * 7),
    ("limit_disruptions_per_hour", 0, 1e6),
    ("metrics_max_connections", 1, 65536),
    ("metrics_read_timeout", 0.1, 600),
    ("extender_max_concurrency", 1, 1024),
    ("extender_max_body_bytes", 1024, 256 << 20),
    ("extender_read_timeout", 0.1, 600),
    ("extender_deadline", 0.01, 60),
    ("extender_max_connections", 1, 65536),
    ("mig_concurrency", 1, 1024),
    ("mig_acquire_timeout", 1, 86400),
    ("mig_apply_timeout", 1, 86400),
    ("mig_drain_timeout", 1, 86400),
    ("mig_poll", 0.01, 3600),
    ("mig_node_holdoff_seconds", 0, 86400 * 7),
    ("mig_max_used_destroyed", 0, 1024),
    ("mig_max_starts", 0, 1024),
    ("evictor_min_replicas", 0, 1e6),
    ("evictor_min_pod_age_seconds", 0, 86400 * 365),
    ("recommend_interval", 0, 86400 * 7),
    ("recommend_headroom", 0, 10),
    ("fabric_interval", 0.1, 86400),
)


def _get(c: Config, name: str) -> Any:
    obj: Any = c
    for part in SETTINGS[name].path:
        obj = getattr(obj, part)
    return obj


def _ranges(c: Config, bad: Any) -> None:
    for name, lo, hi in _RANGES:
        v = _get(c, name)
        if not (isinstance(v, int | float) and math.isfinite(v) and lo <= v <= hi):
            raise bad(name, f"{v!r} is outside {lo:g}..{hi:g}")
    if c.limit.disruptions_per_hour < 0:
        raise bad("limit_disruptions_per_hour", "must not be negative (0: no limit)")


def _mask(text: str, password: str) -> str:
    """`text` with the URL's password (and the configured one) replaced by ***."""
    text = re.sub(r"(://[^:/@\s]*:)[^@/\s]+@", r"\1***@", text)
    return text.replace(password, "***") if password else text
