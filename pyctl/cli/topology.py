"""`pyctl topology`: evaluate kubelet Topology Manager hint merges.

pyctl topology merge CASE.json [--policy P] [--json]   one case (the corpus's schema)
pyctl topology conformance CORPUS.json                 every case of a corpus, pass/fail
pyctl topology demo                                    the built-in scenarios, every policy
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from typing import Any

from rich.console import Console
from rich.table import Table

from pyctl.cli.errors import UserError, load_json
from pyctl.core.topology import MergeResult, merge_hints
from pyctl.jsontypes import JsonObject
from pyctl.model import TOPOLOGY_POLICIES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("topology", help="kubelet Topology Manager hint merge")
    tsub = p.add_subparsers(dest="topology_command", metavar="SUBCOMMAND", required=True)

    m = tsub.add_parser("merge", help="merge one case's hints")
    m.add_argument("case", help="JSON file: {policy, numa_nodes, providers, options, distances}")
    m.add_argument("--policy", choices=TOPOLOGY_POLICIES, help="override the case's policy")
    m.add_argument("--json", action="store_true", help="print JSON")
    m.set_defaults(handler=_merge)

    c = tsub.add_parser("conformance", help="check every case of a conformance corpus")
    c.add_argument("corpus", help="e.g. shared/conformance/topology_hints.json")
    c.set_defaults(handler=_conformance)

    d = tsub.add_parser("demo", help="the built-in scenarios under every policy")
    d.set_defaults(handler=run_demo)


def _field(case: JsonObject, key: str, where: str) -> Any:
    """The value as read: the core checks its type (its `ValueError` names the field)."""
    if key not in case:
        raise UserError(f"{where}: missing {key!r}")
    return case[key]


def merge_case(case: Any, where: str, policy: str | None = None) -> MergeResult:
    if not isinstance(case, dict):
        raise UserError(f"{where}: expected a JSON object")
    return merge_hints(
        _field(case, "providers", where),
        policy=policy or case.get("policy", "none"),
        numa_nodes=_field(case, "numa_nodes", where),
        options=case.get("options"),
        distances=case.get("distances"),
    )


def result_dict(r: MergeResult) -> JsonObject:
    return {
        "affinity": None if r.affinity is None else list(r.affinity),
        "preferred": r.preferred,
        "admit": r.admit,
    }


def _merge(args: argparse.Namespace) -> int:
    r = merge_case(load_json(args.case), args.case, args.policy)
    if args.json:
        print(json.dumps(result_dict(r)))
    else:
        aff = "any NUMA node" if r.affinity is None else f"NUMA {r.affinity}"
        verdict = "admitted" if r.admit else "rejected (TopologyAffinityError)"
        print(f"{aff}, preferred={r.preferred}: {verdict}")
    return 0


def _conformance(args: argparse.Namespace) -> int:
    corpus = load_json(args.corpus)
    cases = corpus.get("cases") if isinstance(corpus, dict) else None
    if not isinstance(cases, list):
        raise UserError(f"{args.corpus}: expected an object with a 'cases' list")
    failed = 0
    for i, case in enumerate(cases):
        name = case.get("name", f"cases[{i}]") if isinstance(case, dict) else f"cases[{i}]"
        got = result_dict(merge_case(case, f"{args.corpus}: {name}"))
        expected = case.get("expected")
        if not isinstance(expected, dict):
            raise UserError(f"{args.corpus}: {name}: 'expected' must be an object (a merged hint)")
        want = {**expected, "admit": case.get("admit")}
        if want["admit"] is None:
            got["admit"] = None
        if got != want:
            failed += 1
            print(f"FAIL {name}: got {got}, expected {want}")
    print(f"{len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


def run_demo(_args: argparse.Namespace | None = None) -> int:
    data = json.loads(resources.files("pyctl.data").joinpath("topology_scenarios.json").read_text())
    console = Console()
    console.print(
        "[bold]Topology Manager on a 2-socket GPU node[/]: "
        "what the kubelet decides for each replica, per policy"
    )
    table = Table(show_lines=True)
    table.add_column("replica")
    for policy in TOPOLOGY_POLICIES:
        table.add_column(policy)
    for sc in data["scenarios"]:
        cells = []
        for policy in TOPOLOGY_POLICIES:
            r = merge_hints(
                sc["providers"],
                policy=policy,
                numa_nodes=data["numa_nodes"],
                options={"prefer-closest-numa-nodes": policy != "single-numa-node"},
                distances=data["distances"],
            )
            where = "any" if r.affinity is None else ",".join(map(str, r.affinity))
            mark = "[green]admit[/]" if r.admit else "[red]reject[/]"
            pref = "aligned" if r.preferred else "not aligned"
            cells.append(f"{mark} NUMA {where}\n{pref}")
        table.add_row(sc["name"], *cells)
    console.print(table)
    return 0
