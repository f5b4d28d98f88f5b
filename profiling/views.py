"""The extra views of a trace, in one registry: memory, modules, grouping and tensor cores.

    shown = view(trace, "memory")  # a View: a table of numbers (units in the headers) and a note
    json.dumps(shown.to_dict(), allow_nan=False)

Each view is computed by its analysis module (`memory_view`, `modules`, `grouping`); this module picks the
rows shown (the first `top` in the view's own order, the count of all kept), names the columns with their
units, says in `note` what the view shows or why it is empty, and thins the memory curve for drawing. It
never imports plotly: profiling/charts/memory.py draws the curve, and the CLI (profiling/cli_views.py)
prints the table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from profiling.memory_curve import thinned_curves
from profiling.reader import Progress
from profiling.trace import Trace

MAX_ROWS = 1000  # table rows a view keeps unless asked for fewer; the count of all rows is kept beside
MAX_CHART_DEVICES = 8  # devices drawn, the highest peaks first: a hostile trace can name millions
PEAK_COLUMNS = ["device", "peak allocated (B)", "peak time (ms)", "peak reserved (B)"]
MEMORY_OP_COLUMNS = {
    "device": "device",
    "name": "name",
    "calls": "calls",
    "self_alloc_count": "self allocs",
    "self_alloc_bytes": "self alloc (B)",
    "self_increase_bytes": "self increase (B)",
    "alloc_count": "allocs",
    "alloc_bytes": "alloc (B)",
    "increase_bytes": "increase (B)",
}
MEMORY_EVENT_COLUMNS = ["device", "op", "size (B)", "addr", "alloc at (ms)", "release at (ms)", "duration (ms)"]
NO_MEMORY = "No [memory] events in this trace: record with torch.profiler.profile(profile_memory=True)."
NO_KERNELS = "No GPU kernels in this trace: record on a GPU with ProfilerActivity.CUDA."
NO_STACKS = "No python_function events: record with with_stack=True to group ops by call stack."


class ViewError(ValueError):
    """A view name that is not in VIEWS; the message names the field, `view`."""


@dataclass(frozen=True)
class View:
    """One view of one trace: what the app, the CLI and the API show.

    table: numbers with their units in the headers (µs, ms, B); NaN where a value is unknown. At most the
      `top` rows asked for, in the view's order; `rows` counts them all.
    curve, peaks: the memory view's chart data (memory_curve.CURVE_COLUMNS, thinned to MAX_CURVE_POINTS a series;
      PEAK_COLUMNS, one row per device drawn); None for the other views. Times are ms from the trace's start.
    """

    name: str
    title: str
    table: pd.DataFrame
    note: str
    rows: int
    curve: pd.DataFrame | None = None
    peaks: pd.DataFrame | None = None

    def to_dict(self) -> dict[str, Any]:
        """The view as JSON-native values: no NaN or infinity (null instead), no numpy types."""
        chart = None
        if self.curve is not None and self.peaks is not None:
            series = [
                {
                    "device": device,
                    "series": name,
                    "time_ms": [_native(v) for v in part["time (ms)"].tolist()],
                    "bytes": [_native(v) for v in part["bytes"].tolist()],
                }
                for (device, name), part in self.curve.groupby(["device", "series"], sort=False)
            ]
            chart = {"series": series, "peaks": _records(self.peaks)}
        return {
            "view": self.name,
            "title": self.title,
            "note": self.note,
            "rows": int(self.rows),
            "shown": len(self.table),
            "columns": [str(c) for c in self.table.columns],
            "table": _records(self.table),
            "chart": chart,
        }

    def to_json(self) -> str:
        """`to_dict` as JSON text (strict: `allow_nan=False`)."""
        return json.dumps(self.to_dict(), allow_nan=False)


class Part(NamedTuple):
    """What a view's builder returns; `view` adds the name and title."""

    table: pd.DataFrame
    rows: int
    note: str
    curve: pd.DataFrame | None = None
    peaks: pd.DataFrame | None = None


@dataclass(frozen=True)
class ViewKind:
    """A registered view: its title, its builder, and the columns the CLI prints within 120 characters."""

    title: str
    build: Callable[[Trace, int], Part]
    text_columns: tuple[str, ...]


def view(trace: Trace, name: str, top: int = MAX_ROWS) -> View:
    """The view `name` (a key of VIEWS) of `trace`, its table cut to the first `top` rows. ViewError names
    `view` for an unknown name."""
    kind = VIEWS[check_view(name)]
    part = kind.build(trace, max(int(top), 0))
    return View(name, kind.title, part.table.reset_index(drop=True), part.note, part.rows, part.curve, part.peaks)


def check_view(name: Any) -> str:
    """`name` if it is a registered view, else ViewError naming the field and the choices."""
    if isinstance(name, str) and name in VIEWS:
        return name
    raise ViewError(f"view: choose one of {', '.join(VIEWS)}; got {str(name)[:60]!r}")


