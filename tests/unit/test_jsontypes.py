"""`plain` writes a value as JSON holds it (what `json.dumps` writes), refusing what JSON cannot
carry; `as_object` / `as_list` narrow a value read, naming the field when it is not one."""

from __future__ import annotations

import json

import pytest

from pyctl.jsontypes import as_list, as_object, plain


def test_plain_is_what_json_dumps_writes() -> None:
    value = {"b": (1, (2, 3)), "a": [None, True, 1.5, "x"], "c": {"d": ()}}
    got = plain(value)
    assert got == {"b": [1, [2, 3]], "a": [None, True, 1.5, "x"], "c": {"d": []}}
    assert json.dumps(got) == json.dumps(value)  # the same text, keys in the same order


@pytest.mark.parametrize("value", [{1, 2}, {"a": object()}, {1: "a"}, [b"bytes"]])
def test_plain_refuses_what_json_cannot_carry(value: object) -> None:
    with pytest.raises(TypeError):
        plain(value)


def test_narrowing_names_the_field() -> None:
    assert as_object({"a": 1}, "x") == {"a": 1}
    assert as_list([1], "x") == [1]
    with pytest.raises(ValueError, match=r"^gpus: not a JSON array$"):
        as_list({"a": 1}, "gpus")
    with pytest.raises(ValueError, match=r"^numa: not a JSON object$"):
        as_object([1], "numa")
