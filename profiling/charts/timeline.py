"""The timeline of a trace: every event as a bar in its lane.

The timeline draws the bars and lanes `profiling/lanes.py` chooses (at most `lanes.MAX_LANES` lanes and
`MAX_BARS` bars, merged past them); here its hover text is cut to a budget, and the title says what was
merged.
"""

from __future__ import annotations

import html
import json
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from profiling.analysis import Analysis
from profiling.kernels import decode
from profiling.lanes import Lanes, assign_lanes, lane_rows, merge, timed_events
from profiling.trace import Trace
from profiling.windows import FORWARD

MAX_BARS = 3000
MAX_MARKS = 40  # window/step shading shapes
MIN_WIDTH_FRACTION = 2000  # the narrowest bar is this fraction of the whole span
HOVER_NAME = 120  # characters of a name in hover text
TITLE_NAME = 48  # characters of the trace's file name in the title
HOVER_SHAPES = 120
HOVER_MEANING = 160
MERGED_NAME = 80
LANE_NAME = 120  # characters of a lane's label
MIN_CUT = 8  # the shortest a name is cut to, however tight the hover budget
MAX_CATEGORIES = 12  # legend entries, the commonest categories; the rest share one
OTHER_CATEGORIES = "other categories"
ROW_HEIGHT = 28  # px per row of a lane
MAX_HEIGHT = 6000  # px; past it the rows get thinner
HOVER_BUDGET = 600_000  # bytes of hover text in the figure's JSON, so that the figure stays under 1 MB
# Tried in turn until the hover text fits HOVER_BUDGET: (share of each name's limit, whether to give the details).
HOVER_LEVELS = ((1.0, True), (0.25, True), (0.0625, False))
FOCUS_PAD = 0.05  # of the first forward's span, on each side
LEGEND_HEIGHT = 60  # px below the x axis for the category legend (a phone wraps it over 3-4 lines)
COLORS = {
    "user_annotation": "#9e9e9e",
    "cpu_op": "#4c78a8",
    "python_function": "#72b7b2",
    "cuda_runtime": "#f58518",
    "cuda_driver": "#e45756",
    "kernel": "#54a24b",
    "gpu_memcpy": "#b279a2",
    "gpu_memset": "#ff9da6",
    "gpu_user_annotation": "#bab0ac",
}
OTHER_COLOR = "#bbbbbb"


def text(value: Any, limit: int) -> str:
    """A trace's string as plotly text: cut, then HTML-escaped (plotly renders a subset of HTML).

    `foo<float>` shows as written; a name carrying `<a href=…>` shows as characters, not a link.
    """
    raw = str(value)
    return html.escape(raw if len(raw) <= limit else raw[: limit - 1] + "…")


def _cut(limit: int, scale: float) -> int:
    return max(MIN_CUT, int(limit * scale))


def _hover(row: Any, scale: float, full: bool) -> str:
    """One event's hover text; `scale` shortens every name, and without `full` only its name, category and time."""
    hover = (
        f"<b>{text(row.name, _cut(HOVER_NAME, scale))}</b><br>{text(row.cat, _cut(HOVER_NAME, scale))}"
        f" · {row.dur:.1f} µs"
    )
    if not full:
        return hover
    shapes = _cut(HOVER_SHAPES, scale)
    if isinstance(row.input_dims, list) and row.input_dims:
        hover += f"<br>shapes: {text(row.input_dims, shapes)}"
    if row.cat == "kernel":
        hover += (
            f"<br>grid {text(row.grid, shapes)} block {text(row.block, shapes)} · "
            f"{row.registers:.0f} regs/thread · occupancy {row.occupancy:.0f}%"
            f"<br>{text(decode(str(row.name)).summary, _cut(HOVER_MEANING, scale))}"
        )
    if row.cat == "gpu_memcpy" and row.bytes == row.bytes:
        hover += f"<br>{row.bytes:.0f} bytes"
    return hover


