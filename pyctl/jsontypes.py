"""JSON as a type: what pyctl writes as JSON (command output, API manifests, stored documents) and
what it reads before decoding. `JsonValue` says exactly what JSON can hold, so mypy refuses a
value JSON cannot carry (a dataclass, a set, a Fraction); code reading a `JsonObject` must check
each value's type before using it, which is the point: input is decoded, never trusted."""

from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
#: a JSON object (a Kubernetes manifest, a command's `--json` output, a stored document)
JsonObject: TypeAlias = "dict[str, JsonValue]"
