"""Where the tests find the project's shared material (beside the repository, as in CI)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
TOPOLOGY_CORPUS = SHARED / "conformance" / "topology_hints.json"
