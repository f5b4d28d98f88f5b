"""Charts of our own runs: Compare's small multiples with their intervals, and Sweep's curves with their spread."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profiling.charts.timeline import HOVER_NAME, text

LESSON_CHARS = 300  # the compare chart's title: one line on what the comparison shows
TITLE_WIDTH = 46  # characters per title line: plotly never wraps a title, and a 390 px phone shows ~48 of one
TITLE_FONT = 15  # px
REASON_CHARS = 160  # of a stopped or refused run's reason, in hover text
BAR_HEIGHT = 26  # px per run in each compare panel
PANEL_GAP = 60  # px between compare panels: the next panel's title and this one's tick labels
TITLE_LINE = 22  # px per line of a chart's title
MAX_TICKS = 12  # seq_len ticks on a sweep's x axes; more swept values are thinned to every k-th
MiB = 1024**2
# The runs' colours: Plotly's ten, then evenly spaced hues. Neither the guide's grey nor the noisy ring's
# near-black is among them, so every colour on a sweep names one legend entry.
RUN_PALETTE = (
    "#636efa",
    "#ef553b",
    "#00cc96",
    "#ab63fa",
    "#ffa15a",
    "#19d3f3",
    "#ff6692",
    "#b6e880",
    "#ff97ff",
    "#fecb52",
)
GUIDE_COLOR = "#999999"
NOISY_COLOR = "#222222"
NOISY_MARK = "noisy timing (cv > 10%)"
NOT_RUN = "not run here"
COMPARE_PANELS = ("speed-up vs naive (×, 95% CI)", "kernels per forward", "peak memory (MiB)")


def run_colors(runs: list[str]) -> dict[str, str]:
    """One colour per run, distinct for any number of runs (a sweep holds at most sweep.MAX_POINTS)."""
    if len(runs) <= len(RUN_PALETTE):
        return dict(zip(runs, RUN_PALETTE, strict=False))
    return {run: f"hsl({round(360 * i / len(runs))}, 65%, 45%)" for i, run in enumerate(runs)}


def _wrapped(raw: str, limit: int) -> str:
    """`raw` cut to `limit` characters, wrapped at TITLE_WIDTH, each line escaped (`text`)."""
    lines = textwrap.wrap(raw[:limit], TITLE_WIDTH) or [""]
    return "<br>".join(text(line, TITLE_WIDTH) for line in lines)


# --- Compare ----------------------------------------------------------------------------------------------


def compare_chart(rows: list[dict[str, Any]]) -> go.Figure:
    """Small multiples, one metric per axis, one bar per run on a shared run axis: the speed-up over naive with
    its 95% interval as error bars (a bar within noise of naive, or timed noisily, says so), kernels per
    forward, and peak memory. A run that could not run here keeps its row, marked "not run here" with its
    reason on hover. The title is the comparison's one-line lesson.
    """
    from profiling.compare import compare_lesson, row_label

    labels = [row_label(r) for r in rows]
    panel = BAR_HEIGHT * max(1, len(rows))  # px of one panel's plot area
    # Stacked, each panel the page's full width: three side by side leave a phone ~90 px each.
    fig = make_subplots(
        rows=3,
        cols=1,
        subplot_titles=COMPARE_PANELS,
        vertical_spacing=PANEL_GAP / (3 * panel + 2 * PANEL_GAP),
    )
    fig.add_trace(_speedup_bars(rows, labels), row=1, col=1)
    fig.add_trace(_metric_bars(rows, labels, "kernels per forward", _kernels, "{:.0f}"), row=2, col=1)
    fig.add_trace(_metric_bars(rows, labels, "peak memory", _peak_mib, "{:.3f} MiB"), row=3, col=1)
    fig.add_vline(x=1, line_dash="dot", line_color=GUIDE_COLOR, row=1, col=1)
    _mark_not_run(fig, rows, labels)
    lesson = _wrapped(compare_lesson(rows), LESSON_CHARS)
    top = TITLE_LINE * (lesson.count("<br>") + 2) + 30  # the lesson, its note, and the first panel's title
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=labels)
    fig.update_layout(
        title=dict(
            text=f"{lesson}<br><sup>hover for absolute values; the dotted line: naive = 1</sup>",
            yref="container",
            y=1,
            yanchor="top",
            pad=dict(t=18),
            font=dict(size=TITLE_FONT),
        ),
        showlegend=False,
        height=top + 3 * panel + 2 * PANEL_GAP + 30,
        margin=dict(l=10, r=10, t=top, b=30),
    )
    return fig


def _mark_not_run(fig: go.Figure, rows: list[dict[str, Any]], labels: list[str]) -> None:
    """ "not run here" beside each run that could not run, in every panel, its reason on hover (it has no bar)."""
    for axis in ("", "2", "3"):
        for row, label in zip(rows, labels, strict=True):
            if "error" in row:
                fig.add_annotation(
                    x=0,
                    y=label,
                    xref=f"x{axis}",
                    yref=f"y{axis}",
                    text=NOT_RUN,
                    hovertext=_not_run(row),
                    xanchor="left",
                    showarrow=False,
                    font=dict(color="#666666"),
                )


def _kernels(row: dict[str, Any]) -> float | None:
    return row.get("kernels_per_forward")


def _peak_mib(row: dict[str, Any]) -> float | None:
    peak = row.get("peak_memory_bytes")
    return None if peak is None else peak / MiB


def _not_run(row: dict[str, Any]) -> str:
    return f"{NOT_RUN}: {text(row['error'], REASON_CHARS)}"


def _metric_bars(rows: list[dict[str, Any]], labels: list[str], metric: str, value: Any, unit: str) -> go.Bar:
    """One horizontal bar per run of `value(row)`; a run that did not run has none, and says why."""
    values = [None if "error" in r else value(r) for r in rows]
    return go.Bar(
        name=metric,
        orientation="h",
        y=labels,
        x=values,
        text=[NOT_RUN if "error" in r else "" for r in rows],
        textposition="outside",
        hovertext=[
            _not_run(r) if "error" in r else f"{metric}: {unit.format(v)}" if v is not None else f"{metric}: unknown"
            for r, v in zip(rows, values, strict=True)
        ],
        hoverinfo="text+y",
        cliponaxis=False,
    )


def _speedup_bars(rows: list[dict[str, Any]], labels: list[str]) -> go.Bar:
    """The speed-up over naive (`compare.add_speedups`), from `hi` to `lo` of its 95% interval [lo, hi] as error
    bars; hover gives the median and IQR of the run's samples. Rows without a speed-up (summaries made before
    the samples, never through `add_speedups`) show naive's forward time over theirs, with no interval."""
    from profiling.compare import BASELINE, forward_ms, forward_timing

    naive = next((r for r in rows if r.get("variant") == BASELINE and "error" not in r), None)
    xs, plus, minus, marks, hovers = [], [], [], [], []
    for row in rows:
        speedup, ci, timing = row.get("speedup"), row.get("speedup_ci"), forward_timing(row)
        if speedup is None and "error" not in row and naive is not None and forward_ms(naive) and forward_ms(row):
            speedup = forward_ms(naive) / forward_ms(row)
        xs.append(None if "error" in row else speedup)
        plus.append(ci[1] - speedup if ci and speedup else None)
        minus.append(speedup - ci[0] if ci and speedup else None)
        noise = row.get("speedup_status") == "within noise" and row.get("variant") != BASELINE
        noisy = bool(timing and timing.noisy)
        marks.append(
            NOT_RUN if "error" in row else " · ".join(m for m, on in (("within noise", noise), ("noisy", noisy)) if on)
        )
        hovers.append(_not_run(row) if "error" in row else _speedup_hover(row, speedup, ci, timing))
    return go.Bar(
        name="speed-up",
        orientation="h",
        y=labels,
        x=xs,
        error_x=dict(type="data", symmetric=False, array=plus, arrayminus=minus, visible=True),
        text=marks,
        textposition="outside",
        hovertext=hovers,
        hoverinfo="text+y",
        cliponaxis=False,
    )