def timeline(analysis: Analysis, max_bars: int = MAX_BARS) -> go.Figure:
    """CPU and GPU lanes, colour by category, the first forward (and its GPU work) in view at first.

    Bounded whatever the trace: at most MAX_LANES lanes and an "others" lane, `max_bars` bars
    (when the lanes and depths alone fit), HOVER_BUDGET bytes of hover text and MAX_HEIGHT pixels.
    """
    trace = analysis.trace
    ev = timed_events(trace, max_bars)
    fig = go.Figure()
    if ev.empty:
        fig.update_layout(title="No timed events in this trace")
        return fig
    t0 = float(ev["ts"].min())
    ev, lanes = assign_lanes(trace, ev)
    base_row, rows = lane_rows(lanes.rows)
    ev = ev.drop(columns=["pid", "tid"])  # `lane` and `origin` stand for them
    focus = focus_range(analysis)
    drawn, merged = merge(ev, max_bars, focus)
    drawn = drawn.assign(y=base_row[drawn["lane"].to_numpy()] + drawn["depth"].to_numpy())
    # Microsecond kernels in a seconds-long trace would be invisible: draw at least a sliver
    # (hover still gives the true duration).
    min_width = max(1e-3, float(ev["end"].max() - t0) / MIN_WIDTH_FRACTION)
    # Only a trace small enough to be drawn whole kept every column (`timed_events`) for the full hover.
    _add_bars(fig, drawn, _hovers(drawn, lanes, detailed=len(ev) <= max_bars), t0, min_width)
    _mark_windows(fig, analysis, t0)
    fig.update_layout(
        title=_title(trace, len(ev), len(drawn), merged, lanes),
        barmode="overlay",
        xaxis_title="time since trace start (ms)",
        yaxis=dict(
            tickvals=base_row.tolist(), ticktext=[text(n, LANE_NAME) for n in lanes.names], autorange="reversed"
        ),
        height=min(MAX_HEIGHT, max(360, ROW_HEIGHT * rows + 140)) + LEGEND_HEIGHT,
        # Below the plot, across: above it, a phone's narrow width wraps it over the title.
        legend=dict(
            title=dict(text="category", side="top left"),
            orientation="h",
            xref="container",
            yref="container",
            yanchor="bottom",
            y=0,
            x=0,
        ),
        margin=dict(l=10, r=10, t=90, b=40 + LEGEND_HEIGHT),
    )
    if focus is not None:
        fig.update_xaxes(range=[(focus[0] - t0) / 1e3, (focus[1] - t0) / 1e3])
    return fig


def _title(trace: Trace, events: int, bars: int, merged: int, lanes: Lanes) -> str:
    """The trace and its event count, then one short line per note: plotly never wraps a title, and a phone
    shows ~50 characters of one."""
    title = f"{events:,} events<br><sup>{text(trace.source, TITLE_NAME)}</sup>"
    if merged:
        title += f"<br><sup>{merged:,} merged into {bars:,} bars; the tables keep every event</sup>"
    if lanes.others is not None:
        title += f"<br><sup>the {lanes.merged:,} quietest of {len(lanes.labels):,} lanes share the last</sup>"
    return title


def _hovers(drawn: pd.DataFrame, lanes: Lanes, detailed: bool) -> pd.Series:
    """Hover text per bar, indexed as `drawn`; names cut shorter, then details dropped, until it fits HOVER_BUDGET.

    The budget is counted as JSON writes it (`&quot;` or `\\u20ac` for one character of a name).
    """
    for scale, full in HOVER_LEVELS:
        hover = _hover_texts(drawn, lanes, scale, full and detailed)
        if sum(len(json.dumps(h)) for h in hover) <= HOVER_BUDGET:
            break
    return pd.Series(hover, index=drawn.index)


