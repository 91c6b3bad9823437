"""Where the monitoring tests find Prometheus's binaries (Debian's `prometheus` package).

A missing binary fails the tests that need it (never skips them), saying how to install it.
"""

from __future__ import annotations

import shutil

import pytest

from tests.paths import REPO

MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "rules.yaml"
RULES_TEST = MONITORING / "rules_test.yaml"
DASHBOARD = MONITORING / "dashboard.json"

INSTALL = (
    "install Debian's prometheus package (it ships prometheus and promtool): run "
    "`scripts/system-deps` (or `make system-deps`), which installs what "
    "scripts/system-packages.txt lists, or `apt-get install prometheus`"
)


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: {INSTALL}", pytrace=False)
    return path
