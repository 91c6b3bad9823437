"""GPU usage per container from Prometheus, as NVIDIA's dcgm-exporter exports it.

Series (dcgm-exporter's default counters and its DCP list): ``DCGM_FI_DEV_FB_USED`` (framebuffer
memory used, MiB), ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio of time the graphics engine is
active, 0..1) or, where profiling metrics are off, ``DCGM_FI_DEV_GPU_UTIL`` (GPU utilization, %).
Labels, as its metrics template writes them: ``gpu``, ``UUID``, ``device``, ``modelName``,
``GPU_I_PROFILE`` and ``GPU_I_ID`` on a MIG instance's series, ``Hostname``, and with the
Kubernetes pod mapping ``namespace``, ``pod``, ``container`` — renamed ``exported_namespace``,
``exported_pod``, ``exported_container`` by a Prometheus that scrapes without ``honor_labels``
(then ``pod`` is the exporter's own pod); the ``exported_`` ones win when both are there.

Read with the HTTP API (``/api/v1/query_range``) over a window, at a step of ``window / points``
(at least 60 s): memory as ``max_over_time(FB_USED[step])`` (no peak between two points is lost),
utilization as ``avg_over_time(...[step])``. Per container: the peak memory (the largest value of
any of its GPUs or instances) and the 95th percentile of the utilization points.

Hostile input is counted, reported and left out, never used: a value that is NaN, infinite,
negative, memory above what the device can hold (a MIG instance's profile memory, or 4 TiB),
utilization above 1 (100%); a series without a pod label is GPU capacity no pod holds (counted
apart); an answer that is not the API's is an error naming the URL.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pyctl.jsontypes import JsonObject

MEMORY_METRIC: Final = "DCGM_FI_DEV_FB_USED"
UTIL_METRICS: Final = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL")
#: the percentage metric (others are ratios)
PERCENT_METRICS: Final = ("DCGM_FI_DEV_GPU_UTIL",)
MAX_MEMORY_MIB: Final = 4 * 1024 * 1024
DEFAULT_POINTS: Final = 500
_DURATION: Final = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_PROFILE_GB: Final = re.compile(r"^\d+g\.(\d+)gb")


class PrometheusError(Exception):
    """Prometheus cannot be read; the message is one line naming the URL."""


def parse_duration(text: str) -> float:
    """A Prometheus duration (``7d``, ``1h30m``, ``90s``) in seconds."""
    t = text.strip()
    pos = 0
    total = 0.0
    for m in _DURATION.finditer(t):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not t or pos != len(t) or total <= 0:
        raise ValueError(f"{text!r} is not a duration (e.g. 7d, 12h, 30m)")
    return total


@dataclass(frozen=True, slots=True)
class RangeSeries:
    labels: Mapping[str, str]
    #: (unix time, value as Prometheus wrote it: "NaN", "+Inf" and the like included)
    values: tuple[tuple[float, str], ...]


class PrometheusClient:
    """The Prometheus HTTP API (read-only): ``query_range``."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"{url!r}: expected an http:// or https:// URL of Prometheus")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            detail = _api_error(e.read()) or str(e.reason)
            raise PrometheusError(f"{self.url}: HTTP {e.code}: {detail}") from None
        except urllib.error.URLError as e:
            raise PrometheusError(f"{self.url}: cannot reach Prometheus: {e.reason}") from None
        except (TimeoutError, OSError) as e:
            raise PrometheusError(f"{self.url}: {e or type(e).__name__}") from None
        try:
            doc = json.loads(body)
        except ValueError:
            raise PrometheusError(f"{self.url}{path}: the answer is not JSON") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            why = doc.get("error") if isinstance(doc, dict) else None
            raise PrometheusError(f"{self.url}{path}: query failed: {why or 'no status'}")
        return doc.get("data")

    def query_range(self, query: str, start: float, end: float, step: float) -> list[RangeSeries]:
        data = self._get(
            "/api/v1/query_range",
            {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise PrometheusError(f"{self.url}: query_range did not return a matrix")
        out = []
        for s in data.get("result") or []:
            if not isinstance(s, dict) or not isinstance(s.get("metric"), dict):
                raise PrometheusError(f"{self.url}: query_range returned a malformed series")
            values = []
            for v in s.get("values") or []:
                if isinstance(v, list) and len(v) == 2:
                    values.append((float(v[0]), str(v[1])))
            out.append(RangeSeries({str(k): str(x) for k, x in s["metric"].items()}, tuple(values)))
        return out


def _api_error(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return ""
    if isinstance(doc, dict):
        return f"{doc.get('errorType', '')}: {doc.get('error', '')}".strip(": ")
    return ""


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    namespace: str
    pod: str
    container: str
    #: the largest framebuffer memory used on any of its GPUs or MIG instances, MiB
    peak_memory_mib: float | None = None
    #: 95th percentile of the utilization points (0..1 of the GPU or MIG instance it ran on)
    util_p95: float | None = None
    #: MIG profiles its series carried (GPU_I_PROFILE); "" for a whole GPU
    profiles: tuple[str, ...] = ()
    series: int = 0
    points: int = 0


@dataclass
class UsageReport:
    source: str
    window_seconds: float
    end: float
    step: float
    util_metric: str | None = None
    containers: dict[tuple[str, str, str], ContainerUsage] = field(default_factory=dict)
    series: int = 0
    unattributed_series: int = 0
    bad_points: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> JsonObject:
        return {
            "source": self.source,
            "window_seconds": self.window_seconds,
            "end": self.end,
            "step_seconds": self.step,
            "memory_metric": MEMORY_METRIC,
            "util_metric": self.util_metric,
            "series": self.series,
            "unattributed_series": self.unattributed_series,
            "containers": len(self.containers),
            "bad_points": dict(self.bad_points),
            "examples": list(self.examples),
            "problems": list(self.problems),
        }


def _label(labels: Mapping[str, str], name: str) -> str:
    return labels.get(f"exported_{name}") or labels.get(name) or ""


def _limit_mib(labels: Mapping[str, str]) -> float:
    m = _PROFILE_GB.match(labels.get("GPU_I_PROFILE", ""))
    if m:
        # a MIG instance holds at most its profile's memory; the name's GB is rounded, so allow
        # the next whole GiB above it
        return (int(m.group(1)) + 1) * 1024.0
    return float(MAX_MEMORY_MIB)


def _values(
    rep: UsageReport, metric: str, s: RangeSeries, upper: float, scale: float = 1.0
) -> list[float]:
    good = []
    for t, raw in s.values:
        try:
            v = float(raw)
        except ValueError:
            v = math.nan
        why = ""
        if math.isnan(v):
            why = "NaN"
        elif math.isinf(v):
            why = "infinite"
        elif v < 0:
            why = "negative"
        elif v * scale > upper:
            why = "above what the device holds"
        if why:
            rep.bad_points[why] += 1
            if len(rep.examples) < 5:
                who = "/".join(
                    x for x in (_label(s.labels, "namespace"), _label(s.labels, "pod")) if x
                )
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
                rep.examples.append(f"{metric}{{{who or 'no pod'}}} at {when}: {raw} ({why})")
            continue
        good.append(v * scale)
    return good


def _p95(values: Sequence[float]) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(0.95 * len(v)) - 1))]


