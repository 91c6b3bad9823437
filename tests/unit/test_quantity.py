"""Kubernetes quantities, parsed exactly."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pyctl.cluster.quantity import QuantityError, count, cpu_milli, memory_mib, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1500m", Fraction(3, 2)),
        ("64Gi", Fraction(64 * 2**30)),
        ("1e3", Fraction(1000)),
        ("0.5", Fraction(1, 2)),
        ("1.5E-3", Fraction(3, 2000)),
        ("2k", Fraction(2000)),
        ("100M", Fraction(10**8)),
        ("512Ki", Fraction(512 * 1024)),
        ("+4", Fraction(4)),
        (".25", Fraction(1, 4)),
        ("250n", Fraction(1, 4 * 10**6)),
        (8, Fraction(8)),
    ],
)
def test_parse(text: str | int, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "bad", ["", "abc", "1.5.2", "12Gb", "1e", "Gi", "--1", "1 Gi", "1e999", True]
)
def test_malformed(bad: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)


def test_conversions() -> None:
    assert cpu_milli("1500m") == 1500
    assert cpu_milli("0.0001") == 1  # requests round up
    assert memory_mib("1Gi") == 1024
    assert memory_mib("1000000", round_up=False) == 0
    assert memory_mib("1000000") == 1
    assert count("8") == 8
    with pytest.raises(QuantityError, match="whole number"):
        count("1500m")
