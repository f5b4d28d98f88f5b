"""Charts of a trace's steps: each step's time, its breakdown by role, and each stream's idle time."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from profiling.charts.timeline import HOVER_NAME, text
from profiling.step_breakdown import POSITION


def step_labels(steps: pd.DataFrame) -> list[str]:
    """The steps' names as axis labels; where a name repeats, each step's position too, so that bars of
    different steps do not fall into one category. (Step names are `ProfilerStep#<digits>`: no markup.)"""
    names = steps["step"].astype(str)
    if names.is_unique or POSITION not in steps:
        return names.tolist()
    return [f"{name} @{position}" for name, position in zip(names, steps[POSITION], strict=True)]


def window_chart(steps: pd.DataFrame) -> go.Figure:
    """Per profiler step: CPU and device time, side by side."""
    fig = go.Figure()
    if steps.empty:
        fig.update_layout(title="No ProfilerStep#N annotations in this trace")
        return fig
    labels = step_labels(steps)
    fig.add_trace(go.Bar(name="cpu (ms)", x=labels, y=steps["cpu (ms)"]))
    if steps["device (ms)"].notna().any():
        fig.add_trace(go.Bar(name="device (ms)", x=labels, y=steps["device (ms)"]))
    fig.update_layout(barmode="group", title="per profiler step", height=320, margin=dict(l=10, r=10, t=50, b=40))
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
    labels = [*step_labels(steps), AVERAGE]
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
