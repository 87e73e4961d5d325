"""Quantities as a user types them on the command line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlflow_gpuopt.quantities import (
    QuantityError,
    format_count,
    parse_count,
    parse_duration_hours,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("2e9", 2e9), ("2B", 2e9), ("1.5M", 1.5e6), ("500k", 5e5), ("1_000_000", 1e6),
    ("1,281,167", 1281167), ("3T", 3e12), ("42", 42), (" 7 ", 7), (".5M", 5e5), (10, 10),
])
def test_counts(text, expected):
    assert parse_count(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "abc", "2X", "-5", "0", "1e", "2BB", "nan", "inf", True])
def test_bad_counts(text):
    with pytest.raises(QuantityError):
        parse_count(text)


@pytest.mark.parametrize(("text", "hours"), [
    ("36h", 36), ("90m", 1.5), ("2d", 48), ("1d12h", 36), ("24", 24), ("1.5h", 1.5),
    ("1w", 168), ("3600s", 1), ("1D 2H", 26), ("2h30m", 2.5),
])
def test_durations(text, hours):
    assert parse_duration_hours(text) == pytest.approx(hours)


@pytest.mark.parametrize("text", ["", "h", "12x", "1d12", "-1h", "0h", "tomorrow", "12h-3m"])
def test_bad_durations(text):
    with pytest.raises(QuantityError, match="deadline|duration"):
        parse_duration_hours(text, what="deadline")


@given(st.floats(min_value=1, max_value=1e14))
def test_format_count_round_trips_to_three_digits(value):
    assert parse_count(format_count(value)) == pytest.approx(value, rel=5e-3)


def test_finite_float_reads_a_number_if_there_is_one():
    from mlflow_gpuopt.validation import finite_float

    assert [finite_float(v) for v in (8, 8.5, "8", " 8.0 ", "1e3", 10**400)] == [
        8.0, 8.5, 8.0, 8.0, 1000.0, None]
    for missing in (None, "", "None", "nan", "inf", "-inf", float("nan"), True, "eight", [1]):
        assert finite_float(missing) is None, missing
