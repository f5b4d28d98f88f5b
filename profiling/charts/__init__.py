"""Plotly figures, one module per view; the only package that imports plotly, so the CLI runs without it.

Compute stays in the analysis modules: these only draw what they computed.
"""

from profiling.charts.runs import NOISY_MARK, compare_chart, sweep_chart
from profiling.charts.steps import idle_chart, step_breakdown_chart, step_labels, window_chart
from profiling.charts.timeline import MAX_BARS, MAX_CATEGORIES, MAX_HEIGHT, text, timeline

__all__ = [
    "MAX_BARS",
    "MAX_CATEGORIES",
    "MAX_HEIGHT",
    "NOISY_MARK",
    "compare_chart",
    "idle_chart",
    "step_breakdown_chart",
    "step_labels",
    "sweep_chart",
    "text",
    "timeline",
    "window_chart",
]
