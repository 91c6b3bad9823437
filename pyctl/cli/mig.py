"""`pyctl mig`: MIG geometry and the partition planner.

pyctl mig validate GPU_MODEL INSTANCE... [--pre-r510] [--json]
    can these instances exist together on one GPU? INSTANCE is a profile ("3g.20gb") or a
    profile pinned at a memory-slice start ("1g.10gb@6"). Exit 0 valid, 1 invalid, 2 bad input.
pyctl mig layouts GPU_MODEL [--profiles P,...] [--media-extensions] [--pre-r510] [--json]
    every maximal layout of the model
pyctl mig plan SNAPSHOT.json --demand DEMAND.json [--json] [--mig-parted OUT.yaml]
    new layouts for the MIG GPUs of a `pyctl score` snapshot, and the mig-parted config

DEMAND.json: {"pending": [{"profile": "3g.20gb", "count": 2, "gpu_model": "A100-SXM4-40GB"?}],
              "shapes": [workload shapes, as for pyctl score]?,
              "limits": {"nodes": [names]?, "gpus": [indices] | {"node": [indices]}?,
                         "max_used_destroyed": 0?, "executor": "placement" | "mig-parted"?}}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyctl.cli.errors import UserError, load_json
from pyctl.cli.inputs import load_cluster, say_left_out
from pyctl.core import mig
from pyctl.snapshot import load_demand

EXIT_INVALID = 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("mig", help="MIG geometry and the partition planner")
    msub = p.add_subparsers(dest="mig_command", metavar="SUBCOMMAND", required=True)

    v = msub.add_parser("validate", help="can these GPU instances exist together on one GPU?")
    v.add_argument("gpu_model", help="e.g. A100-SXM4-40GB or NVIDIA-H100-80GB-HBM3")
    v.add_argument("instances", nargs="+", metavar="INSTANCE", help='"3g.20gb" or "1g.10gb@6"')
    v.add_argument("--pre-r510", action="store_true", help="drivers before R510 (no 4g+3g)")
    v.add_argument("--json", action="store_true", help="print JSON")
    v.set_defaults(handler=_validate)

    lo = msub.add_parser("layouts", help="every maximal layout of a GPU model")
    lo.add_argument("gpu_model")
    lo.add_argument(
        "--profiles", help="comma-separated profiles to consider (default: all but +me)"
    )
    lo.add_argument("--media-extensions", action="store_true", help="also the +me profiles")
    lo.add_argument("--pre-r510", action="store_true", help="drivers before R510 (no 4g+3g)")
    lo.add_argument("--json", action="store_true", help="print JSON")
    lo.set_defaults(handler=_layouts)

    pl = msub.add_parser(
        "plan",
        help="re-partition a snapshot's MIG GPUs for the pending demand",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pl.add_argument("snapshot", help="snapshot JSON, as for pyctl score")
    pl.add_argument("--demand", required=True, help="demand JSON (see above)")
    pl.add_argument("--json", action="store_true", help="print JSON")
    pl.add_argument("--mig-parted", metavar="OUT.yaml", help="write the mig-parted v1 config here")
    pl.set_defaults(handler=_plan)


def _note(m: mig.GpuModel) -> None:
    note = mig.inferred_note(m)
    if note:
        print(f"note: {note}", file=sys.stderr)


def _diagram(
    m: mig.GpuModel, instances: tuple[tuple[str, int], ...] | list[tuple[str, int]]
) -> str:
    """The memory slices, 4 characters each: ``[3g.20gb     ][1g][1g] .. `` (`` .. `` = empty)."""
    out = []
    pos = 0
    for name, start in sorted(instances, key=lambda x: x[1]):
        size = m.profile(name).memory_slices
        out.append(" .. " * max(0, start - pos))
        inner = 4 * size - 2
        label = name if len(name) <= inner else name.split(".")[0]
        out.append("[" + label[:inner].ljust(inner) + "]")
        pos = start + size
    out.append(" .. " * max(0, m.memory_slices - pos))
    return "".join(out)


def _validate(args: argparse.Namespace) -> int:
    m = mig.model(args.gpu_model)
    result = mig.check(m.name, args.instances, pre_r510=args.pre_r510)
    if args.json:
        print(
            json.dumps(
                {
                    "gpu_model": m.name,
                    "valid": result.valid,
                    "placements": [{"profile": n, "start": s} for n, s in result.placements],
                    "reason": result.reason or None,
                    "placements_inferred": m.placements_inferred,
                }
            )
        )
    elif result.valid:
        layout = " + ".join(f"{n}@{s}" for n, s in result.placements) or "(no instances)"
        print(f"valid on {m.name}: {layout}")
        if result.placements:
            print(f"  memory slices 0..{m.memory_slices - 1}: {_diagram(m, result.placements)}")
    else:
        print(f"invalid on {m.name}: {result.reason}")
    _note(m)
    return 0 if result.valid else EXIT_INVALID


def _layouts(args: argparse.Namespace) -> int:
    m = mig.model(args.gpu_model)
    profiles = None
    if args.profiles:
        profiles = [mig.profile_name(m.name, p.strip()) for p in args.profiles.split(",") if p]
    media, pre_r510 = args.media_extensions, args.pre_r510
    found = mig.layouts(m.name, profiles, media_extensions=media, pre_r510=pre_r510)
    valid = mig.count_valid(m.name, profiles, media_extensions=media, pre_r510=pre_r510)
    if args.json:
        print(
            json.dumps(
                {
                    "gpu_model": m.name,
                    "placements_inferred": m.placements_inferred,
                    "valid_multisets": valid,
                    "maximal": [
                        [{"profile": n, "start": s} for n, s in lay.instances] for lay in found
                    ],
                }
            )
        )
    else:
        considered = profiles or [
            p.name for p in m.profiles if args.media_extensions or not p.media_extensions
        ]
        print(
            f"{m.name}: {len(found)} maximal layouts ({valid} valid multisets) of "
            f"{', '.join(considered)}"
        )
        for lay in found:
            compute = sum(m.profile(n).compute_slices for n, _ in lay.instances)
            print(f"  {_diagram(m, lay.instances)}  {compute}/{m.compute_slices} compute  {lay}")
    _note(m)
    return 0


def _plan(args: argparse.Namespace) -> int:
    snapshot, view = load_cluster(load_json(args.snapshot), args.snapshot)
    demand = load_demand(load_json(args.demand))
    plans = mig.plan_snapshot(snapshot, demand)
    if not plans:
        raise UserError(f"{args.snapshot}: no node with MIG GPUs to plan")
    names = mig.node_config_names(plans)
    config = mig.mig_parted_config(plans)
    if args.mig_parted:
        try:
            Path(args.mig_parted).write_text(mig.to_yaml(config), encoding="utf-8")
        except OSError as e:
            raise UserError(f"{args.mig_parted}: cannot write: {e.strerror or e}") from e
    if args.json:
        out = {
            "nodes": [
                {
                    "node": p.node,
                    "mig_config": names[p.node],
                    "placements_inferred": p.placements_inferred,
                    **p.plan,
                }
                for p in plans
            ],
            "mig_parted": config,
        }
        print(json.dumps(out, indent=1))
    else:
        for p in plans:
            _print_node(p, names[p.node])
        if not args.mig_parted:
            print("(write the mig-parted config with --mig-parted OUT.yaml)")
    say_left_out(view)
    return 0


def _print_node(p: mig.NodePlan, config: str) -> None:
    r = p.plan
    m = mig.model(p.gpu_model)
    print(f"node {p.node} ({p.gpu_model}, executor {r['executor']})")
    if p.placements_inferred:
        print(f"  note: {mig.inferred_note(m)}")
    for d in r["demand"]:
        if d["pending"] or d["moved"]:
            print(
                f"  {d['profile']}: {d['pending']} pending, served {d['served_before']} now, "
                f"{d['served_after']} after the plan"
                + (f"; {d['moved']} pods moved, {d['rehoused']} re-served" if d["moved"] else "")
            )
    for g in r["gpus"]:
        layout = [(x["profile"], x["start"]) for x in g["layout"]]
        state = "re-partition" if g["changed"] else "unchanged"
        print(f"  GPU {g['gpu']}: {state:12} {_diagram(m, layout)}")
        if g["changed"]:
            new = [f"{x['profile']}@{x['start']}" for x in g["layout"] if x["state"] == "new"]
            gone = [f"{x['profile']}@{x['start']}" for x in g["destroyed"]]
            print(f"      create {', '.join(new) or '-'}; destroy {', '.join(gone) or '-'}")
        if g["pods_to_move"]:
            print(f"      pods to move: {', '.join(g['pods_to_move'])}")
    print(
        f"  fragment {r['fragment_before']:.2f} -> {r['fragment_after']:.2f} compute slices; "
        f"{r['changed_gpus']} GPUs change, {r['used_destroyed']} used instances destroyed"
    )
    if r["changed_gpus"]:
        print(f"  apply: kubectl label node {p.node} {mig.MIG_CONFIG_LABEL}={config} --overwrite")
        if r["executor"] == "placement" and any(
            x["state"] == "kept-used" for g in r["gpus"] if g["changed"] for x in g["layout"]
        ):
            print(
                "  note: mig-parted re-creates every instance of a GPU it changes; to keep the "
                "used instances in place apply with placement (NVML), or plan with executor "
                "mig-parted"
            )
