"""Bad input to the topology merge: a clear ValueError naming the field, never a panic."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pyctl.core.topology import merge_hints

GPU = {"gpu": [{"affinity": [0], "preferred": True}]}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "strict"}, 'policy: unknown policy: "strict"'),
        ({"policy": 3}, "policy: expected a policy name"),
        ({"numa_nodes": []}, "numa_nodes: must name at least one NUMA node"),
        ({"numa_nodes": [0, 0]}, "numa_nodes[1]: NUMA id 0 is listed twice"),
        ({"numa_nodes": [0, 64]}, "numa_nodes[1]: NUMA id 64 is outside 0..=63"),
        ({"numa_nodes": list(range(65))}, "at most 64 are supported"),
        ({"numa_nodes": [0, "1"]}, "numa_nodes[1]: expected an integer, got str"),
        (
            {"numa_nodes": list(range(9))},
            "numa_nodes: unsupported on machines with more than 8 NUMA Nodes",
        ),
        (
            {"providers": [{"gpu": [{"affinity": [2], "preferred": True}]}]},
            'providers[0]["gpu"][0].affinity: NUMA id 2 is not one of numa_nodes [0, 1]',
        ),
        (
            {"providers": [{"gpu": [{"affinity": [-1], "preferred": True}]}]},
            "outside 0..=63",
        ),
        (
            {"providers": [{"gpu": [{"affinity": [0], "preferred": "yes"}]}]},
            'providers[0]["gpu"][0].preferred: expected true or false, got str',
        ),
        ({"providers": [{"gpu": [{"preferred": True}]}]}, 'missing "affinity"'),
        ({"providers": [{"gpu": [None]}]}, 'providers[0]["gpu"][0]: expected a hint'),
        ({"providers": [{"gpu": "abc"}]}, 'providers[0]["gpu"]: expected a list, got str'),
        ({"providers": [[1, 2]]}, "providers[0]: expected None or a mapping"),
        ({"providers": "x"}, "providers: expected a list, got str"),
        ({"options": {"prefer-most-allocated": True}}, "unknown Topology Manager Policy option"),
        ({"options": {"max-allowable-numa-nodes": 4}}, "should not be less than 8"),
        ({"options": {"max-allowable-numa-nodes": "eight"}}, "not a base-10 integer"),
        ({"options": {"prefer-closest-numa-nodes": "maybe"}}, "is not a boolean"),
        ({"distances": {0: [10, 11]}}, "distances: no row for NUMA node(s) [1]"),
        ({"distances": {0: [10], 1: [11, 10]}}, "distances[0]: row has 1 entries; expected 2"),
        ({"distances": {0: [10, 11], 1: [11, 10], 2: [1, 1]}}, "distances[2]: a row for NUMA id 2"),
        ({"distances": {"x": [10, 11], 1: [11, 10]}}, 'distances: key "x" is not a NUMA id'),
        ({"distances": {0: [10, -11], 1: [11, 10]}}, "distances[0][1]: distance -11 is outside"),
        ({"distances": [[10, 11], [11, 10]]}, "distances: expected a mapping"),
    ],
)
def test_bad_input_names_the_field(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"providers": [GPU], "policy": "best-effort", "numa_nodes": [0, 1]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        merge_hints(**args)


def test_more_than_eight_nodes_allowed_with_the_option() -> None:
    r = merge_hints(
        [GPU], "restricted", list(range(12)), options={"max-allowable-numa-nodes": "12"}
    )
    assert (r.affinity, r.preferred, r.admit) == ([0], True, True)


def test_none_policy_has_no_numa_limit_and_admits() -> None:
    r = merge_hints([GPU], "none", list(range(16)))
    assert (r.affinity, r.preferred, r.admit) == (None, False, True)


def test_prefer_closest_without_distances_errors_only_when_a_distance_is_needed() -> None:
    opts = {"prefer-closest-numa-nodes": True}
    # widths differ: no distance is read (the kubelet's TestClosest does this)
    hints = [{"affinity": [0, 1], "preferred": True}, {"affinity": [2], "preferred": True}]
    r = merge_hints([{"cpu": hints}], "best-effort", [0, 1, 2], options=opts)
    assert r.affinity == [2]
    # two equal-width candidates: the answer depends on distances that are not there
    tied = [{"affinity": [0], "preferred": True}, {"affinity": [1], "preferred": True}]
    with pytest.raises(ValueError, match="needs the NUMA distance matrix"):
        merge_hints([{"cpu": tied}], "best-effort", [0, 1], options=opts)


def test_sixty_four_nodes_work_with_the_option() -> None:
    nodes = list(range(64))
    hints = [{"affinity": [63], "preferred": True}, {"affinity": [5, 63], "preferred": True}]
    r = merge_hints(
        [{"gpu": hints}], "single-numa-node", nodes, options={"max-allowable-numa-nodes": 64}
    )
    assert (r.affinity, r.admit) == ([63], True)


def test_result_is_a_value() -> None:
    a = merge_hints([GPU], "restricted", [0, 1])
    b = merge_hints([GPU], "restricted", [0, 1])
    assert a == b
    assert hash(a) == hash(b)
    assert repr(a) == "MergeResult(affinity=[0], preferred=True, admit=True)"
