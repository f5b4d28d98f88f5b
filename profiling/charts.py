"""Plotly figures. The only module that imports plotly; compute stays in tables/insights.

The timeline draws one lane per CPU thread (ops stacked by depth) and one per GPU stream.
It stays light whatever the trace size: past `MAX_BARS`, events that share a lane, depth
and time bucket are merged into one bar, and the title says how many were merged.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profiling.analysis import Analysis
from profiling.kernels import decode
from profiling.structure import structure
from profiling.trace import GPU_ACTIVITY, Trace
from profiling.windows import FORWARD

MAX_BARS = 3000
MAX_DEPTH = 6  # deeper CPU ops fold into the last row of their lane
MAX_MARKS = 40  # window/step shading shapes
MIN_WIDTH_FRACTION = 2000  # the narrowest bar is this fraction of the whole span
HOVER_NAME = 120  # characters of a name in hover text
HOVER_SHAPES = 120
HOVER_MEANING = 160
MERGED_NAME = 80
FOCUS_PAD = 0.05  # of the first forward's span, on each side
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


def _hover(row: Any) -> str:
    hover = f"<b>{text(row.name, HOVER_NAME)}</b><br>{text(row.cat, HOVER_NAME)} · {row.dur:.1f} µs"
    if isinstance(row.input_dims, list) and row.input_dims:
        hover += f"<br>shapes: {text(row.input_dims, HOVER_SHAPES)}"
    if row.cat == "kernel":
        hover += (
            f"<br>grid {text(row.grid, HOVER_SHAPES)} block {text(row.block, HOVER_SHAPES)} · "
            f"{row.registers:.0f} regs/thread · occupancy {row.occupancy:.0f}%"
            f"<br>{text(decode(str(row.name)).summary, HOVER_MEANING)}"
        )
    if row.cat == "gpu_memcpy" and row.bytes == row.bytes:
        hover += f"<br>{row.bytes:.0f} bytes"
    return hover


TIMELINE_COLUMNS = ("name", "cat", "ts", "end", "dur", "pid", "tid")  # what merged bars are drawn from


def _lanes(events: pd.DataFrame) -> tuple[pd.Series, list[tuple[str, int]]]:
    """Each event's lane label, and the lanes in display order: CPU threads first, then streams.

    Kineto puts device work under the device's pid, with one tid per stream (sync events too),
    so a lane is a GPU lane when its pid is one that ran GPU activity.
    """
    gpu_pids = set(events.loc[events["cat"].isin(GPU_ACTIVITY), "pid"])
    on_gpu = events["pid"].isin(gpu_pids)
    pid, tid = events["pid"].map(lambda v: text(v, HOVER_NAME)), events["tid"].map(lambda v: text(v, HOVER_NAME))
    label = np.where(on_gpu, "GPU " + pid + " stream " + tid, "CPU thread " + tid)
    label = pd.Series(label, index=events.index)
    rows = events.groupby(label)["depth"].max().clip(upper=MAX_DEPTH)
    order = sorted(rows.index, key=lambda lane: (lane.startswith("GPU"), lane))
    return label, [(lane, int(rows[lane]) + 1) for lane in order]


def _merge(events: pd.DataFrame, max_bars: int) -> tuple[pd.DataFrame, int]:
    """Merge events per (lane, depth, time bucket) until at most `max_bars` remain."""
    if len(events) <= max_bars:
        return events.assign(merged=1), 0
    span = float(events["end"].max() - events["ts"].min()) or 1.0
    buckets = max_bars
    while True:
        bucket = ((events["ts"] - events["ts"].min()) / span * buckets).astype(np.int64)
        keys = [events["lane"], events["depth"], bucket]
        groups = events.groupby(keys, sort=False)
        if groups.ngroups <= max_bars or buckets <= 1:
            break
        buckets //= 2
    merged = groups.agg(
        name=("name", "first"),
        cat=("cat", "first"),
        ts=("ts", "min"),
        end=("end", "max"),
        dur=("dur", "sum"),
        merged=("name", "size"),
    ).reset_index(drop=True)
    merged["lane"] = groups["lane"].first().to_numpy()
    merged["depth"] = groups["depth"].first().to_numpy()
    return merged, int(len(events) - len(merged))


def timeline(analysis: Analysis, max_bars: int = MAX_BARS) -> go.Figure:
    """CPU and GPU lanes, colour by category, the first forward (and its GPU work) in view at first."""
    trace = analysis.trace
    ev = _timed_events(trace, max_bars)
    fig = go.Figure()
    if ev.empty:
        fig.update_layout(title="No timed events in this trace")
        return fig
    t0 = float(ev["ts"].min())
    label, lanes = _lanes(ev)
    ev = ev.assign(lane=label)
    base_row, ticks, rows = _lane_rows(lanes)
    # Draw the longest first: with a bar budget, long bars are what a reader needs to see.
    ev = ev.sort_values("dur", ascending=False)
    drawn, merged = _merge(ev, max_bars)
    drawn = drawn.assign(y=drawn["lane"].map(base_row) + drawn["depth"])
    # Microsecond kernels in a seconds-long trace would be invisible: draw at least a sliver
    # (hover still gives the true duration).
    min_width = max(1e-3, float(ev["end"].max() - t0) / MIN_WIDTH_FRACTION)
    _add_bars(fig, drawn, _hovers(ev, drawn, merged), t0, min_width)
    _mark_windows(fig, analysis, t0)
    title = f"{text(trace.source, HOVER_NAME)}: {len(ev):,} events"
    if merged:
        title += f" ({merged:,} merged into {len(drawn):,} bars to stay responsive; the tables keep every event)"
    fig.update_layout(
        title=title,
        barmode="overlay",
        xaxis_title="time since trace start (ms)",
        yaxis=dict(tickvals=[t for t, _ in ticks], ticktext=[n for _, n in ticks], autorange="reversed"),
        height=max(360, 28 * rows + 140),
        legend=dict(title="category", orientation="h", yanchor="bottom", y=1.0, x=0),
        margin=dict(l=10, r=10, t=90, b=40),
    )
    _focus_first_forward(fig, analysis, t0)
    return fig


def _timed_events(trace: Trace, max_bars: int) -> pd.DataFrame:
    """The duration events to draw, with their depth; indexed by their row in `trace.events`.

    Past `max_bars` the bars are merged and their hover text needs only these columns, so a big
    trace is not copied whole (every column of millions of events, then sorted) to draw 3,000 bars.
    """
    rows = trace.complete_rows
    names, categories = trace.events["name"].to_numpy()[rows], trace.complete_column("cat")
    # "Trace" is the profiler's own span over everything: it would only hide the rest.
    rows = rows[(names != "") & (categories != "Trace")]
    if len(rows) <= max_bars:
        ev = trace.events.iloc[rows]
    else:
        ev = pd.DataFrame({c: trace.events[c].to_numpy()[rows] for c in TIMELINE_COLUMNS}, index=rows)
    return ev.assign(depth=np.clip(structure(trace).depth[rows], 0, MAX_DEPTH))


def _lane_rows(lanes: list[tuple[str, int]]) -> tuple[dict[str, int], list[tuple[int, str]], int]:
    """Each lane's first row, the axis ticks, and the rows in all (a blank row between lanes)."""
    base_row, ticks, row = {}, [], 0
    for lane, depth in lanes:
        base_row[lane] = row
        ticks.append((row, lane))
        row += depth + 1
    return base_row, ticks, row


