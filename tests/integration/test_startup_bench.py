"""bench/startup.py kept from rotting: the controller's start-up after the lists (a real Redis,
the extender's process) at two small sizes. It checks that every stage was reached and the output
has its format, never how fast anything was (a benchmark prints figures; tests do not time)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LINE = re.compile(
    r"^(\d+) nodes, (\d+) pods: decoded in [\d.]+ s; after the Pod list: every node scored "
    r"[\d.]+ s, stored [\d.]+ s, sent to the extender [\d.]+ s; cpu [\d.]+ s; rss \d+ MiB$"
)
LAST = re.compile(
    r"^startup: 40 nodes, [\d.]+ s to every node scored, [\d.]+ s to all done, "
    r"growth exponent -?[\d.]+ \(cpu -?[\d.]+\)$"
)


def test_startup_bench_runs_at_two_sizes(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "startup.py"), "--sizes", "20,40", "--json",
         str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 4, lines
    sizes = [LINE.match(line) for line in lines[:2]]
    assert [int(m.group(1)) for m in sizes if m] == [20, 40], lines
    assert lines[2].startswith("growth exponents"), lines[2]
    assert LAST.match(lines[3]), lines[3]
    results = json.loads(out.read_text())
    assert [r["nodes"] for r in results] == [20, 40]
    for r in results:
        # the scale bench's cluster: about 10 pods a node, and a few pending
        assert 8 * r["nodes"] < r["pods"] < 14 * r["nodes"], r
        for key in ("decode_s", "scored_s", "stored_s", "sent_s", "all_s", "cpu_s", "rss_mib"):
            assert math.isfinite(r[key]), (key, r)
            assert r[key] >= 0, (key, r)
        assert r["all_s"] == max(r["scored_s"], r["stored_s"], r["sent_s"])
