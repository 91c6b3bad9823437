"""Right-sizing reads GPU usage from a REAL Prometheus: dcgm-exporter-shaped series (the labels its
metrics template writes: gpu, UUID, device, modelName, GPU_I_PROFILE/GPU_I_ID on MIG instances,
namespace/pod/container, or exported_* when Prometheus scraped without honor_labels) are written
as OpenMetrics, turned into TSDB blocks by `promtool tsdb create-blocks-from openmetrics`, and
served by a `prometheus` on loopback; `read_usage` and `pyctl recommend --prometheus` read them
through the HTTP API. Hostile points (NaN, negative, above the instance's memory, utilization
above 100%), a stale pod, a series without a pod, MIG instance labels, a pod of an earlier
revision and a workload without series are in the data."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from pyctl.cli.main import main
from pyctl.recommend.prometheus import PrometheusClient, read_usage
from tests.unit.recommend_cluster import cluster

from .promtool import binary

STEP = 60  # one sample a minute; the reader's step for a 2 h window is 60 s too
WINDOW = 7200
#: the last sample is this long before "now", so every sample is inside the window
LAG = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Series = tuple[str, Mapping[str, str], Sequence[str]]


def openmetrics(series: Sequence[Series], end: int) -> str:
    """OpenMetrics text: each series' values one STEP apart, the last at ``end``."""
    by_metric: dict[str, list[str]] = {}
    for metric, labels, values in series:
        lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
        t0 = end - STEP * (len(values) - 1)
        rows = by_metric.setdefault(metric, [])
        rows += [f"{metric}{{{lab}}} {v} {t0 + i * STEP}" for i, v in enumerate(values)]
    out = []
    for metric, rows in by_metric.items():
        out += [f"# TYPE {metric} gauge", f"# HELP {metric} dcgm-exporter field", *rows]
    return "\n".join([*out, "# EOF"]) + "\n"


def base(gpu: str, **extra: str) -> dict[str, str]:
    return {
        "gpu": gpu,
        "UUID": f"GPU-{gpu}-0000",
        "device": f"nvidia{gpu}",
        "modelName": "NVIDIA A100-SXM4-40GB",
        "Hostname": "a100-a",
        **extra,
    }


def pod_labels(pod: str, ns: str = "serving", container: str = "server") -> dict[str, str]:
    return {"container": container, "namespace": ns, "pod": pod}


def mig_labels(gpu: str, profile: str, gi: str) -> dict[str, str]:
    return {"GPU_I_PROFILE": profile, "GPU_I_ID": gi}


N = 100  # samples per series (100 minutes, inside the 2 h window)


def ramp(peak: float, n: int = N) -> list[str]:
    """Rising to ``peak`` in the middle, then back down."""
    return [f"{peak * (1 - abs(i - n // 2) / n):.1f}" for i in range(n)]


def main_series() -> list[Series]:
    fb, util = "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    bert_a = ramp(3000.0)
    bert_a[10], bert_a[20], bert_a[30] = "NaN", "-5", "999999"  # hostile points
    bert_a_util = ["0.6"] * N
    bert_a_util[40] = "1.7"  # utilization above 100%: hostile
    return [
        (
            fb,
            {**base("0"), **mig_labels("0", "1g.5gb", "7"), **pod_labels("bert-7c9f-00000")},
            bert_a,
        ),
        (
            util,
            {**base("0"), **mig_labels("0", "1g.5gb", "7"), **pod_labels("bert-7c9f-00000")},
            bert_a_util,
        ),
        # bert's second replica ran on a 2g.10gb instance (reported as a profile mismatch)
        (
            fb,
            {**base("1"), **mig_labels("1", "2g.10gb", "3"), **pod_labels("bert-7c9f-00001")},
            ramp(3500.0),
        ),
        (
            fb,
            {**base("1"), **mig_labels("1", "1g.10gb", "9"), **pod_labels("embed-7c9f-00000")},
            ramp(2000.0),
        ),
        (
            util,
            {**base("1"), **mig_labels("1", "1g.10gb", "9"), **pod_labels("embed-7c9f-00000")},
            ["0.3"] * N,
        ),
        # resnet's series come from a pod of an earlier revision (another ReplicaSet)
        (
            fb,
            {**base("2"), **mig_labels("2", "2g.10gb", "5"), **pod_labels("resnet-5b6d8-abcde")},
            ramp(7000.0),
        ),
        # a pod of a workload that no longer exists: stale
        (
            fb,
            {**base("2"), **mig_labels("2", "1g.5gb", "13"), **pod_labels("gone-6f7d8-zzzzz")},
            ramp(100.0),
        ),
        # a whole GPU, scraped without honor_labels: the workload's labels are exported_*
        (
            fb,
            {
                **base("4"),
                "pod": "dcgm-exporter-x1",
                "namespace": "gpu-operator",
                "container": "exporter",
                "exported_pod": "llm-7c9f-00000",
                "exported_namespace": "serving",
                "exported_container": "server",
            },
            ramp(30000.0),
        ),
        # a GPU no pod holds
        (fb, base("5"), ["0"] * N),
    ]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    yield from _serve(tmp_path_factory.mktemp("prom-main"), main_series())


