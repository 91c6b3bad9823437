# Typed stubs of the Rust extension `pyctl._core` (rust/src/python/). Keep in step with it.
from collections.abc import Mapping, Sequence
from typing import Any, final

__version__: str

@final
class MergeResult:
    @property
    def affinity(self) -> list[int] | None: ...
    @property
    def preferred(self) -> bool: ...
    @property
    def admit(self) -> bool: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

def merge_hints(
    providers: Sequence[Mapping[str, Sequence[Any] | None] | None],
    policy: str,
    numa_nodes: Sequence[int],
    options: Mapping[str, bool | int | str] | None = None,
    distances: Mapping[int | str, Sequence[int]] | None = None,
) -> MergeResult: ...
