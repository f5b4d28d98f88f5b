"""Analyze any uploaded trace: the same tables, decoding and insights as our own runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from profiling.insights import Insight, find_insights
from profiling.tables import kernel_table, op_table_from_trace
from profiling.trace import Trace, load_trace
from profiling.windows import FORWARD, WindowStats, annotations, step_table, window_stats, window_table

STEP = re.compile(r"^ProfilerStep#\d+$")
MAX_ANNOTATIONS = 30


@dataclass
class Analysis:
    trace: Trace
    scope: WindowStats
    op_table: pd.DataFrame
    kernel_table: pd.DataFrame
    steps: pd.DataFrame
    annotations: pd.DataFrame
    insights: list[Insight]
    summary: dict[str, Any]


def analyze_trace(trace: Trace) -> Analysis:
    marks = annotations(trace)
    by_time = marks.groupby("name")["dur"].sum().sort_values(ascending=False)
    step_names = sorted((n for n in by_time.index if STEP.match(n)), key=lambda n: int(n.split("#")[1]))
    other_names = [n for n in by_time.index if not STEP.match(n)][:MAX_ANNOTATIONS]
    has_forwards = FORWARD in by_time.index
    scope = window_stats(trace, FORWARD if has_forwards else None)
    kernels = kernel_table(trace, scope if has_forwards else None)
    insights = find_insights(trace, scope, kernels)
    kernel_events = trace.kernels
    summary: dict[str, Any] = {
        "source": trace.source,
        "events": len(trace.events),
        "kernel_events": len(kernel_events),
        "kernel_time_us": float(kernel_events["dur"].sum()),
        "gpu_activity_events": len(trace.gpu_activity),
        "skipped_events": int(trace.skipped),
        "devices": trace.devices,
        "profiler_steps": len(step_names),
        "annotations": len(by_time),
        "forwards": scope.count if has_forwards else 0,
        "kernels_per_forward": scope.kernels_per_window if has_forwards else None,
        "ops_per_forward": scope.ops_per_window if has_forwards else None,
        "insights": [i.text for i in insights],
    }
    return Analysis(
        trace=trace,
        scope=scope,
        op_table=op_table_from_trace(trace),
        kernel_table=kernels,
        steps=step_table(trace, marks[marks["name"].isin(step_names)].sort_values("ts")),
        annotations=window_table(trace, other_names),
        insights=insights,
        summary=summary,
    )


def analyze_file(path: str | Path) -> Analysis:
    """Load and analyze a `.json` or `.json.gz` trace. Raises TraceError for a bad file."""
    return analyze_trace(load_trace(path))
