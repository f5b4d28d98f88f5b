"""Tables for people: the API's tables (profiling/tables.py, /compare's) reordered, in one unit, formatted.

The API keeps its numbers and headers for machines. What the page shows is built here from them:
sorted by device self time where the trace has GPU activity (the TensorBoard plugin's Operator
view does the same) and by host self time otherwise, every time in µs with thousands separators,
a `% of total` beside the sort key, columns that hold nothing hidden, "per forward" only where
forwards exist, and names kept whole (the page clips them to a fixed width).

    shown = prepare(op_table, "ops", gpu=True, forwards=None)
    shown.values  # numbers, in the order and units shown (the CSV and the page's sort read these)
    shown.text    # the same cells as text: "38,954.0"

Pure pandas: no gradio, no plotly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

KINDS = ("ops", "kernels", "compute ops", "steps", "annotations", "compare")
PERCENT = "% of total"
# Columns whose numbers are whole counts: shown as integers with separators.
COUNT_COLUMNS = frozenset(
    {"calls", "count", "ops", "gpu activities", "registers/thread", "shared mem (B)", "position", "calls (all)"}
)
# Columns that count per forward: shown only where the run has forwards (uploads have none).
PER_FORWARD = frozenset({"per forward", "kernels/forward"})
_MS = re.compile(r"\((ms)\)")
_US = re.compile(r"\((us)\)")
# Characters of a column's widest cell counted when sizing it; names wider than this are clipped on the page.
NAME_CHARS = 36
TEXT_CHARS = 28


@dataclass(frozen=True)
class Shown:
    """One table as the page shows it: `values` (numbers), `text` (formatted), both in the shown order."""

    values: pd.DataFrame
    text: pd.DataFrame
    sorted_by: str | None  # the column the rows are sorted by (descending), None where the API's order is kept

    def widths(self) -> list[int]:
        """Each column's width in characters: its header or its widest cell, text columns capped."""
        return [_width(column, self.text[column]) for column in self.text.columns]


def display_table(df: pd.DataFrame, kind: str, *, gpu: bool, forwards: int | None) -> pd.DataFrame:
    """`df` (an API table of `kind`) as the page shows it, every cell a string (see `prepare`)."""
    return prepare(df, kind, gpu=gpu, forwards=forwards).text


def prepare(df: pd.DataFrame, kind: str, *, gpu: bool, forwards: int | None) -> Shown:
    """`df`, an API table of `kind` (one of KINDS), in the page's order, unit and columns.

    gpu: the trace has GPU activity (sort by self device time, else by self CPU time).
    forwards: how many forwards the run measured; None or 0 for an upload (no "per forward" columns).
    """
    if kind not in KINDS:
        raise ValueError(f"kind: one of {', '.join(KINDS)}, got {kind!r}")
    table = _in_microseconds(df.copy())
    if not forwards and kind != "compare":  # compare's rows are runs, and every run has forwards
        table = table.drop(columns=[c for c in table.columns if c in PER_FORWARD])
    table, key = _sorted(table, kind, gpu)
    if key is not None and len(table):
        table = _with_percent(table, key, kind)
    table = _without_empty_columns(table)
    return Shown(values=table, text=_formatted(table), sorted_by=key)


def has_gpu_activity(summary: dict[str, Any]) -> bool:
    """Whether a /profile or /analyze summary's trace holds GPU activity (kernels, memcpys, memsets)."""
    if "gpu_activity_events" in summary:  # /analyze: counted from the trace
        return bool(summary["gpu_activity_events"])
    return summary.get("forward_device_ms") is not None  # /profile: device time exists only on a GPU


def compute_ops(op_table: pd.DataFrame, per_forward: dict[str, float]) -> pd.DataFrame:
    """On CPU, the kernel table's stand-in: the leaf compute ops the summary counts as kernels
    (`per_forward_kernels`), with their op-table times (over every call of the op, compute or not)."""
    ops = op_table[op_table["kind"].eq("op") & op_table["name"].isin(list(per_forward))]
    return pd.DataFrame(
        {
            "name": ops["name"].to_numpy(),
            "per forward": ops["name"].map(per_forward).to_numpy(),
            "calls (all)": ops["calls"].to_numpy(),
            "self cpu (us)": ops["self cpu (us)"].to_numpy(),
            "total cpu (us)": ops["total cpu (us)"].to_numpy(),
        }
    )


