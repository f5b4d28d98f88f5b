"""The memory curve: allocated and reserved bytes over time per device, each device's peak marked.

It draws what `profiling.views` computed (the curve already thinned to `memory_curve.MAX_CURVE_POINTS` points a
series, the peaks from `memory_view`) and computes nothing itself.
"""

from __future__ import annotations

import plotly.graph_objects as go

from profiling.charts.timeline import HOVER_NAME, text
from profiling.views import View

MiB = 2**20
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d")
DASH = {"allocated": "solid", "reserved": "dot"}


def memory_chart(view: View) -> go.Figure | None:
    """The memory view's curve (`views.View` with `curve` and `peaks`), in MiB against ms from the trace's
    start, drawn as steps (the bytes hold until the next event); None for a view without a curve."""
    if view.curve is None or view.peaks is None:
        return None
    fig = go.Figure()
    if view.curve.empty:
        fig.update_layout(title="No memory events with a total to draw", height=200)
        return fig
    colors = {device: PALETTE[i % len(PALETTE)] for i, device in enumerate(view.peaks["device"].tolist())}
    for (device, series), part in view.curve.groupby(["device", "series"], sort=False):
        name = text(f"{device} {series}", HOVER_NAME)
        fig.add_trace(
            go.Scatter(
                x=part["time (ms)"].to_numpy(),
                y=part["bytes"].to_numpy() / MiB,
                customdata=part["bytes"].to_numpy(),
                name=name,
                mode="lines",
                line=dict(shape="hv", color=colors.get(device), dash=DASH.get(series, "solid")),
                hovertemplate=f"{name}<br>%{{x:,.3f}} ms<br>%{{customdata:,.0f}} B<extra></extra>",
            )
        )
    for row in view.peaks.to_dict("records"):
        name = text(f"{row['device']} peak", HOVER_NAME)
        fig.add_trace(
            go.Scatter(
                x=[row["peak time (ms)"]],
                y=[row["peak allocated (B)"] / MiB],
                customdata=[row["peak allocated (B)"]],
                name=name,
                mode="markers+text",
                text=[f"peak {row['peak allocated (B)'] / MiB:,.1f} MiB"],
                textposition="top center",
                marker=dict(symbol="triangle-down", size=12, color=colors.get(row["device"])),
                hovertemplate=f"{name}<br>%{{x:,.3f}} ms<br>%{{customdata:,.0f}} B<extra></extra>",
                showlegend=False,
            )
        )
    fig.update_layout(
        title="memory over time (allocated: solid, reserved: dotted)",
        xaxis_title="time since the trace's start (ms)",
        yaxis_title="MiB",
        height=380,
        margin=dict(l=10, r=10, t=50, b=40),
        legend=dict(orientation="h", yanchor="top", y=-0.2),
    )
    return fig
