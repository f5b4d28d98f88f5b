"""The CLI's `compare` and `sweep` tables: the columns a reader needs, within a terminal's 120 columns.

`--json` keeps every key; these tables choose. Compare: one line per run with its forward time (the
median of the unprofiled calls, with their interquartile range), kernels per forward, peak memory,
error against float64 and the speed-up over naive with its 95% interval and status. Sweep: one line
per point. What does not fit a cell (why a run could not run, why a sweep stopped) follows the table,
wrapped. Cells hold data from summaries: the CLI makes every string in them plain before they get here.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from attention import format_bytes
from profiling.compare import BASELINE, compare_lesson, forward_ms, forward_timing, row_label

WIDTH = 120  # the widest line printed
GAP = "  "  # between columns
ELLIPSIS = "…"
NONE = "-"  # a value the row does not have
MIN_TEXT = 6  # a text column squeezed to fit keeps at least this many characters
Row = dict[str, Any]


@dataclass(frozen=True)
class Column:
    """A table column: its header, how a row becomes its cell, and whether it is text (left-aligned, the
    one that gives way when the table is too wide) or a number (right-aligned, never cut)."""

    header: str
    cell: Callable[[Row], str]
    text: bool = False
    optional: bool = False  # dropped when no row has a value in it (device time on a CPU run)


def table_lines(rows: Sequence[Row], columns: Sequence[Column], width: int = WIDTH) -> list[str]:
    """`rows` as a header line and one line per row, within `width` characters: text columns give way
    (cut with an ellipsis); numbers are never cut, and these tables' numbers alone fit in 120."""
    cells = [[column.cell(row) for column in columns] for row in rows]
    keep = [i for i, c in enumerate(columns) if not (c.optional and all(line[i] == NONE for line in cells))]
    columns = [columns[i] for i in keep]
    cells = [[line[i] for i in keep] for line in cells]
    widths = _fit(
        [max([len(c.header)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)], columns, width
    )
    lines = [_line([c.header for c in columns], columns, widths)]
    return lines + [_line(line, columns, widths) for line in cells]


def _fit(widths: list[int], columns: Sequence[Column], width: int) -> list[int]:
    """Narrow the widest text column, one character at a time, until the line fits (or none can give)."""
    widths = list(widths)
    while sum(widths) + len(GAP) * (len(widths) - 1) > width:
        text = [i for i, c in enumerate(columns) if c.text and widths[i] > MIN_TEXT]
        if not text:
            break
        widest = max(text, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def _line(cells: Sequence[str], columns: Sequence[Column], widths: Sequence[int]) -> str:
    parts = []
    for cell, column, size in zip(cells, columns, widths, strict=True):
        cell = cell if len(cell) <= size else cell[: size - 1] + ELLIPSIS
        parts.append(cell.ljust(size) if column.text else cell.rjust(size))
    return GAP.join(parts).rstrip()


def wrapped(text: str, indent: str = "  ", width: int = WIDTH) -> list[str]:
    """`text` as lines of at most `width` characters, continuation lines indented by `indent` and two more."""
    return textwrap.wrap(text, width, subsequent_indent=indent + "  ", break_long_words=True) or [""]


# ---------------------------------------------------------------- numbers as cells


def ms(value: Any) -> str:
    """Milliseconds: three significant digits, thousands separated past 1,000."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return NONE
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def spread(lo: Any, hi: Any) -> str:
    """An interval `lo–hi` in `ms` form, or NONE when either end is missing."""
    return NONE if ms(lo) == NONE or ms(hi) == NONE else f"{ms(lo)}–{ms(hi)}"


def count(value: Any) -> str:
    """A count, whole as typed (a seq_len), or fractional in three significant digits (kernels per forward
    averaged over forwards)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return NONE
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"


def memory(value: Any) -> str:
    """Bytes, in binary units."""
    return format_bytes(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else NONE


def error(value: Any) -> str:
    """An absolute error, in two significant digits."""
    return f"{value:.1e}" if isinstance(value, (int, float)) and not isinstance(value, bool) else NONE


# ---------------------------------------------------------------- compare


def _forward(row: Row) -> tuple[Any, Any, Any]:
    """The forward's median and quartiles from its unprofiled samples; without samples, `forward_ms` alone."""
    timing = forward_timing(row)
    if timing is None:
        return forward_ms(row) if "error" not in row else None, None, None
    return timing.median, timing.p25, timing.p75


def _baseline(row: Row) -> bool:
    return row.get("variant") == BASELINE and row.get("speedup") == 1.0 and "error" not in row


def _run(row: Row) -> str:
    """The run's label, with the SDPA backend it really used where that is not the one asked for (sdpa-auto)."""
    label, used = row_label(row), row.get("backend_used")
    return f"{label} ({used})" if used and used != row.get("backend") else label


def _speedup(row: Row) -> str:
    value = row.get("speedup")
    return f"{value:.3g}×" if isinstance(value, (int, float)) and not isinstance(value, bool) else NONE


def _interval(row: Row) -> str:
    """The speed-up's 95% interval in two significant digits (none for the baseline against itself)."""
    ci = row.get("speedup_ci")
    if _baseline(row) or not ci:
        return NONE
    return f"{ci[0]:.2g}–{ci[1]:.2g}"


def _status(row: Row) -> str:
    """As `compare_lesson` ranks: a run whose timing is noisy is "noisy", never faster or slower."""
    if "error" in row:
        return "not run"
    timing = forward_timing(row)
    if timing is not None and timing.noisy:
        return "noisy"
    return "baseline" if _baseline(row) else row.get("speedup_status") or "no samples"


COMPARE = (
    Column("run", _run, text=True),
    Column("kern/fwd", lambda r: count(r.get("kernels_per_forward"))),
    Column("fwd ms", lambda r: ms(_forward(r)[0])),
    Column("IQR ms", lambda r: spread(*_forward(r)[1:])),
    Column("device ms", lambda r: ms(r.get("forward_device_ms")), optional=True),
    Column("peak mem", lambda r: memory(r.get("peak_memory_bytes"))),
    Column("error", lambda r: error(r.get("max_abs_error"))),
    Column("speed-up", _speedup),
    Column("95% CI", _interval),
    Column("vs naive", _status, text=True),
)
COMPARE_LEGEND = (
    "fwd ms: median of the unprofiled forwards, IQR their 25th-75th percentiles; kern/fwd: kernels per forward "
    "(on CPU, compute ops); error: max |out - float64 reference|; speed-up: median(naive) / median(run), with its "
    "95% bootstrap interval; noisy: timing too spread to rank (coefficient of variation over 10%)."
)
DEVICE_LEGEND = " device ms: the profiler's GPU time per forward."


def compare_lines(rows: Sequence[Row], width: int = WIDTH) -> list[str]:
    """`python -m profiling compare`'s output: the table, its legend, the runs that could not run and why,
    and the comparison's lesson."""
    legend = COMPARE_LEGEND + (DEVICE_LEGEND if any(r.get("forward_device_ms") is not None for r in rows) else "")
    lines = [*table_lines(rows, COMPARE, width), "", *wrapped(legend, "", width)]
    missing = [r for r in rows if "error" in r]
    if missing:
        lines += ["", "not run:"]
        for row in missing:
            lines += wrapped(f"  {row_label(row)}: {row['error']}", "  ", width)
    return [*lines, "", *wrapped(compare_lesson(list(rows)), "", width)]


# ---------------------------------------------------------------- sweep


def _tflops(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else NONE


SWEEP = (
    Column("run", lambda r: str(r.get("run")), text=True),
    Column("seq_len", lambda r: count(r.get("seq_len"))),
    Column("q_len", lambda r: count(r.get("q_len"))),
    Column("fwd ms", lambda r: ms(r.get("forward_ms"))),
    Column("IQR ms", lambda r: spread(r.get("forward_ms_p25"), r.get("forward_ms_p75"))),
    Column("kernels/fwd", lambda r: count(r.get("kernels_per_forward"))),
    Column("peak memory", lambda r: memory(r.get("peak_memory_bytes"))),
    Column("TFLOP/s", lambda r: _tflops(r.get("achieved_tflops"))),
    Column("status", lambda r: str(r.get("status")) + (", noisy" if r.get("noisy") else ""), text=True),
)
SWEEP_LEGEND = (
    "fwd ms: median of the unprofiled forwards, IQR their 25th-75th percentiles; "
    "noisy: their coefficient of variation passes 10%."
)


def sweep_lines(points: Sequence[Row], width: int = WIDTH) -> list[str]:
    """`python -m profiling sweep`'s output: one line per point, the legend, then why each stopped run stopped."""
    lines = [*table_lines(points, SWEEP, width), "", *wrapped(SWEEP_LEGEND, "", width)]
    stopped = [p for p in points if p.get("status") == "stopped"]
    if stopped:
        lines += ["", "stopped:"]
        for point in stopped:
            lines += wrapped(
                f"  {point.get('run')} at seq_len {point.get('seq_len')}: {point.get('reason')}", "  ", width
            )
    return lines
