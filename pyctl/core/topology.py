"""The kubelet Topology Manager's hint merge ("hint intersection"), computed by the Rust core.

`merge_hints` takes the providers' hints exactly as the conformance corpus writes them (plain
dicts and lists, ``None`` for "no preference") or as `TopologyHint` objects, and answers what the
kubelet would: the merged NUMA affinity, whether it is preferred, and whether the pod is admitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from pyctl import _core
from pyctl._core import MergeResult

PREFER_CLOSEST_NUMA_NODES: Final = "prefer-closest-numa-nodes"
MAX_ALLOWABLE_NUMA_NODES: Final = "max-allowable-numa-nodes"


@dataclass(frozen=True, slots=True)
class TopologyHint:
    """A provider's hint: ``affinity`` is a list of NUMA ids, or ``None`` for "any NUMA node"
    (the nil mask); ``[]`` is a non-nil empty mask, which fits nowhere."""

    affinity: Sequence[int] | None
    preferred: bool


HintLike: TypeAlias = TopologyHint | Mapping[str, object]
#: One provider's answer: ``None`` (nil map) or resource -> ``None`` (no preference),
#: ``[]`` (no possible affinity) or a list of hints.
Provider: TypeAlias = Mapping[str, Sequence[HintLike] | None] | None


def merge_hints(
    providers: Sequence[Provider],
    policy: str = "none",
    numa_nodes: Sequence[int] = (0,),
    options: Mapping[str, bool | int | str] | None = None,
    distances: Mapping[int, Sequence[int]] | Mapping[str, Sequence[int]] | None = None,
) -> MergeResult:
    """Merge the providers' hints under ``policy`` on a machine with ``numa_nodes``.

    ``options`` takes the kubelet's policy options (``prefer-closest-numa-nodes``,
    ``max-allowable-numa-nodes``); ``distances`` maps each NUMA id to its row of the distance
    matrix, indexed by NUMA id. Bad input raises ``ValueError`` naming the field.
    """
    return _core.merge_hints(providers, policy, numa_nodes, _plain(options), _plain(distances))


def _plain(value: Mapping[Any, Any] | None) -> Any:
    """The core reads dicts; pass any other mapping as one, and everything else unchanged
    (the core's error then names the field)."""
    if isinstance(value, Mapping) and not isinstance(value, dict):
        return dict(value)
    return value


__all__ = [
    "MAX_ALLOWABLE_NUMA_NODES",
    "PREFER_CLOSEST_NUMA_NODES",
    "MergeResult",
    "Provider",
    "TopologyHint",
    "merge_hints",
]