def _in_microseconds(table: pd.DataFrame) -> pd.DataFrame:
    """Every time column in µs: ms columns times 1000, and "us" spelled "µs"."""
    renames = {}
    for column in table.columns:
        if _MS.search(column):
            table[column] = pd.to_numeric(table[column], errors="coerce") * 1000.0
            renames[column] = _MS.sub("(µs)", column)
        elif _US.search(column):
            renames[column] = _US.sub("(µs)", column)
    return table.rename(columns=renames)


def _sort_key(table: pd.DataFrame, kind: str, gpu: bool) -> str | None:
    if kind == "ops":
        return "self device (µs)" if gpu else "self cpu (µs)"
    if kind == "kernels":
        return "total (µs)"
    if kind == "compute ops":
        return "self cpu (µs)"
    return None  # steps in time order, annotations and compare rows as the API gives them


def _sorted(table: pd.DataFrame, kind: str, gpu: bool) -> tuple[pd.DataFrame, str | None]:
    """Largest first by the sort key; on the op table ops before annotations, ties by self CPU time."""
    key = _sort_key(table, kind, gpu)
    if key is None or key not in table.columns:
        return table, None
    by, ascending = [key], [False]
    if kind == "ops" and "kind" in table.columns:
        by, ascending = ["_annotation", key, "self cpu (µs)"], [True, False, False]
        table = table.assign(_annotation=table["kind"].eq("annotation"))
    table = table.sort_values(by, ascending=ascending, kind="stable", ignore_index=True)
    return table.drop(columns=[c for c in table.columns if c == "_annotation"]), key


def _with_percent(table: pd.DataFrame, key: str, kind: str) -> pd.DataFrame:
    """`% of total` right after the sort key: each row's share of the key's sum over the table.

    Self times partition the trace's time (an annotation's self time is what no op inside it
    covers), so on the op table the sum runs over ops and annotations alike."""
    values = pd.to_numeric(table[key], errors="coerce")
    total = values.sum()
    share = values / total * 100.0 if total > 0 else values * math.nan
    at = table.columns.get_loc(key) + 1
    table.insert(at, PERCENT, share.to_numpy())
    return table


def _is_empty(series: pd.Series) -> bool:
    """All zero, NaN, None or blank: nothing to read in the column."""
    if pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series):
        return bool(series.fillna(0).eq(0).all())
    return all(_blank(v) for v in series)


def _blank(value: Any) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    if isinstance(value, str):
        return not value.strip()
    return isinstance(value, (int, float)) and value == 0


def _without_empty_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Columns that hold nothing go, except the first (the name) so an empty table keeps a shape."""
    if not len(table):
        return table
    empty = [c for c in table.columns[1:] if _is_empty(table[c])]
    return table.drop(columns=empty)


def formatter(column: str) -> Callable[[Any], str]:
    """How the page writes one cell of `column`: times and counts with separators, blanks for nothing."""
    if "(µs)" in column:
        return _time
    if column in COUNT_COLUMNS:
        return _count
    if "%" in column:
        return _percent
    return _plain


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)


def _time(value: Any) -> str:
    """µs with one decimal (38,954.0); below 1 µs three significant digits, so 0.032 is not 0.0."""
    number = _number(value)
    if number is None:
        return _text(value)
    if number == 0 or abs(number) >= 1:
        return f"{number:,.1f}"
    return f"{number:.3g}"


def _count(value: Any) -> str:
    number = _number(value)
    if number is None:
        return _text(value)
    return f"{number:,.0f}" if number.is_integer() else _plain(number)


def _percent(value: Any) -> str:
    number = _number(value)
    return _text(value) if number is None else f"{number:.1f}"


def _plain(value: Any) -> str:
    """Up to three decimals, trailing zeros dropped: 2, 0.333, 15.515."""
    number = _number(value)
    if number is None:
        return _text(value)
    text = f"{number:,.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _formatted(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {column: [formatter(column)(v) for v in table[column].tolist()] for column in table.columns},
        columns=table.columns,
        dtype=object,
    )


def _width(column: str, cells: pd.Series) -> int:
    widest = max((len(c) for c in cells), default=0)
    numeric = "(µs)" in column or column in COUNT_COLUMNS or "%" in column
    cap = None if numeric else (NAME_CHARS if column in ("name", "kernel", "run", "step", "annotation") else TEXT_CHARS)
    # A header wraps at its spaces, never inside a word: its longest word is the floor.
    floor = max(len(word) for word in column.split())
    width = max(widest, floor)
    return width if cap is None else min(max(width, floor), cap)
