"""The soak (bench/soak.py) in short, on its own real control plane: 20 kwok GPU nodes, two
`pyctl run --mode enforce` replicas with a real Redis, pod churn, Deployments under PDBs
scaled up and down, pending pods that need rescues and MIG re-partitions, and one fault of
each kind at seeded random points (the leader killed and stopped past its Lease, the API server
restarted, etcd compacted, Redis gone and back empty and with its data, a fault-injecting proxy
in front of the API server for one replica, a failed MIG reconfiguration, a node deleted). The
same invariants as the long run, checked by the bench from the audit log, pyctl's logs and the
cluster: none may be violated, every fault was injected, and the load made pyctl act."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyctl.dev.control_plane import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

KINDS = (
    "kill", "stop", "apiserver", "compact", "redis-empty", "redis-keep", "proxy", "mig-fail",
    "node-delete",
)  # fmt: skip
LAST = re.compile(
    r"^soak: \d+ s, 20 nodes, faults kill 1 stop 1 apiserver 1 compact 1 redis-empty 1 "
    r"redis-keep 1 proxy 1 mig-fail 1 node-delete 1, workflows started \d+ .*"
    r"invariant violations 0, rss at 10% \d+ MiB at end \d+ MiB$"
)


def test_a_short_soak_keeps_every_invariant_through_one_fault_of_each_kind(
    tmp_path: Path,
) -> None:
    out = tmp_path / "soak.json"
    argv = [
        sys.executable, str(REPO / "bench" / "soak.py"), "--nodes", "20", "--duration", "200",
        "--seed", "7", "--redis-outage", "10", "--proxy-window", "20", "--pod-life", "60",
        "--drain", "150", "--sample-every", "5", "--json", str(out),
        "--work-dir", str(tmp_path / "work"),
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    tail = proc.stdout[-4000:] + "\n--- stderr ---\n" + proc.stderr[-4000:]
    assert proc.returncode == 0, tail
    last = proc.stdout.strip().splitlines()[-1]
    assert LAST.match(last), tail
    r = json.loads(out.read_text())
    assert r["violations"] == [], r["violations"]
    # every invariant was checked, and held
    assert set(r["checks"]) >= {
        "write without the Lease", "evicted twice", "PDB", "rate limit", "taint left behind",
        "MIG label left behind", "deadline", "resources", "freshness", "replica exited",
    }  # fmt: skip
    assert all(v == 0 for v in r["checks"].values()), r["checks"]
    # one fault of each kind, none of which failed to be injected
    assert r["faults"] == dict.fromkeys(KINDS, 1), r["faults"]
    assert not [f for f in r["fault_log"] if "failed:" in f[2]], r["fault_log"]
    assert sum(r["proxy_injected"].values()) > 0
    # the load made pyctl act: workflows ran, evictions went through the Eviction API, and
    # the Lease changed hands (the kill and the stop)
    assert r["workflows"]["started"] > 0, r["workflows"]
    assert r["evictions"] > 0
    # resources were compared for the replica that lived through the run, freshness measured
    assert r["resources"], r["unchecked"]
    assert r["lag_p99_ms"] == r["lag_p99_ms"]  # not NaN