def view_file(
    path: str, limits: dict[str, int], name: str, top: int = MAX_ROWS, progress: Progress | None = None
) -> View:
    """Read the trace at `path` within the reader's `limits` and build its view `name` (runs in the analysis
    process of profiling.uploads.analyze_upload, as the page's outputs do)."""
    from profiling.trace import load_trace

    report = progress or (lambda fraction, message: None)
    trace = load_trace(path, lambda f, m: report(0.8 * f, m), **limits)
    report(0.85, f"building the {name} view")
    return view(trace, name, top)


def _memory(trace: Trace, top: int) -> Part:
    from profiling.memory_view import memory_view

    shown = memory_view(trace, max_rows=top)
    if shown is None:
        return Part(pd.DataFrame(columns=list(MEMORY_OP_COLUMNS.values())), 0, NO_MEMORY)
    origin = _origin(trace)
    peaks = shown.peaks.sort_values("peak_allocated", ascending=False, kind="stable").head(MAX_CHART_DEVICES)
    peak_table = pd.DataFrame(
        {
            "device": peaks["device"].to_numpy(),
            "peak allocated (B)": peaks["peak_allocated"].to_numpy(),
            "peak time (ms)": (peaks["peak_ts"].to_numpy() - origin) / 1000.0,
            "peak reserved (B)": peaks["peak_reserved"].to_numpy(),
        },
        columns=PEAK_COLUMNS,
    )
    curve = thinned_curves(shown.curves, peak_table["device"].tolist(), origin)
    at_peak = "; ".join(
        f"{row['device']} {_size(row['peak allocated (B)'])} at {row['peak time (ms)']:,.3f} ms"
        for row in peak_table.to_dict("records")
    )
    devices = shown.peaks["device"].nunique()
    note = " ".join(
        filter(
            None,
            [
                "Bytes allocated per op, by its own calls (self) and with the ops it calls; the increase is "
                "allocated less freed.",
                f"Peak allocated: {at_peak}." if at_peak else "",
                f"The {len(peak_table)} highest of {devices} devices are drawn." if devices > len(peak_table) else "",
                _cap_note(len(shown.ops), shown.op_count, "(device, op) rows", "most bytes allocated first"),
            ],
        )
    )
    return Part(shown.ops.rename(columns=MEMORY_OP_COLUMNS), shown.op_count, note, curve, peak_table)


def _memory_events(trace: Trace, top: int) -> Part:
    from profiling.memory_view import memory_view

    shown = memory_view(trace, max_rows=top)
    if shown is None:
        return Part(pd.DataFrame(columns=MEMORY_EVENT_COLUMNS), 0, NO_MEMORY)
    events, origin = shown.events, _origin(trace)
    table = pd.DataFrame(
        {
            "device": events["device"].to_numpy(),
            "op": events["op"].to_numpy(),
            "size (B)": events["bytes"].to_numpy(),
            "addr": [f"0x{int(a):x}" if math.isfinite(a) and a >= 0 else "" for a in events["addr"].tolist()],
            "alloc at (ms)": (events["alloc_ts"].to_numpy() - origin) / 1000.0,
            "release at (ms)": (events["release_ts"].to_numpy() - origin) / 1000.0,
            "duration (ms)": events["duration"].to_numpy() / 1000.0,
        },
        columns=MEMORY_EVENT_COLUMNS,
    )
    note = (
        "Each allocation paired with its free (same device and address); no release time: not freed within "
        "the trace; no allocation time: allocated before it. "
        + _cap_note(len(table), shown.event_count, "allocations", "the largest first")
    )
    return Part(table, shown.event_count, note.strip())


def _modules(trace: Trace, top: int) -> Part:
    from profiling.modules import module_view

    shown = module_view(trace, max_rows=top)
    # Not "path": gradio_client takes any JSON object with a "path" key for a file to download.
    table = shown.table.rename(columns={"path": "module path"})
    if not shown.module_events:
        return Part(table, 0, shown.note)
    note = (
        "nn.Module calls by path (recorded with with_stack=True), in tree order: calls, host and device "
        "time (µs), total and self (outside child modules)."
    )
    if shown.table["device total (us)"].isna().all():
        note += " No GPU activity in this trace: device time is unknown."
    cut = f"{shown.note}." if shown.note and not shown.note.endswith(".") else shown.note
    return Part(table, shown.paths, " ".join(filter(None, [note, cut])))


def _ops_by_shape(trace: Trace, top: int) -> Part:
    from profiling.grouping import ops_by_input_shape

    table = ops_by_input_shape(trace)
    note = "Ops grouped by name and input dims, most self device time first, then self CPU time (µs)."
    if len(table) and not table["input dims"].astype(bool).any():
        note += " This trace has no input shapes: record with record_shapes=True."
    return _capped(table, top, note, "(op, input dims) groups")


