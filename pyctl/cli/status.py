"""`pyctl status`: the cluster as a running controller stored it in Redis (`pyctl.app.status`),
read without touching the Kubernetes API server. Redis is configured as for `pyctl run` (file,
`PYCTL_*` environment, flags): `--redis URL`, `--cluster NAME`, `--redis-cluster`, TLS files,
the password from `PYCTL_REDIS_PASSWORD` (or the URL)."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import anyio
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pyctl.app.config import Config, ConfigError, load_config
from pyctl.app.state import StoredView, read_view
from pyctl.app.status import GPU, WORST, Status, status_of
from pyctl.cli.errors import UserError
from pyctl.state.store import StoreError


def state_args(p: argparse.ArgumentParser) -> None:
    """The flags that say where a controller's state is (as `pyctl run` takes them)."""
    p.add_argument("--config", help="configuration file (YAML or JSON), as for pyctl run")
    p.add_argument("--cluster", help="the cluster's name (as the controller runs with)")
    p.add_argument("--redis", dest="redis_url", help="redis://host:port or rediss://...")
    p.add_argument("--redis-cluster", action="store_const", const=True, help="Redis Cluster mode")
    p.add_argument("--redis-ca-file", help="TLS: CA certificates to trust")
    p.add_argument("--redis-cert-file", help="TLS: client certificate")
    p.add_argument("--redis-key-file", help="TLS: client key")
    p.add_argument("--json", action="store_true", help="print JSON")


def state_config(args: argparse.Namespace) -> Config:
    flags: dict[str, Any] = {
        "cluster": args.cluster,
        "redis_url": args.redis_url,
        "redis_cluster": args.redis_cluster,
        "redis_tls_ca_file": args.redis_ca_file,
        "redis_tls_cert_file": args.redis_cert_file,
        "redis_tls_key_file": args.redis_key_file,
    }
    try:
        return load_config(args.config, os.environ, flags)
    except ConfigError as e:
        raise UserError(str(e)) from None


def read(cfg: Config) -> StoredView:
    try:
        return anyio.run(read_view, cfg)
    except StoreError as e:
        raise UserError(str(e)) from None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status", help="the cluster as a running controller stored it (read from its Redis)"
    )
    state_args(p)
    p.set_defaults(handler=status)


def status(args: argparse.Namespace) -> int:
    st = status_of(read(state_config(args)))
    if args.json:
        print(json.dumps(st.to_json(), indent=2))
        return 0
    show(Console(), st)
    return 0


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.1f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _when(t: float, now: float) -> str:
    """A stored time: its age when it is in the past (wall clock), else the time itself (the
    simulated cluster's workflows run on its virtual clock)."""
    if 0 <= now - t < 30 * 86400:
        return _age(now - t)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z"


def _slices(n: float) -> str:
    """MIG slices (a shared or partly used slice counts as a fraction), to a tenth."""
    return f"{round(n, 1):g}"


def _gpus(milli: float) -> str:
    return f"{milli / GPU:.1f}"


#: where the workload M of the summary came from, in words
_M_SOURCES = {
    "published": "M as the controller published it",
    "derived": "M derived from the stored pods (none published)",
    "default": "the default M (none published, no GPU pods stored)",
}


def show(console: Console, st: Status) -> None:
    """The cluster's status as `pyctl status` prints it, section by section."""
    _controller(console, st)
    _mirror(console, st)
    m_source = _M_SOURCES[st.workload_source]
    _nodes(console, st)
    _summary(console, st, m_source)
    _worst_nodes(console, st)
    _workflows(console, st)
    _skipped(console, st)
    _left_out(console, st)


def _controller(console: Console, st: Status) -> None:
    """The cluster read, and whether the controller holding the Lease is publishing."""
    read_at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(st.read_at))
    console.print(f"[bold]Cluster {escape(st.cluster)}[/]: {escape(st.source)}, read {read_at}Z")
    hb = st.heartbeat
    if not hb.published:
        extra = f" ({escape(hb.error)})" if hb.error else ""
        console.print(
            "Controller: [red]no summary published[/]: the controller holding the Lease is not "
            f"publishing (not running, not leader, or its store writes fail){extra}"
        )
    elif hb.fresh:
        console.print(
            f"Controller: summary published {_age(hb.age_seconds)} (fresh, ttl {hb.ttl_seconds} "
            "s): the replica holding the Lease is publishing"
        )
        if hb.error:
            console.print(f"[yellow]Its summary in part not read[/]: {escape(hb.error)}")
    else:
        why = f": {escape(hb.error)}" if hb.error else ""
        console.print(
            f"Controller: [red]summary published {_age(hb.age_seconds)}, past its ttl of "
            f"{hb.ttl_seconds} s[/]{why}: the controller holding the Lease is not publishing"
        )


def _mirror(console: Console, st: Status) -> None:
    """The stored records per kind: how many, how recent, how many skipped."""
    t = Table(title="The mirror (records as the controller last wrote them)")
    for col in ("kind", "records", "resourceVersion", "newest object", "written", "skipped"):
        t.add_column(col, justify="left" if col == "kind" else "right")
    for f in st.freshness:
        t.add_row(
            f.kind,
            str(f.records),
            f.resource_version or "-",
            f.newest_object or "-",
            _age(f.written_age_seconds) if f.written_age_seconds is not None else "-",
            str(f.skipped) if f.skipped else "",
        )
    console.print(t)


