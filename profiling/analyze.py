"""Analyze any uploaded trace: the same tables, decoding and insights as our own runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from profiling.insights import Insight, find_insights
from profiling.tables import FORWARD, WindowStats, kernel_table, op_table_from_trace, window_stats
from profiling.trace import Trace, load_trace

STEP = re.compile(r"^ProfilerStep#\d+$")
MAX_ANNOTATIONS = 30
WINDOW_COLUMNS = ["annotation", "count", "cpu (ms)", "device (ms)", "ops/window", "kernels/window", "kernel time (us)"]


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


def _window_row(stats: WindowStats) -> list[Any]:
    return [
        stats.name,
        stats.count,
        round(stats.cpu_ms, 4),
        round(stats.device_ms, 4) if stats.device_ms is not None else None,
        stats.ops_per_window,
        stats.kernels_per_window,
        float(stats.gpu.loc[stats.gpu["cat"] == "kernel", "dur"].sum()),
    ]


def _window_table(trace: Trace, names: list[str]) -> pd.DataFrame:
    return pd.DataFrame([_window_row(window_stats(trace, n)) for n in names], columns=WINDOW_COLUMNS)


def analyze_trace(trace: Trace) -> Analysis:
    annotations = trace.complete[trace.complete["cat"] == "user_annotation"]
    by_time = annotations.groupby("name")["dur"].sum().sort_values(ascending=False)
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
        steps=_window_table(trace, step_names),
        annotations=_window_table(trace, other_names),
        insights=insights,
        summary=summary,
    )


def analyze_file(path: str | Path) -> Analysis:
    """Load and analyze a `.json` or `.json.gz` trace. Raises TraceError for a bad file."""
    return analyze_trace(load_trace(path))
