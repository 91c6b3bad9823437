"""`pyctl explain POD`: why a pod is where it is, or why it is pending, answered from the state a
running controller stored in Redis (`pyctl.app.explain`), without touching the Kubernetes API
server. Redis and the settings that shape the answer (evictor, workflow limits, the default
Topology Manager policy) are configured as for `pyctl run`."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pyctl.app.explain import Explanation, describe, explain
from pyctl.cli.errors import UserError
from pyctl.cli.status import read, state_args, state_config
from pyctl.model import Shape
from pyctl.snapshot import SnapshotError, shape_from_json


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explain", help="why a pod is where it is, or pending (from a controller's stored state)"
    )
    p.add_argument("pod", metavar="POD", help="namespace/name (a bare name: namespace default)")
    state_args(p)
    p.set_defaults(handler=explain_cmd)


def pod_key(text: str) -> str:
    ns, sep, name = text.partition("/")
    if not sep:
        ns, name = "default", text
    if not ns or not name or "/" in name:
        raise UserError(f"POD must be namespace/name, got {text!r}")
    return f"{ns}/{name}"


def explain_cmd(args: argparse.Namespace) -> int:
    key = pod_key(args.pod)
    cfg = state_config(args)
    e = explain(read(cfg), cfg, key)
    if args.json:
        print(json.dumps(e.to_json(), indent=2))
    else:
        show(Console(), e)
    return 0 if e.found else 1


def _shape(e: Explanation) -> str:
    if e.shape is None:
        return "unknown"
    try:
        s: Shape = shape_from_json(e.shape, "shape")
    except SnapshotError:
        return json.dumps(e.shape)
    return describe(s)


def show(console: Console, e: Explanation) -> None:
    console.print(f"[bold]Pod {escape(e.pod)}[/]: {escape(e.verdict)}")
    if not e.found:
        return
    console.print(
        f"Phase {e.phase or '-'}, node {e.node or '-'}, shape: {_shape(e)}"
        + (f", scheduler {escape(e.scheduler)}" if e.scheduler else "")
        + f" (M: {e.workload_source})"
    )
    if e.unschedulable:
        said = escape(e.scheduler_message or "(no message)")
        console.print(f"The scheduler said (its first 200 characters, as stored): {said}")
    if e.state == "pending" and e.shape is not None:
        if e.blocked:
            console.print(f"Blocked by fragmentation: [bold]{e.blocked}[/] ({e.blocked_note})")
        else:
            console.print(e.blocked_note)
    if e.nodes:
        title = (
            "What pyctl's extender answers for it now"
            if e.state == "pending"
            else "The policy's rank of its shape, with the pod counted out of its node"
        )
        t = Table(title=title)
        for col in ("node", "score", "NodeFit", "extender filter", "policy"):
            t.add_column(col, justify="right" if col == "score" else "left")
        order = sorted(
            e.nodes,
            key=lambda a: (-(a.score if a.score is not None else -1), a.rank or (1 << 62,), a.node),
        )
        for a in order:
            t.add_row(
                ("* " if a.node == e.node else "") + escape(a.node),
                "-" if a.score is None else str(a.score),
                escape(a.fit or "ok"),
                escape(a.filtered or ("ok" if e.state == "pending" else "")),
                escape(a.explain),
            )
        console.print(t)
    if e.rescue is not None:
        moves = "; ".join(f"{m.pod} {m.from_node} -> {m.to_node}" for m in e.rescue.moves)
        console.print(f"Rescue planned: frees {e.rescue.node} by moving {escape(moves)}")
    if e.move is not None:
        why = f" (rescue of {e.move.rescue_of})" if e.move.rescue_of else ""
        console.print(
            f"Compaction plans to move it to {e.move.to}, "
            f"{e.move.gain_gpu_milli / 1000:.2f} GPU less stranded{why}"
        )
    if e.plan_note:
        console.print(escape(e.plan_note))
    if e.gang_domain:
        console.print(f"Its gang's domain: {escape(e.gang_domain)}")
    if e.state == "running":
        rule = e.evictor or "may be evicted"
        pdb = f"; PodDisruptionBudget allows {e.pdb_headroom}" if e.pdb_headroom is not None else ""
        console.print(f"Evictor: {escape(rule)}{pdb}")
    for w in e.workflows:
        console.print(
            f"Workflow {escape(w.id)} ({w.kind}, node {escape(w.node)}): step "
            f"{w.step}" + (f", {escape(w.result)}" if w.result else "")
        )
