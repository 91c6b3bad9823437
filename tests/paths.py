"""Where the tests find their data: inside the repository (a clone alone runs the whole suite)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
#: the kubelet Topology Manager conformance corpus (a copy of the project's shared corpus)
TOPOLOGY_CORPUS = DATA / "conformance" / "topology_hints.json"
