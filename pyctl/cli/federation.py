"""`pyctl federation status` and `pyctl federation place SHAPE`: the view across the clusters that
share one Redis, and where one replica of a shape would grow fragment least.

Redis is configured as for `pyctl run` (file, `PYCTL_*` environment, flags): `--redis URL`
(``rediss://`` for TLS), `--redis-cluster`, the password from `PYCTL_REDIS_PASSWORD` (or the URL).
"""

from __future__ import annotations

import argparse
import json
import os

import anyio
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pyctl.app.config import Config, ConfigError, load_config
from pyctl.cli.errors import UserError
from pyctl.federation import (
    ClusterRank,
    Member,
    ShapeError,
    parse_shape,
    place,
    placement_json,
    read_members,
)
from pyctl.model import Shape
from pyctl.state.store import StoreError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("federation", help="clusters sharing a Redis: status, placement")
    fsub = p.add_subparsers(dest="federation_command", metavar="COMMAND", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--config", help="configuration file (YAML or JSON), as for pyctl run")
        q.add_argument("--cluster", help="this cluster's name (the observer)")
        q.add_argument("--redis", dest="redis_url", help="redis://host:port or rediss://...")
        q.add_argument(
            "--redis-cluster", action="store_const", const=True, help="Redis Cluster mode"
        )
        q.add_argument("--redis-ca-file", help="TLS: CA certificates to trust")
        q.add_argument("--redis-cert-file", help="TLS: client certificate")
        q.add_argument("--redis-key-file", help="TLS: client key")
        q.add_argument("--json", action="store_true", help="print JSON")

    st = fsub.add_parser("status", help="every member: capacity, fragment, staleness")
    common(st)
    st.set_defaults(handler=status)
    pl = fsub.add_parser("place", help="rank clusters, then nodes, for one replica of SHAPE")
    pl.add_argument(
        "shape",
        metavar="SHAPE",
        help='e.g. "gpus=1,cpu=8,mem=32768", "mig=1g.10gb", or a JSON shape object',
    )
    pl.add_argument("--nodes", type=int, default=5, help="nodes shown per cluster (default 5)")
    common(pl)
    pl.set_defaults(handler=place_cmd)


def _config(args: argparse.Namespace) -> Config:
    flags: dict[str, str | bool | None] = {
        "cluster": args.cluster,
        "redis_url": args.redis_url,
        "redis_cluster": args.redis_cluster,
        "redis_tls_ca_file": args.redis_ca_file,
        "redis_tls_cert_file": args.redis_cert_file,
        "redis_tls_key_file": args.redis_key_file,
    }
    try:
        cfg = load_config(args.config, os.environ, flags)
    except ConfigError as e:
        raise UserError(str(e)) from None
    if not cfg.redis.url:
        raise UserError(
            "federation needs the shared Redis: --redis redis://host:port "
            "(or PYCTL_REDIS_URL, or redis_url in the config file)"
        )
    return cfg


async def _members(args: argparse.Namespace) -> list[Member]:
    from pyctl.state.redis_store import RedisStore

    cfg = _config(args)
    rc = cfg.redis.client_config()
    store = RedisStore(rc, cfg.cluster)
    try:
        await store.open()
        return await read_members(store)
    except StoreError as e:
        raise UserError(str(e)) from None
    finally:
        await store.close()


def _pct(v: float) -> str:
    return f"{v:.1%}"


def status(args: argparse.Namespace) -> int:
    members = anyio.run(_members, args)
    if args.json:
        n_stale = sum(1 for m in members if m.stale)
        out = {
            "members": [m.to_json() for m in members],
            "stale": n_stale,
            "fresh": len(members) - n_stale,
        }
        print(json.dumps(out, indent=2))
        return 0
    console = Console()
    t = Table(title=f"Federation: {len(members)} member(s)")
    for col in ("cluster", "state", "age", "nodes", "idle GPU", "fragment GPU", "frag. rate"):
        t.add_column(col, justify="left" if col in ("cluster", "state") else "right")
    for col in ("pending", "blocked", "sched. success"):
        t.add_column(col, justify="right")
    for m in members:
        if m.summary is None:  # invalid: no figure of it is known
            why = escape(m.error or "unknown")
            t.add_row(m.cluster, f"[red]invalid[/] ({why})", *["-"] * 9)
            continue
        state = "[red]stale[/]" if m.stale else "[green]fresh[/]"
        t.add_row(
            m.cluster,
            state,
            f"{m.age_seconds:.0f}s/{m.ttl_seconds}s",
            str(m.nodes),
            f"{m.idle_gpus:.1f}",
            f"{m.fragment_gpus:.1f}",
            _pct(m.fragmentation_rate),
            str(m.pending),
            str(m.blocked),
            _pct(m.scheduling_success),
        )
    console.print(t)
    stale = [m.cluster for m in members if m.stale]
    if stale:
        console.print(f"[red]{len(stale)} stale[/]: {', '.join(stale)} (no heartbeat within TTL)")
    return 0


def _shape_text(s: Shape) -> str:
    if s.mig_profile:
        what = f"one {s.mig_profile} MIG instance"
    else:
        what = f"{s.gpus} GPU x {s.gpu_milli / 1000:g}"
    return f"{what}, {s.cpu_milli / 1000:g} CPU, {s.memory_mib} MiB"


def place_cmd(args: argparse.Namespace) -> int:
    try:
        shape = parse_shape(args.shape)
    except ShapeError as e:
        raise UserError(str(e)) from None
    if args.nodes < 1:
        raise UserError("--nodes must be at least 1")
    members = anyio.run(_members, args)
    ranks = place(members, shape, args.nodes)
    if args.json:
        print(json.dumps(placement_json(shape, ranks), indent=2))
        return 0
    console = Console()
    t = Table(title=f"Placement of one replica of {_shape_text(shape)}")
    for col in ("rank", "cluster", "node", "GPU model", "fragment delta GPU", "delta MIG"):
        t.add_column(col, justify="right" if "delta" in col or col == "rank" else "left")
    rank = 0
    for c in ranks:
        if c.skipped:
            t.add_row("-", c.cluster, f"[dim]{c.skipped}[/]", "", "", "")
            continue
        rank += 1
        for i, n in enumerate(c.nodes):
            t.add_row(
                str(rank) if i == 0 else "",
                c.cluster if i == 0 else "",
                n.node,
                n.gpu_model,
                f"{n.delta_gpus:+.3f}",
                f"{n.delta_mig_slices:+g}",
            )
    console.print(t)
    if not any(not c.skipped for c in ranks):
        console.print("[red]no fresh cluster admits this shape[/]")
        return 1
    best: ClusterRank = next(c for c in ranks if not c.skipped)
    console.print(f"best: cluster {best.cluster}, node {best.nodes[0].node}")
    return 0
