"""The kernel and op tables as records for machines: snake_case keys, JSON-native values, NaN as null.

`python -m profiling analyze TRACE --json` prints them beside the summary; agents read these names,
so they are a contract like the summary keys (README, "CLI").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

# Record key -> the table column it is read from (profiling/tables.py's headers carry units for people).
KERNEL_FIELDS: dict[str, str] = {
    "name": "name",
    "short_name": "kernel",
    "kind": "kind",
    "family": "family",
    "meaning": "meaning",
    "precision": "precision",
    "engine": "engine",
    "count": "count",
    "total_us": "total (us)",
    "avg_us": "avg (us)",
    "max_us": "max (us)",
    "min_us": "min (us)",
    "launched_by": "launched by",
}
OP_FIELDS: dict[str, str] = {
    "name": "name",
    "calls": "calls",
    "self_cpu_us": "self cpu (us)",
    "total_cpu_us": "total cpu (us)",
    "self_device_us": "self device (us)",
    "total_device_us": "total device (us)",
    "kind": "kind",
}


def kernel_records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """One record per row of the kernel table (`tables.kernel_table`), in its order (most time first)."""
    return records(table, KERNEL_FIELDS)


def op_records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """One record per row of the op table (`tables.op_table_from_trace`), in its order."""
    return records(table, OP_FIELDS)


def records(table: pd.DataFrame, fields: dict[str, str]) -> list[dict[str, Any]]:
    """`table`'s rows as {key: value} over `fields`; a column the table lacks reads as null."""
    columns = [table[column].tolist() if column in table else [None] * len(table) for column in fields.values()]
    return [dict(zip(fields, map(_native, row), strict=True)) for row in zip(*columns, strict=True)]


def _native(value: Any) -> Any:
    """A cell as JSON-native data: numpy scalars as Python numbers, NaN (and NA, infinities) as None."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value
