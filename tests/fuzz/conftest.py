"""The fuzz tier: Hypothesis drives random and mutated inputs through every entry point pyctl
reads from (Kubernetes objects, stored records, summaries, the command line). Each test runs
`PYCTL_FUZZ_EXAMPLES` cases (default `DEFAULT_EXAMPLES`, a budget that fits CI); a longer run:

    PYCTL_FUZZ_EXAMPLES=20000 .venv/bin/pytest -q tests/fuzz      (or `make fuzz`)

The number of cases run is printed at the end of the session ("fuzz: N cases ...")."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings

DEFAULT_EXAMPLES = 200
#: taken out of the environment: the commands run here read `PYCTL_*` as settings, and would
#: refuse it as an unknown one (every config case an exit 2, whatever the file held)
EXAMPLES = int(os.environ.pop("PYCTL_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
#: one case taking longer than this is a failure (a hang, or a loop over an unbounded count);
#: generous, the machine running CI may be loaded
CASE_DEADLINE = timedelta(seconds=20)

settings.register_profile(
    "pyctl-fuzz",
    max_examples=EXAMPLES,
    deadline=CASE_DEADLINE,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
        HealthCheck.function_scoped_fixture,
    ],
    print_blob=True,
)
FUZZ = settings.get_profile("pyctl-fuzz")

#: a test whose cases together take longer than this has hung (pytest-timeout stops it)
TEST_TIMEOUT = max(600, 3 * EXAMPLES)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/fuzz/" in item.nodeid:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT))


@pytest.fixture(autouse=True)
def _pyctl_logger() -> Iterator[None]:
    """`pyctl run` sets up the `pyctl` logger (its own handler, no propagation) before it reads
    the kubeconfig: put it back, so that later tests' caplog sees pyctl's records."""
    log = logging.getLogger("pyctl")
    saved = (log.handlers[:], log.level, log.propagate)
    yield
    log.handlers[:], log.level, log.propagate = saved[0], saved[1], saved[2]


#: cases run, by target (printed at the end of the session)
CASES: Counter[str] = Counter()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if CASES:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(CASES.items()))
        terminalreporter.write_line(
            f"fuzz: {sum(CASES.values())} cases ({EXAMPLES} per test): {parts}"
        )