def _nodes(console: Console, st: Status) -> None:
    """The nodes stored and modelled, and why each one not modelled is not."""
    stored = next((f.records for f in st.freshness if f.kind == "Node"), 0)
    console.print(
        f"Nodes: {stored} stored, {len(st.nodes)} modelled"
        + (f", {len(st.unmodelled)} not:" if st.unmodelled else "")
    )
    for name, why in sorted(st.unmodelled.items()):
        console.print(f"  {escape(name)}: {escape(why)}")


def _summary(console: Console, st: Status, m_source: str) -> None:
    """The fragmentation summary under M (`m_source` says which M), MIG and pending pods."""
    s = st.summary
    if s is None:
        console.print(f"[red]No fragmentation summary[/]: {escape(st.summary_error)}")
        return
    cats = ", ".join(
        f"{c} {_gpus(v)}" for c, v in sorted(s.categories.items(), key=lambda kv: -kv[1]) if v
    )
    console.print(
        f"Fragmentation ({m_source}): {_gpus(s.idle_gpu_milli)} GPUs idle, "
        f"{_gpus(s.fragment_gpu_milli)} stranded ({s.fragmentation_rate:.1%})"
        + (f": {cats}" if cats else "")
    )
    if s.idle_mig_slices:
        console.print(
            f"MIG: {_slices(s.idle_mig_slices)} slices idle, "
            f"{_slices(s.fragment_mig_slices)} stranded, "
            f"{_slices(s.recoverable_mig_slices)} recoverable by re-partitioning"
        )
    blocked = ", ".join(f"{c} {n}" for c, n in sorted(s.blocked.items()))
    console.print(
        f"Pending pods: {s.pending}; blocked by fragmentation: {blocked or 'none'}"
        + (
            f"; scheduling success (published): {st.scheduling_success:.1%}"
            if st.scheduling_success is not None
            else ""
        )
    )


def _worst_nodes(console: Console, st: Status) -> None:
    """The nodes with the most stranded GPU, and their main reason."""
    if not st.nodes:
        return
    t = Table(title=f"Worst nodes (of {len(st.nodes)})")
    for col in ("node", "GPU model", "idle GPU", "stranded GPU", "mostly"):
        t.add_column(col, justify="left" if col in ("node", "GPU model", "mostly") else "right")
    for n in st.worst(WORST):
        top = max(n.categories.items(), key=lambda kv: kv[1]) if n.categories else ("", 0.0)
        t.add_row(
            n.name,
            n.gpu_model or "-",
            _gpus(n.idle_gpu_milli),
            _gpus(n.fragment_gpu_milli),
            top[0] if top[1] else "",
        )
    console.print(t)


def _skipped(console: Console, st: Status) -> None:
    """The stored records this read skipped, and why."""
    if st.skipped:
        console.print(f"[yellow]Skipped {len(st.skipped)} stored record(s)[/] (left in place):")
        for kind, key, why in st.skipped:
            console.print(f"  {kind} {escape(key)}: {escape(why)}")


def _left_out(console: Console, st: Status) -> None:
    """The objects the controller left out of its view (the most recent named)."""
    if st.left_out is not None and st.left_out.count:
        lo = st.left_out
        console.print(
            f"[yellow]Left out by the controller: {lo.count} object(s)[/]"
            + (f" (the {len(lo.objects)} most recent named)" if len(lo.objects) < lo.count else "")
            + ":"
        )
        for kind, name, reason, _ in lo.objects:
            console.print(f"  {kind} {escape(name) or '(unnamed)'}: {reason}")


def _workflows(console: Console, st: Status) -> None:
    if st.workflow_error:
        console.print(f"[red]Workflow records not read[/]: {escape(st.workflow_error)}")
    else:
        console.print(
            f"Workflows: {st.workflows_total} stored, {len(st.workflows_active)} in progress"
        )
    for title, lines in (("In progress", st.workflows_active), ("Recent", st.workflows_recent)):
        if not lines:
            continue
        t = Table(title=title)
        for col in ("id", "kind", "node", "pod", "step", "attempts", "updated", "result"):
            t.add_column(col)
        for w in lines:
            t.add_row(
                escape(w.id),
                w.kind,
                escape(w.node),
                escape(w.pod),
                w.step,
                str(w.attempts),
                _when(w.updated, st.read_at),
                escape(w.result[:60]),
            )
        console.print(t)
    if st.workflows_undecodable:
        console.print(f"[yellow]{len(st.workflows_undecodable)} workflow record(s) do not decode:")
        for wid, why in sorted(st.workflows_undecodable.items()):
            console.print(f"  {escape(wid)}: {escape(why)}")
    if st.quarantined:
        console.print(f"[yellow]{len(st.quarantined)} workflow record(s) quarantined:")
        for wid, why in sorted(st.quarantined.items()):
            console.print(f"  {escape(wid)}: {escape(why)}")
