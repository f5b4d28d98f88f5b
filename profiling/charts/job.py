"""Charts of a whole job (profiling/job/distributed.py computes them): each rank's mean step split into its
four parts, and each rank's step time over the steps."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from profiling.charts.timeline import HOVER_NAME, text

# The parts of a rank's mean step (µs), as the TensorBoard plugin's distributed view names and colours them.
RANK_PARTS = {
    "computation": ("computation", "#4c78a8"),
    "communication": ("communication not overlapped", "#e45756"),
    "overlap": ("overlap", "#f2cf5b"),
    "other": ("other", "#bab0ac"),
}
MARGIN = dict(l=10, r=10, t=50, b=40)


def rank_breakdown_chart(per_rank: pd.DataFrame) -> go.Figure:
    """Per rank: its mean step's computation, communication not overlapped, overlap and other, stacked (ms)."""
    fig = go.Figure()
    if per_rank.empty:
        fig.update_layout(title="No rank could be read", height=320, margin=MARGIN)
        return fig
    labels = [f"rank {int(r)}" for r in per_rank["rank"]]
    for column, (name, color) in RANK_PARTS.items():
        fig.add_trace(go.Bar(name=name, x=labels, y=per_rank[column] / 1000.0, marker_color=color))
    fig.update_layout(
        barmode="stack",
        title="mean step per rank",
        yaxis_title="ms",
        height=360,
        margin=MARGIN,
        legend=dict(orientation="h"),
    )
    return fig


def rank_steps_chart(per_step: pd.DataFrame) -> go.Figure:
    """Each rank's step time (ms) over its steps, one line per rank; the x axis counts steps from 0 (names
    differ between ranks that started profiling at different steps), the hover shows each step's name."""
    fig = go.Figure()
    if per_step.empty:
        fig.update_layout(title="No steps in the ranks that were read", height=320, margin=MARGIN)
        return fig
    for rank, steps in per_step.groupby("rank", sort=True):
        fig.add_trace(
            go.Scatter(
                name=f"rank {int(rank)}",
                x=list(range(len(steps))),
                y=steps["step_us"] / 1000.0,
                mode="lines+markers",
                text=[text(s, HOVER_NAME) for s in steps["step"]],
                hovertemplate="%{text}: %{y:.3f} ms",
            )
        )
    fig.update_layout(title="step time per rank", xaxis_title="step", yaxis_title="ms", height=360, margin=MARGIN)
    return fig