def _speedup_hover(row: dict[str, Any], speedup: float | None, ci: list[float] | None, timing: Any) -> str:
    from profiling.compare import forward_ms

    hover = f"speed-up: {speedup:.3g}×" if speedup else "speed-up: unknown (no naive run)"
    if ci:
        hover += f" (95% CI {ci[0]:.3g}–{ci[1]:.3g})"
    if timing:
        return (
            f"{hover}<br>forward time: median {timing.median:.3f} ms, IQR {timing.p25:.3f}–{timing.p75:.3f},"
            f" n {len(timing.samples)}, cv {timing.cv:.0%}"
        )
    ms = forward_ms(row)
    return f"{hover}<br>forward time: {ms:.3f} ms" if ms is not None else hover


# --- Sweep ------------------------------------------------------------------------------------------------


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
        go.Scatter(x=xs, y=scale * xs**power, mode="lines", line_dash="dash", line_color=GUIDE_COLOR, name=name),
        row=1,
        col=1,
    )


def _time_trace(done: pd.DataFrame, run: str, color: str) -> go.Scatter:
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
            color=color,
        )
    return go.Scatter(
        x=done["seq_len"],
        y=done["forward_ms"],
        error_y=error_y,
        mode="lines+markers",
        name=run,
        legendgroup=run,
        line_color=color,
        marker_color=color,
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
            marker=dict(symbol="circle-open", size=16, line_width=2, color=NOISY_COLOR),
            name=NOISY_MARK,
            hovertext=[f"{text(run, HOVER_NAME)}: noisy timing" for run in noisy["run"]],
            hoverinfo="text",
        ),
        row=1,
        col=1,
    )