@pytest.fixture(scope="module")
def prometheus_util_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    util = "DCGM_FI_DEV_GPU_UTIL"
    values = ["80"] * N
    values[5] = "150"
    yield from _serve(
        tmp_path_factory.mktemp("prom-util"),
        [(util, {**base("0"), **pod_labels("llm-7c9f-00000")}, values)],
    )


def _serve(d: Path, series: list[Series]) -> Iterator[tuple[str, int]]:
    end = int(time.time()) - LAG
    om = d / "dcgm.om"
    om.write_text(openmetrics(series, end))
    data = d / "data"
    r = subprocess.run(
        [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    config = d / "prometheus.yaml"
    config.write_text("global: {scrape_interval: 1m}\n")
    port = _free_port()
    log = d / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=30d",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=d,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready in 30 s:\n{log.read_text()[-2000:]}")
            time.sleep(0.25)
        yield url, end
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_read_usage_through_the_http_api(prometheus: tuple[str, int]) -> None:
    url, end = prometheus
    u = read_usage(PrometheusClient(url), WINDOW, end=end + LAG)
    assert u.util_metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    assert u.step == 60
    c = u.containers
    bert_a = c[("serving", "bert-7c9f-00000", "server")]
    # the ramp's peak: the hostile points were left out, not taken as the peak
    assert bert_a.peak_memory_mib == 3000.0
    assert bert_a.util_p95 == pytest.approx(0.6)
    assert bert_a.profiles == ("1g.5gb",)
    assert c[("serving", "bert-7c9f-00001", "server")].peak_memory_mib == 3500.0
    assert c[("serving", "embed-7c9f-00000", "server")].peak_memory_mib == 2000.0
    # exported_* labels win over the exporter pod's own
    llm = c[("serving", "llm-7c9f-00000", "server")]
    assert llm.peak_memory_mib == 30000.0
    assert ("gpu-operator", "dcgm-exporter-x1", "exporter") not in c
    assert u.unattributed_series == 1
    assert dict(u.bad_points) == {"NaN": 1, "negative": 1, "above what the device holds": 2}
    assert len(u.examples) == 4
    assert any("bert-7c9f-00000" in e and "NaN" in e for e in u.examples)


def test_recommend_right_sizes_from_prometheus(
    prometheus: tuple[str, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = prometheus
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps(cluster()))
    args = ["recommend", str(dump), "--prometheus", url, "--window", "2h", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    usage = out["usage"]
    assert usage["stale_series_pods"] == ["serving/gone-6f7d8-zzzzz"]
    assert usage["profile_mismatches"] == [
        "serving/bert-7c9f-00001: usage on a 2g.10gb instance, the workload requests 1g.5gb"
    ]
    assert usage["bad_points"] == {"NaN": 1, "negative": 1, "above what the device holds": 2}
    w = {x["workload"]["name"]: x for x in out["workloads"]}
    # bert: peak of its pods 3500 MiB (+20% = 4200) fits 1g.5gb (4768 MiB)
    assert w["bert"]["usage"]["peak_memory_mib"] == 3500.0
    assert w["bert"]["usage"]["pods"] == 2
    # embed requests 1g.10gb; 2000 MiB + 20% = 2400 fits 1g.5gb, and 0.3 of its 1g instance is
    # 1/7 x 0.3 of a GPU, which 1g.5gb holds
    menu = next(p for p in out["pools"] if p["gpu_model"] == "NVIDIA-A100-SXM4-40GB")["menu"]
    assert "1g.5gb" in menu
    assert w["embed"]["recommended"] == "1g.5gb"
    assert w["embed"]["change"] is True
    assert w["embed"]["patch"]["body"]["spec"]["template"]["spec"]["containers"] == [
        {
            "name": "server",
            "resources": {"limits": {"nvidia.com/mig-1g.10gb": None, "nvidia.com/mig-1g.5gb": "1"}},
        }
    ]
    assert "peak 1.95 GiB +20% = 2.34 GiB" in w["embed"]["why"]
    # resnet: only an earlier revision's pod has series
    assert w["resnet"]["usage"]["earlier_pods"] == 1
    assert w["resnet"]["usage"]["peak_memory_mib"] == 7000.0
    # llm (exported_* labels): 30000 MiB + 20% = 36000 needs the whole GPU (38147 MiB)
    assert w["llm"]["recommended"] == "gpu"
    assert w["llm"]["change"] is False
    # no series: its request
    assert w["vision"]["usage"] is None
    assert w["vision"]["why"].startswith("no usage data")


def test_utilization_falls_back_to_gpu_util_and_missing_memory_is_said(
    prometheus_util_only: tuple[str, int],
) -> None:
    url, end = prometheus_util_only
    u = read_usage(PrometheusClient(url), WINDOW, end=end + LAG)
    assert u.util_metric == "DCGM_FI_DEV_GPU_UTIL"
    llm = u.containers[("serving", "llm-7c9f-00000", "server")]
    assert llm.util_p95 == pytest.approx(0.8)  # percent read as a ratio
    assert llm.peak_memory_mib is None
    assert dict(u.bad_points) == {"above what the device holds": 1}
    assert any("no DCGM_FI_DEV_FB_USED series" in p for p in u.problems)
