"""`pyctl demo`: the main job on its embedded default.

Until the controller runs against the built-in simulated cluster, the demo evaluates the built-in
Topology Manager scenarios under every policy.
"""

from __future__ import annotations

import argparse

from pyctl.cli import topology


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run the built-in demo")
    p.set_defaults(handler=topology.run_demo)
