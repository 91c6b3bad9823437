"""Scenarios: the nodes of a simulated cluster and the replicas that arrive and leave.

The built-in scenario is an inference pool over one working day: 8-GPU H100 nodes under
`single-numa-node`, A100 nodes with half their GPUs in MIG mode (1g.5gb) under `restricted`, L40S
nodes without NUMA policy, A10G nodes whose GPUs are time-sliced four ways (the NVIDIA device
plugin's `sharing.timeSlicing` with `renameByDefault`: `nvidia.com/gpu.shared`), and CPU nodes;
replicas of LLMs (1, 2 and 4 GPUs), MIG-sized models, small models asking one time-sliced replica
and CPU-only services arrive as a Poisson stream whose rate follows the day, and live for an
exponential time. Deterministic for a seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pyctl.model import Gpu, MigGpu, MigInstance, Node, Shape, Zone

#: the time-sliced pool: replicas per GPU, and the resource they are advertised as
TIME_SLICES = 4
SHARED = "nvidia.com/gpu.shared"
#: the built-in scenario's seed; the `sim_seed` setting's default
SEED = 7


@dataclass(frozen=True)
class Replica:
    """A kind of replica: its shape, share of arrivals and mean lifetime (virtual seconds)."""

    name: str
    shape: Shape
    share: float
    mean_life: float


@dataclass(frozen=True)
class Arrival:
    t: float
    pod: str
    replica: Replica
    life: float


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: tuple[Node, ...]
    replicas: tuple[Replica, ...]
    duration: float
    arrivals: tuple[Arrival, ...]


def _zone(numa: int, cpu: int, mem: int, gpus: list[int], mig: list[MigGpu] | None = None) -> Zone:
    return Zone(numa, cpu, 0, mem, 0, tuple(Gpu(i) for i in gpus), tuple(mig or ()))


def _nodes() -> tuple[Node, ...]:
    nodes: list[Node] = []
    for i in range(10):
        nodes.append(
            Node(
                f"h100-{i:02d}",
                "H100-SXM5-80GB",
                "single-numa-node",
                zones=(
                    _zone(0, 56000, 1024 * 1024, [0, 1, 2, 3]),
                    _zone(1, 56000, 1024 * 1024, [4, 5, 6, 7]),
                ),
            )
        )
    for i in range(6):
        mig = [MigGpu(g, tuple(MigInstance("1g.5gb", s) for s in range(7))) for g in (6, 7)]
        nodes.append(
            Node(
                f"a100-{i:02d}",
                "A100-SXM4-40GB",
                "restricted",
                zones=(
                    _zone(0, 48000, 512 * 1024, [0, 1, 2, 3]),
                    _zone(1, 48000, 512 * 1024, [4, 5], mig),
                ),
            )
        )
    for i in range(4):
        nodes.append(
            Node(
                f"l40s-{i:02d}", "L40S", "none", zones=(_zone(0, 64000, 512 * 1024, [0, 1, 2, 3]),)
            )
        )
    for i in range(2):
        nodes.append(
            Node(
                f"a10g-ts-{i:02d}",
                "NVIDIA-A10G",
                "none",
                zones=(_zone(0, 48000, 192 * 1024, [0, 1, 2, 3]),),
                gpu_pool=SHARED,
                gpu_replicas=TIME_SLICES,
                gpu_memory_mib=23028,
            )
        )
    for i in range(4):
        nodes.append(Node(f"cpu-{i:02d}", "", "none", zones=(_zone(0, 96000, 384 * 1024, []),)))
    return tuple(nodes)


REPLICAS: tuple[Replica, ...] = (
    Replica(
        "llama-70b",
        Shape(cpu_milli=24000, memory_mib=200 * 1024, gpus=4, gpu_milli=1000),
        0.12,
        5400,
    ),
    Replica(
        "mixtral-8x7b",
        Shape(cpu_milli=12000, memory_mib=96 * 1024, gpus=2, gpu_milli=1000),
        0.16,
        3600,
    ),
    Replica(
        "llama-8b", Shape(cpu_milli=6000, memory_mib=32 * 1024, gpus=1, gpu_milli=1000), 0.24, 2400
    ),
    Replica(
        "bert-base",
        Shape(
            cpu_milli=2000,
            memory_mib=4 * 1024,
            mig_profile="1g.5gb",
            gpu_models=("A100-SXM4-40GB",),
        ),
        0.16,
        1800,
    ),
    Replica(
        "resnet-152",
        Shape(
            cpu_milli=4000,
            memory_mib=8 * 1024,
            mig_profile="2g.10gb",
            gpu_models=("A100-SXM4-40GB",),
        ),
        0.10,
        2400,
    ),
    Replica("gateway", Shape(cpu_milli=4000, memory_mib=8 * 1024), 0.22, 3000),
    # small models on the time-sliced pool: one replica (a quarter of an A10G) each
    Replica(
        "qwen-1.5b",
        Shape(cpu_milli=2000, memory_mib=8 * 1024, gpus=1, gpu_milli=0, gpu_pool=SHARED),
        0.14,
        3600,
    ),
    Replica(
        "bge-embed",
        Shape(cpu_milli=1000, memory_mib=4 * 1024, gpus=1, gpu_milli=0, gpu_pool=SHARED),
        0.08,
        3600,
    ),
)


def inference_day(
    seed: int = SEED, duration: float = 8 * 3600.0, base_rate: float = 0.014
) -> Scenario:
    """The built-in scenario: arrivals per virtual second follow a day curve peaking mid-run."""
    rnd = random.Random(seed)
    arrivals: list[Arrival] = []
    t = 0.0
    n = 0
    weights = [r.share for r in REPLICAS]
    peak = base_rate * 2.0
    while True:
        # thinning: candidate arrivals at the peak rate, kept with the day curve's probability
        t += rnd.expovariate(peak)
        if t >= duration:
            break
        rate = base_rate * (0.6 + 1.4 * math.sin(math.pi * t / duration) ** 2)
        if rnd.random() > rate / peak:
            continue
        rep = rnd.choices(REPLICAS, weights)[0]
        n += 1
        arrivals.append(
            Arrival(t, f"{rep.name}-{n:05d}", rep, rnd.expovariate(1.0 / rep.mean_life))
        )
    return Scenario("inference-day", _nodes(), REPLICAS, duration, tuple(arrivals))