def _hover_texts(drawn: pd.DataFrame, lanes: Lanes, scale: float, full: bool) -> list[str]:
    name, lane = _cut(MERGED_NAME, scale), _cut(LANE_NAME, scale)
    texts = []
    for row in drawn.itertuples():
        if row.merged == 1:
            hover = _hover(row, scale, full)
        else:
            hover = (
                f"<b>{row.merged} events merged</b> (first: {text(row.name, name)})"
                f"<br>{text(row.cat, _cut(HOVER_NAME, scale))} · {row.dur:.1f} µs busy"
            )
        if row.lane == lanes.others:  # say whose event it is: the lane's label no longer does
            hover += f"<br>{'first ' if row.merged > 1 else ''}on {text(lanes.labels[row.origin], lane)}"
        texts.append(hover)
    return texts


def _add_bars(fig: go.Figure, drawn: pd.DataFrame, hover: pd.Series, t0: float, min_width: float) -> None:
    """One plotly trace per category, the MAX_CATEGORIES commonest; the rest share one (a trace per name of a
    hostile trace's thousands of categories would be thousands of legend entries)."""
    cats = drawn["cat"].astype(str)
    shown = cats.value_counts().index[:MAX_CATEGORIES]
    legend = np.where(cats.isin(shown), pd.Index(shown).get_indexer(cats), len(shown))
    for code, group in drawn.groupby(legend, sort=False):
        cat = shown[code] if code < len(shown) else None
        fig.add_trace(
            go.Bar(
                name=(text(cat, HOVER_NAME) or "other") if cat is not None else OTHER_CATEGORIES,
                base=((group["ts"] - t0) / 1e3).round(4).tolist(),
                x=((group["end"] - group["ts"]).clip(lower=min_width) / 1e3).round(4).tolist(),
                y=group["y"].tolist(),
                orientation="h",
                marker_color=COLORS.get(str(cat), OTHER_COLOR),
                hovertext=hover[group.index].tolist(),
                hoverinfo="text",
                width=0.8,
            )
        )


def focus_range(analysis: Analysis) -> tuple[float, float] | None:
    """The initial view, in the trace's µs: the first forward and the GPU work it launched (kernels run after
    their launches), padded by FOCUS_PAD of its span on each side; None where the trace has no forward."""
    forwards = analysis.forwards
    if forwards is None or forwards.windows.empty:
        return None
    first = forwards.windows.iloc[0]
    launched = forwards.gpu.loc[forwards.gpu["window"] == 0, "end"] if len(forwards.gpu) else pd.Series(dtype=float)
    stop = max(first["end"], launched.max()) if len(launched) else first["end"]
    pad = FOCUS_PAD * (stop - first["ts"])
    return float(first["ts"] - pad), float(stop + pad)


def _mark_windows(fig: go.Figure, analysis: Analysis, t0: float) -> None:
    """Shade `attn_fwd` windows and outline profiler steps (a bounded number of shapes).

    The shapes and their labels are set once: plotly's add_vrect/add_vline validate every shape
    already there on each call, 4 s for 40 windows.
    """
    span = dict(xref="x", yref="y domain", y0=0, y1=1)
    label = dict(xref="x", yref="y domain", showarrow=False, xanchor="left")
    shapes, labels = [], []
    forwards = analysis.forwards.windows.head(MAX_MARKS) if analysis.forwards else None
    for start, stop in zip(*_ms(forwards, t0), strict=True) if forwards is not None else ():
        shapes.append(span | dict(type="rect", x0=start, x1=stop, fillcolor="#ffd54f", opacity=0.15, line_width=0))
        labels.append(label | dict(x=start, y=1, yanchor="top", text=FORWARD))
    steps = analysis.step_windows.head(MAX_MARKS)
    for start, name in zip(_ms(steps, t0)[0], steps["name"], strict=True):
        shapes.append(span | dict(type="line", x0=start, x1=start, line=dict(dash="dot", color="#616161")))
        labels.append(label | dict(x=start, y=0, yanchor="bottom", text=text(name, HOVER_NAME)))
    if shapes:
        fig.update_layout(shapes=shapes, annotations=labels)


def _ms(windows: pd.DataFrame, t0: float) -> tuple[list[float], list[float]]:
    """Start and end of each window in ms since `t0`."""
    return ((windows["ts"] - t0) / 1e3).tolist(), ((windows["end"] - t0) / 1e3).tolist()
