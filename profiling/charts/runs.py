"""Charts of our own runs: Compare's bars with their intervals, and Sweep's curves with their spread."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profiling.charts.timeline import HOVER_NAME, text

LESSON_CHARS = 300  # the compare chart's title: one line on what the comparison shows
COMPARED_METRICS = (
    ("forward time", "ms"),
    ("kernels per forward", ""),
    ("peak memory", "MiB"),
)


def compare_chart(rows: list[dict[str, Any]]) -> go.Figure:
    """Grouped bars, one group per run: forward time, kernels and peak memory, relative to naive.

    The forward time stands at 1 / speed-up with the speed-up's 95% interval as error bars, and a bar within
    noise of naive (or timed noisily) says so; the title is the comparison's one-line lesson.
    """
    from profiling.compare import compare_lesson, forward_ms, row_label

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
        bar = go.Bar(
            name=metric,
            x=labels,
            y=[v / base if base and v is not None else None for v in absolute],
            hovertext=[f"{metric}: {v:.3f} {unit}" if v is not None else "n/a" for v in absolute],
            hoverinfo="text+x",
        )
        if metric == "forward time":
            _add_intervals(bar, ok)
        fig.add_trace(bar)
    lesson = text(compare_lesson(rows), LESSON_CHARS)
    fig.update_layout(
        barmode="group",
        title=f"{lesson}<br><sup>relative to {labels[baseline_at] if ok else 'naive'} (= 1); "
        "hover for absolute values; error bars: the speed-up's 95% interval</sup>",
        yaxis_title="× naive",
        height=440,
        margin=dict(l=10, r=10, t=80, b=40),
    )
    return fig


def _add_intervals(bar: go.Bar, ok: list[dict[str, Any]]) -> None:
    """Rows with samples: forward time relative to naive is 1 / speed-up, from 1 / hi to 1 / lo of the
    speed-up's interval [lo, hi], hover gives the median and IQR, and a bar within noise or noisy says so.
    Rows without (summaries made before the samples) keep `forward_ms` relative to naive's."""
    from profiling.compare import forward_timing

    ys, plus, minus, labels, hovers = list(bar.y), [], [], [], list(bar.hovertext)
    for i, row in enumerate(ok):
        speedup, ci, timing = row.get("speedup"), row.get("speedup_ci"), forward_timing(row)
        if speedup and timing:
            ys[i] = 1 / speedup
            hovers[i] = (
                f"forward time: median {timing.median:.3f} ms, IQR {timing.p25:.3f}–{timing.p75:.3f},"
                f" n {len(timing.samples)}, cv {timing.cv:.0%}"
            )
        plus.append(1 / ci[0] - ys[i] if ci and speedup and ci[0] > 0 else None)
        minus.append(ys[i] - 1 / ci[1] if ci and speedup and ci[1] > 0 else None)
        noise = row.get("speedup_status") == "within noise" and row.get("variant") != "naive"
        marks = ("within noise" if noise else "", "noisy" if timing and timing.noisy else "")
        labels.append(" · ".join(mark for mark in marks if mark))
    bar.update(
        y=ys,
        hovertext=hovers,
        error_y=dict(type="data", symmetric=False, array=plus, arrayminus=minus, visible=True),
        text=labels,
        textposition="outside",
    )


def _add_guide(fig: go.Figure, ok: pd.DataFrame, xs: np.ndarray) -> None:
    """The cost a run should follow: O(S²) when queries grow with the keys, O(q_len·S) when q_len is fixed.

    Its scale is fitted to the first run's medians, least squares in log space with the slope fixed, so one
    noisy point cannot move it the way anchoring it at the first point would.
    """
    first = ok[ok["run"] == ok["run"].iloc[0]]
    fixed_queries = "q_len" in ok and ok["q_len"].nunique() == 1 and ok["q_len"].iloc[0] < ok["seq_len"].max()
    power, name = (1, f"O(q_len·S), q_len={int(ok['q_len'].iloc[0])}") if fixed_queries else (2, "O(S²)")
    seq, ms = first["seq_len"].to_numpy(dtype=float), first["forward_ms"].to_numpy(dtype=float)
    usable = (ms > 0) & np.isfinite(ms)
    if not usable.any():
        return
    scale = np.exp(np.mean(np.log(ms[usable]) - power * np.log(seq[usable])))
    fig.add_trace(
        go.Scatter(x=xs, y=scale * xs**power, mode="lines", line_dash="dash", line_color="#999", name=name),
        row=1,
        col=1,
    )


NOISY_MARK = "noisy timing (cv > 10%)"


def _time_trace(done: pd.DataFrame, run: str) -> go.Scatter:
    """A run's forward-time medians, with the IQR (p25 to p75) as asymmetric error bars where it is known."""
    error_y = None
    if {"forward_ms_p25", "forward_ms_p75"} <= set(done.columns) and done["forward_ms_p25"].notna().any():
        median = done["forward_ms"].astype(float)
        error_y = dict(
            type="data",
            symmetric=False,
            array=(done["forward_ms_p75"].astype(float) - median).tolist(),
            arrayminus=(median - done["forward_ms_p25"].astype(float)).tolist(),
            visible=True,
        )
    return go.Scatter(
        x=done["seq_len"],
        y=done["forward_ms"],
        error_y=error_y,
        mode="lines+markers",
        name=run,
        legendgroup=run,
    )


def _add_noisy_marks(fig: go.Figure, ok: pd.DataFrame) -> None:
    """One legend entry for every noisy point (cv > 10%): an open ring over it."""
    if "noisy" not in ok:
        return
    noisy = ok[ok["noisy"].fillna(False).astype(bool)]
    if noisy.empty:
        return
    fig.add_trace(
        go.Scatter(
            x=noisy["seq_len"],
            y=noisy["forward_ms"],
            mode="markers",
            marker=dict(symbol="circle-open", size=16, line_width=2, color="#d62728"),
            name=NOISY_MARK,
            hovertext=[f"{text(run, HOVER_NAME)}: noisy timing" for run in noisy["run"]],
            hoverinfo="text",
        ),
        row=1,
        col=1,
    )


def sweep_chart(rows: list[dict[str, Any]]) -> go.Figure:
    """Forward time (median, IQR error bars, noisy points ringed) and peak memory vs seq_len, log-log, with a
    cost guide (O(S²), or O(q_len·S)) fitted to the medians, and stop marks."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("forward time (ms)", "peak memory (bytes)"))
    frame = pd.DataFrame(rows)
    if frame.empty:
        return fig
    for run, group in frame.groupby("run", sort=False):
        done = group[group["status"] == "ok"]
        fig.add_trace(_time_trace(done, str(run)), row=1, col=1)
        fig.add_trace(
            go.Scatter(
                x=done["seq_len"],
                y=done["peak_memory_bytes"],
                mode="lines+markers",
                name=str(run),
                legendgroup=str(run),
                showlegend=False,
            ),
            row=1,
            col=2,
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
        _add_noisy_marks(fig, ok)
        _add_guide(fig, ok, np.array(sorted(frame["seq_len"].unique()), dtype=float))
    fig.update_xaxes(type="log", title="seq_len")
    fig.update_yaxes(type="log")
    fig.update_layout(height=420, margin=dict(l=10, r=10, t=50, b=40))
    return fig