def _add_stop(fig: go.Figure, run: str, done: pd.DataFrame, stopped: pd.DataFrame, color: str) -> None:
    """A stopped run's ×, on its own line at its last point in both panels, its reason on hover; a run stopped
    before its first point has no line to sit on: its legend entry alone says so."""
    reason = f"{text(run, HOVER_NAME)} stopped at seq_len {int(stopped['seq_len'].iloc[0])}: "
    reason += text(stopped["reason"].iloc[0], REASON_CHARS)
    marker = dict(symbol="x", size=12, color=color)
    if done.empty:
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", marker=marker, name=run, legendgroup=run, hovertext=[reason]
            ),
            row=1,
            col=1,
        )
        return
    last = done.iloc[-1]
    for col, y in ((1, last["forward_ms"]), (2, _mib(last["peak_memory_bytes"]))):
        fig.add_trace(
            go.Scatter(
                x=[last["seq_len"]],
                y=[y],
                mode="markers",
                marker=marker,
                name=f"{run} stopped",
                legendgroup=run,
                showlegend=False,
                hovertext=[reason],
                hoverinfo="text",
            ),
            row=1,
            col=col,
        )


def _mib(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value) / MiB


def _seq_ticks(seq_lens: list[int]) -> list[int]:
    """The swept values as ticks, every k-th past MAX_TICKS (the first and last always)."""
    step = -(-len(seq_lens) // MAX_TICKS)
    ticks = seq_lens[::step]
    return ticks if ticks[-1] == seq_lens[-1] else [*ticks, seq_lens[-1]]


def _decade_ticks(fig: go.Figure, values: pd.Series, col: int) -> None:
    """Label a log axis at powers of ten only, where its values span a decade or more: plotly's own labels
    there read "2 5 10 2 5 100", the digits between decades looking like values of their own."""
    usable = pd.to_numeric(values, errors="coerce")
    usable = usable[np.isfinite(usable) & (usable > 0)]
    if len(usable) and usable.max() >= 10 * usable.min():
        fig.update_yaxes(dtick=1, row=1, col=col)


def sweep_chart(rows: list[dict[str, Any]]) -> go.Figure:
    """Forward time (median, IQR error bars, noisy points ringed) and peak memory vs seq_len, log-log, one colour
    per run across both panels, ticks at the swept values, a cost guide (O(S²), or O(q_len·S)) fitted to the
    medians, and a × where a run stopped, at its last point."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("forward time (ms)", "peak memory (MiB)"))
    frame = pd.DataFrame(rows)
    if frame.empty:
        return fig
    runs = [str(run) for run in pd.unique(frame["run"])]
    colors = run_colors(runs)
    for run, group in frame.groupby("run", sort=False):
        run, color = str(run), colors[str(run)]
        done = group[group["status"] == "ok"]
        if len(done):
            fig.add_trace(_time_trace(done, run, color), row=1, col=1)
            fig.add_trace(
                go.Scatter(
                    x=done["seq_len"],
                    y=[_mib(v) for v in done["peak_memory_bytes"]],
                    mode="lines+markers",
                    name=run,
                    legendgroup=run,
                    showlegend=False,
                    line_color=color,
                    marker_color=color,
                ),
                row=1,
                col=2,
            )
        stopped = group[group["status"] == "stopped"]
        if len(stopped):
            _add_stop(fig, run, done, stopped, color)
    ok = frame[frame["status"] == "ok"]
    swept = sorted(int(s) for s in frame["seq_len"].unique())
    if len(ok):
        _add_noisy_marks(fig, ok)
        _add_guide(fig, ok, np.array(swept, dtype=float))  # on to the points that stopped: where the cost was going
    ticks = _seq_ticks(swept)
    fig.update_xaxes(type="log", title="seq_len", tickvals=ticks, ticktext=[str(t) for t in ticks])
    fig.update_yaxes(type="log")
    _decade_ticks(fig, ok["forward_ms"], 1)
    _decade_ticks(fig, ok["peak_memory_bytes"] / MiB, 2)
    fig.update_layout(
        height=460,
        legend=dict(orientation="h", yref="container", yanchor="bottom", y=0, x=0),
        margin=dict(l=10, r=10, t=50, b=90),
    )
    return fig