def _ops_by_stack(trace: Trace, top: int) -> Part:
    from profiling.grouping import ops_by_call_stack

    table = ops_by_call_stack(trace, top)  # texts for the groups shown only: a stack's may be 64 kB
    note = "Ops grouped by name and the python_function calls around them, innermost first (µs)."
    if len(table) and not table.attrs["stacks"]:
        note += " " + NO_STACKS
    return _shown(table, table.attrs["groups"], note, "(op, call stack) groups")


def _kernels_by_launch(trace: Trace, top: int) -> Part:
    from profiling.grouping import kernels_by_properties

    table = kernels_by_properties(trace)
    note = (
        "Kernels grouped by name, launching op, grid, block, registers per thread and shared memory, "
        "most total time first (µs)."
    )
    return _capped(table, top, note if len(table) else NO_KERNELS, "kernel groups")


def _tensor_cores(trace: Trace, top: int) -> Part:
    from profiling.grouping import tensor_core_ops

    table = tensor_core_ops(trace)
    table["tc self %"] = pd.to_numeric(table["tc self %"], errors="coerce").astype(np.float64)
    eligible = table[table["tc eligible"].astype(bool)]
    ran, on_tc = float(eligible["self kernel (us)"].sum()), float(eligible["tc self kernel (us)"].sum())
    if trace.kernels.empty:
        note = NO_KERNELS + " Tensor-core use is unknown; eligibility (the plugin's allow-list) is listed."
    elif ran > 0:
        note = (
            f"Tensor-core eligible ops (the TensorBoard plugin's allow-list) ran {on_tc:,.1f} of their "
            f"{ran:,.1f} µs of kernel time on tensor cores ({100.0 * on_tc / ran:.1f}%)."
        )
    else:
        note = "No tensor-core eligible op (the TensorBoard plugin's allow-list) launched a kernel."
    return _capped(table, top, note, "ops", "most self kernel time first")


def _capped(table: pd.DataFrame, top: int, note: str, what: str, order: str = "") -> Part:
    return _shown(table.head(top), len(table), note, what, order)


def _shown(shown: pd.DataFrame, rows: int, note: str, what: str, order: str = "") -> Part:
    """The first rows of a table of `rows`, the note saying how many are shown where not all."""
    return Part(shown, rows, " ".join(filter(None, [note, _cap_note(len(shown), rows, what, order)])))


def _cap_note(shown: int, rows: int, what: str, order: str = "") -> str:
    if shown >= rows:
        return ""
    return f"The first {shown:,} of {rows:,} {what} are shown{f' ({order})' if order else ''}."


def _origin(trace: Trace) -> float:
    """The trace's first start (µs, as `events.ts`): the earliest duration or instant event (metadata events
    carry no time of their own), time 0 of the views' times."""
    ev = trace.events
    ts = ev["ts"].to_numpy(dtype=np.float64)[ev["ph"].isin(("X", "i")).to_numpy()]
    ts = ts[np.isfinite(ts)]
    return float(ts.min()) if len(ts) else 0.0


def _size(value: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value:,.0f} B"


def _native(value: Any) -> Any:
    """A JSON-native value: numpy scalars as Python's, NaN and infinities as None, other objects as text."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    columns = [str(c) for c in table.columns]
    values = [[_native(v) for v in table[c].tolist()] for c in table.columns]
    return [dict(zip(columns, row, strict=True)) for row in zip(*values, strict=True)] if columns else []


VIEWS: dict[str, ViewKind] = {
    "memory": ViewKind(
        "Memory: allocations per op, and the curve",
        _memory,
        ("device", "name", "calls", "self alloc (B)", "alloc (B)", "increase (B)"),
    ),
    "memory events": ViewKind(
        "Memory: allocation events",
        _memory_events,
        ("device", "op", "size (B)", "alloc at (ms)", "duration (ms)"),
    ),
    "modules": ViewKind(
        "Modules: the nn.Module tree",
        _modules,
        ("module path", "calls", "host total (us)", "host self (us)", "device total (us)", "device self (us)"),
    ),
    "ops by input shape": ViewKind(
        "Ops by input shape",
        _ops_by_shape,
        ("name", "input dims", "calls", "self cpu (us)", "self device (us)", "total device (us)"),
    ),
    "ops by call stack": ViewKind(
        "Ops by call stack",
        _ops_by_stack,
        ("name", "call stack", "calls", "self cpu (us)", "self device (us)"),
    ),
    "kernels by launch": ViewKind(
        "Kernels by launch configuration",
        _kernels_by_launch,
        ("kernel", "op", "grid", "block", "calls", "total (us)", "mean occupancy (%)", "tensor cores"),
    ),
    "tensor cores": ViewKind(
        "Tensor cores per op",
        _tensor_cores,
        ("name", "tc eligible", "self kernel (us)", "tc self kernel (us)", "tc self %"),
    ),
}
