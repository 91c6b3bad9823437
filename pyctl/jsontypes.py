"""JSON as a type: what pyctl writes as JSON (command output, API manifests, stored documents) and
what it reads before decoding. `JsonValue` says exactly what JSON can hold, so mypy refuses a
value JSON cannot carry (a dataclass, a set, a Fraction); code reading a `JsonObject` must check
each value's type before using it, which is the point: input is decoded, never trusted."""

from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
#: a JSON object (a Kubernetes manifest, a command's `--json` output, a stored document)
JsonObject: TypeAlias = "dict[str, JsonValue]"


def plain(value: object) -> JsonValue:
    """`value` as JSON holds it, as `json.dumps` writes it (a tuple as a list, keys in their
    order); raises `TypeError` for what JSON cannot carry (a non-str key, a set, an object)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        out: JsonObject = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"a JSON object's key is a string, not {type(k).__name__}")
            out[k] = plain(v)
        return out
    raise TypeError(f"JSON cannot hold a {type(value).__name__}")


def as_object(value: JsonValue, what: str) -> JsonObject:
    """`value` narrowed to an object; `ValueError` naming `what` when it is not one."""
    if not isinstance(value, dict):
        raise ValueError(f"{what}: not a JSON object")
    return value


def as_list(value: JsonValue, what: str) -> list[JsonValue]:
    """`value` narrowed to an array; `ValueError` naming `what` when it is not one."""
    if not isinstance(value, list):
        raise ValueError(f"{what}: not a JSON array")
    return value