def read_usage(
    client: PrometheusClient,
    window_seconds: float,
    *,
    end: float | None = None,
    points: int = DEFAULT_POINTS,
    namespaces: Sequence[str] | None = None,
) -> UsageReport:
    """Peak GPU memory and p95 utilization per container over the window ending at ``end``
    (default now). Raises `PrometheusError` when Prometheus cannot be read."""
    if window_seconds <= 0:
        raise ValueError("the usage window must be positive")
    end = time.time() if end is None else end
    step = max(60.0, math.ceil(window_seconds / max(1, points)))
    start = end - window_seconds
    rep = UsageReport(client.url, window_seconds, end, step)
    peaks: dict[tuple[str, str, str], float] = {}
    profiles: dict[tuple[str, str, str], set[str]] = {}
    nseries: Counter[tuple[str, str, str]] = Counter()
    npoints: Counter[tuple[str, str, str]] = Counter()

    def key_of(s: RangeSeries) -> tuple[str, str, str] | None:
        ns, pod = _label(s.labels, "namespace"), _label(s.labels, "pod")
        if not pod or not ns:
            rep.unattributed_series += 1
            return None
        if namespaces and ns not in namespaces:
            return None
        return (ns, pod, _label(s.labels, "container"))

    mem = client.query_range(f"max_over_time({MEMORY_METRIC}[{int(step)}s])", start, end, step)
    rep.series += len(mem)
    for s in mem:
        k = key_of(s)
        if k is None:
            continue
        vals = _values(rep, MEMORY_METRIC, s, _limit_mib(s.labels))
        nseries[k] += 1
        profiles.setdefault(k, set()).add(s.labels.get("GPU_I_PROFILE", ""))
        if vals:
            peaks[k] = max(peaks.get(k, 0.0), max(vals))
            npoints[k] += len(vals)
    utils: dict[tuple[str, str, str], float] = {}
    for metric in UTIL_METRICS:
        got = client.query_range(f"avg_over_time({metric}[{int(step)}s])", start, end, step)
        if not got:
            continue
        rep.util_metric = metric
        rep.series += len(got)
        scale = 0.01 if metric in PERCENT_METRICS else 1.0
        for s in got:
            k = key_of(s)
            if k is None:
                continue
            vals = _values(rep, metric, s, 1.0 + 1e-9, scale)
            profiles.setdefault(k, set()).add(s.labels.get("GPU_I_PROFILE", ""))
            if vals:
                utils[k] = max(utils.get(k, 0.0), _p95(vals))
        break
    if rep.util_metric is None:
        rep.problems.append(
            f"no utilization series ({' or '.join(UTIL_METRICS)}): right-sizing on memory only"
        )
    for k in sorted(set(peaks) | set(utils) | set(nseries)):
        rep.containers[k] = ContainerUsage(
            k[0],
            k[1],
            k[2],
            peaks.get(k),
            utils.get(k),
            tuple(sorted(profiles.get(k, set()))),
            nseries[k],
            npoints[k],
        )
    if not mem:
        rep.problems.append(f"no {MEMORY_METRIC} series in the window: is dcgm-exporter scraped?")
    return rep
