"""The reconciler's node models over a bare cache, for tests that run workflow loops without a
controller."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pyctl.cluster.translate import node_from_records
from pyctl.controller.cache import ClusterCache
from pyctl.model import Node


class CacheModels(Mapping[str, Node]):
    """Every cached node's model, translated when read (what `Reconciler.models` holds)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def __getitem__(self, name: str) -> Node:
        rec = self.cache.nodes[name]
        return node_from_records(rec, self.cache.nrts.get(name), self.cache.pods_on(name))

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.cache.nodes))

    def __len__(self) -> int:
        return len(self.cache.nodes)