def _hovers(ev: pd.DataFrame, drawn: pd.DataFrame, merged: int) -> pd.Series:
    exact = drawn["merged"] == 1
    hover = pd.Series("", index=drawn.index)
    if exact.any():
        hover[exact] = (
            [_hover(r) for r in ev.loc[drawn.index[exact]].itertuples()]
            if merged == 0
            else [
                f"<b>{text(n, HOVER_NAME)}</b><br>{text(c, HOVER_NAME)} · {d:.1f} µs"
                for n, c, d in zip(drawn["name"][exact], drawn["cat"][exact], drawn["dur"][exact], strict=True)
            ]
        )
    hover[~exact] = [
        f"<b>{k} events merged</b> (first: {text(n, MERGED_NAME)})<br>{text(c, HOVER_NAME)} · {d:.1f} µs busy"
        for k, n, c, d in zip(
            drawn["merged"][~exact], drawn["name"][~exact], drawn["cat"][~exact], drawn["dur"][~exact], strict=True
        )
    ]
    return hover


def _add_bars(fig: go.Figure, drawn: pd.DataFrame, hover: pd.Series, t0: float, min_width: float) -> None:
    for cat, group in drawn.groupby("cat", sort=False):
        fig.add_trace(
            go.Bar(
                name=text(cat, HOVER_NAME) or "other",
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


def _focus_first_forward(fig: go.Figure, analysis: Analysis, t0: float) -> None:
    forwards = analysis.forwards
    if forwards is None or forwards.windows.empty:
        return
    first = forwards.windows.iloc[0]
    # Kernels run after their launches: keep the first forward's GPU work in view too.
    launched = forwards.gpu.loc[forwards.gpu["window"] == 0, "end"] if len(forwards.gpu) else pd.Series(dtype=float)
    stop = max(first["end"], launched.max()) if len(launched) else first["end"]
    pad = FOCUS_PAD * (stop - first["ts"])
    fig.update_xaxes(range=[(first["ts"] - t0 - pad) / 1e3, (stop - t0 + pad) / 1e3])


def _mark_windows(fig: go.Figure, analysis: Analysis, t0: float) -> None:
    """Shade `attn_fwd` windows and outline profiler steps (a bounded number of shapes)."""
    forwards = analysis.forwards.windows.head(MAX_MARKS) if analysis.forwards else []
    for r in forwards.itertuples() if len(forwards) else ():
        fig.add_vrect(
            x0=(r.ts - t0) / 1e3,
            x1=(r.end - t0) / 1e3,
            fillcolor="#ffd54f",
            opacity=0.15,
            line_width=0,
            annotation_text=FORWARD,
            annotation_position="top left",
        )
    for r in analysis.step_windows.head(MAX_MARKS).itertuples():
        fig.add_vline(
            x=(r.ts - t0) / 1e3,
            line_dash="dot",
            line_color="#616161",
            annotation_text=text(r.name, HOVER_NAME),
            annotation_position="bottom right",
        )


COMPARED_METRICS = (
    ("forward time", "ms"),
    ("kernels per forward", ""),
    ("peak memory", "MiB"),
)


def compare_chart(rows: list[dict[str, Any]]) -> go.Figure:
    """Grouped bars, one group per run: forward time, kernels and peak memory, relative to naive."""
    from profiling.compare import forward_ms, row_label

    ok = [r for r in rows if "error" not in r]
    labels = [row_label(r) for r in ok]
    values = {
        "forward time": [forward_ms(r) for r in ok],
        "kernels per forward": [r["kernels_per_forward"] for r in ok],
        "peak memory": [r["peak_memory_bytes"] / 1024**2 for r in ok],
    }
    baseline_at = next((i for i, r in enumerate(ok) if r.get("variant") == "naive"), 0)
    fig = go.Figure()
    for metric, unit in COMPARED_METRICS:
        absolute = values[metric]
        base = absolute[baseline_at] if ok and absolute[baseline_at] else None
        fig.add_trace(
            go.Bar(
                name=metric,
                x=labels,
                y=[v / base if base and v is not None else None for v in absolute],
                hovertext=[f"{metric}: {v:.3f} {unit}" if v is not None else "n/a" for v in absolute],
                hoverinfo="text+x",
            )
        )
    fig.update_layout(
        barmode="group",
        title=f"relative to {labels[baseline_at] if ok else 'naive'} (= 1); hover for absolute values",
        yaxis_title="× naive",
        height=420,
        margin=dict(l=10, r=10, t=60, b=40),
    )
    return fig


def window_chart(steps: pd.DataFrame) -> go.Figure:
    """Per profiler step: CPU and device time, side by side."""
    fig = go.Figure()
    if steps.empty:
        fig.update_layout(title="No ProfilerStep#N annotations in this trace")
        return fig
    fig.add_trace(go.Bar(name="cpu (ms)", x=steps["step"], y=steps["cpu (ms)"]))
    if steps["device (ms)"].notna().any():
        fig.add_trace(go.Bar(name="device (ms)", x=steps["step"], y=steps["device (ms)"]))
    fig.update_layout(barmode="group", title="per profiler step", height=320, margin=dict(l=10, r=10, t=50, b=40))
    return fig


def _add_guide(fig: go.Figure, ok: pd.DataFrame, xs: np.ndarray) -> None:
    """The cost a run should follow: O(S²) when queries grow with the keys, O(q_len·S) when q_len is fixed."""
    s0, t_first = ok["seq_len"].iloc[0], ok["forward_ms"].iloc[0]
    fixed_queries = "q_len" in ok and ok["q_len"].nunique() == 1 and ok["q_len"].iloc[0] < ok["seq_len"].max()
    power, name = (1, f"O(q_len·S), q_len={int(ok['q_len'].iloc[0])}") if fixed_queries else (2, "O(S²)")
    fig.add_trace(
        go.Scatter(x=xs, y=t_first * (xs / s0) ** power, mode="lines", line_dash="dash", line_color="#999", name=name),
        row=1,
        col=1,
    )


def sweep_chart(rows: list[dict[str, Any]]) -> go.Figure:
    """Forward time and peak memory vs seq_len, log-log, with a cost guide (O(S²), or O(q_len·S)) and stop marks."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("forward time (ms)", "peak memory (bytes)"))
    frame = pd.DataFrame(rows)
    if frame.empty:
        return fig
    for run, group in frame.groupby("run", sort=False):
        done = group[group["status"] == "ok"]
        for col, key in ((1, "forward_ms"), (2, "peak_memory_bytes")):
            fig.add_trace(
                go.Scatter(
                    x=done["seq_len"],
                    y=done[key],
                    mode="lines+markers",
                    name=str(run),
                    legendgroup=str(run),
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
        stopped = group[group["status"] == "stopped"]
        if len(stopped) and len(done):
            fig.add_trace(
                go.Scatter(
                    x=stopped["seq_len"],
                    y=[done["forward_ms"].iloc[-1]] * len(stopped),
                    mode="markers",
                    marker_symbol="x",
                    marker_size=12,
                    name=f"{run} stopped",
                    legendgroup=str(run),
                    hovertext=stopped["reason"],
                    hoverinfo="text",
                ),
                row=1,
                col=1,
            )
    ok = frame[frame["status"] == "ok"]
    if len(ok):
        _add_guide(fig, ok, np.array(sorted(frame["seq_len"].unique()), dtype=float))
    fig.update_xaxes(type="log", title="seq_len")
    fig.update_yaxes(type="log")
    fig.update_layout(height=420, margin=dict(l=10, r=10, t=50, b=40))
    return fig


BREAKDOWN_COLORS = {
    "kernel": "#54a24b",
    "memcpy": "#b279a2",
    "memset": "#ff9da6",
    "communication": "#9d755d",
    "runtime": "#f58518",
    "dataloader": "#eeca3b",
    "cpu_exec": "#4c78a8",
    "other": "#bab0ac",
}
AVERAGE = "average"


def step_breakdown_chart(steps: pd.DataFrame) -> go.Figure:
    """One stacked bar per step, and one for the average: where each step's time went (µs)."""
    fig = go.Figure()
    roles = [r for r in BREAKDOWN_COLORS if f"{r} (us)" in steps.columns]
    if steps.empty or not roles:
        fig.update_layout(title="No profiler steps to break down", height=200)
        return fig
    labels = [*map(str, steps["step"]), AVERAGE]
    for role in roles:
        values = steps[f"{role} (us)"].astype(float)
        fig.add_trace(
            go.Bar(name=role, x=labels, y=[*values.tolist(), float(values.mean())], marker_color=BREAKDOWN_COLORS[role])
        )
    fig.update_layout(
        barmode="stack", title="step time breakdown (µs)", height=360, margin=dict(l=10, r=10, t=50, b=40)
    )
    return fig


IDLE_COLORS = {"host_wait": "#f58518", "kernel_wait": "#54a24b", "other": "#bab0ac"}


def idle_chart(idle_breakdown_us: dict[str, dict[str, float]] | None) -> go.Figure:
    """Per stream, the GPU's idle time split by cause (HTA's definitions)."""
    fig = go.Figure()
    if not idle_breakdown_us:
        fig.update_layout(title="No GPU streams to break down", height=200)
        return fig
    streams = [text(s, HOVER_NAME) for s in idle_breakdown_us]
    for cause, color in IDLE_COLORS.items():
        fig.add_trace(
            go.Bar(
                name=cause,
                x=streams,
                y=[float(v.get(cause, 0.0)) for v in idle_breakdown_us.values()],
                marker_color=color,
            )
        )
    fig.update_layout(
        barmode="stack",
        title="GPU idle time per stream (µs), by cause",
        height=320,
        margin=dict(l=10, r=10, t=50, b=40),
    )
    return fig
