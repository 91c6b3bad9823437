"""The live terminal view of `pyctl run` (rich): the cluster's fragmentation as it changes."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pyctl.cluster.sim.source import SimStats
from pyctl.controller.summary import Summary


def _bar(frac: float, width: int = 30) -> Text:
    frac = max(0.0, min(1.0, frac))
    n = round(frac * width)
    style = "green" if frac < 0.3 else "yellow" if frac < 0.6 else "red"
    return Text("█" * n + "·" * (width - n), style=style)


def render(
    s: Summary | None, sim: SimStats | None, duration: float | None, events_per_s: float
) -> Group:
    head = Table.grid(padding=(0, 2))
    if sim is not None and duration:
        h = sim.virtual_time / 3600
        head.add_row(
            "simulated cluster",
            f"{h:4.1f} h of {duration / 3600:.0f} h",
            _bar(sim.virtual_time / duration, 20),
            f"arrived {sim.arrived}  bound {sim.bound}  departed {sim.departed}",
        )
    head.add_row("events", f"{events_per_s:,.0f}/s", "", "")
    if s is None:
        return Group(Panel(head, title="pyctl run"))
    t = Table.grid(padding=(0, 2))
    t.add_row(
        "fragmentation",
        _bar(s.fragmentation_rate),
        f"{s.fragmentation_rate:6.1%}",
        f"{s.fragment_gpu_milli / 1000:.1f} of {s.idle_gpu_milli / 1000:.1f} idle GPUs stranded",
    )
    for cat, v in sorted(s.categories.items(), key=lambda kv: -kv[1]):
        if v >= 1:
            share = v / s.fragment_gpu_milli if s.fragment_gpu_milli else 0.0
            t.add_row(f"  {cat}", _bar(share, 20), f"{v / 1000:6.1f}", "GPUs")
    t.add_row(
        "MIG slices",
        "",
        f"{s.idle_mig_slices:6.0f}",
        f"idle, {s.fragment_mig_slices:.1f} fragment, "
        f"{s.recoverable_mig_slices:.0f} recoverable by re-partitioning",
    )
    if s.shared_gpus:
        t.add_row(
            "shared GPUs",
            _bar(s.shared_used_milli / (1000 * s.shared_gpus), 20),
            f"{s.shared_used_milli / 1000:6.1f}",
            f"of {s.shared_gpus} shared GPUs in use, by {s.shared_pods} pods "
            "(time-slicing, MPS, HAMi)",
        )
    blocked = (
        ", ".join(f"{k} {v}" for k, v in sorted(s.blocked.items(), key=lambda kv: -kv[1])) or "none"
    )
    t.add_row("pending", "", f"{s.pending:6d}", f"blocked by fragmentation: {blocked}")
    ok = s.scheduling_success
    t.add_row(
        "scheduled",
        _bar(ok, 20),
        f"{ok:6.1%}",
        Text(
            "below the 95% threshold" if ok < 0.95 else "ok", style="red" if ok < 0.95 else "green"
        ),
    )
    worst = Table(title="worst nodes", show_edge=False, pad_edge=False)
    worst.add_column("node")
    worst.add_column("idle GPUs", justify="right")
    worst.add_column("fragment", justify="right")
    for name, idle, frag in s.worst[:6]:
        if frag > 0:
            worst.add_row(name, f"{idle / 1000:.1f}", f"{frag / 1000:.1f}")
    return Group(Panel(head, title=f"pyctl run — cluster {s.cluster}, {s.nodes} nodes"), t, worst)
