"""One analysis for every trace: our own runs and uploads go through `analyze(trace, run)`.

It builds every table, insight and summary once; charts and the app only show its results.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from profiling.gc_pause import paused_gc
from profiling.heap_trim import return_freed_heap
from profiling.insights import Insight, find_insights
from profiling.reader import Progress
from profiling.runner import BACKWARD, Measurement
from profiling.step_breakdown import POSITION, is_step_name, profiler_steps, step_breakdown
from profiling.summary import RunSummary, TraceSummary, run_summary, trace_summary
from profiling.tables import kernel_table, op_table_from_trace
from profiling.trace import Trace, load_trace
from profiling.windows import FORWARD, WindowStats, annotations, step_table, window_stats, window_table

MAX_ANNOTATIONS = 30  # annotation names in the annotations table, the longest in total first
MAX_STEPS = 500  # rows of the steps table; the summary still counts every step


@dataclass
class Analysis:
    """Everything shown about one trace."""

    trace: Trace
    forwards: WindowStats | None  # the `attn_fwd` windows, where the trace has them
    # The first MAX_STEPS steps in time order: the ProfilerSteps, or the plugin's step "0" without them
    # (`profiler_steps`), the same steps the breakdown, GPU metrics and idle time use.
    step_windows: pd.DataFrame
    op_table: pd.DataFrame
    kernel_table: pd.DataFrame
    steps: pd.DataFrame
    annotations: pd.DataFrame
    insights: list[Insight]
    summary: RunSummary | TraceSummary


def annotation_names(trace: Trace) -> tuple[pd.Index, list[str]]:
    """Every annotation name, and the MAX_ANNOTATIONS longest in total that are not profiler steps (ties in
    file order). One factorization and no per-name work past those: a trace may hold 160k distinct names."""
    marks = annotations(trace)
    codes, names = pd.factorize(marks["name"].to_numpy())
    named = codes >= 0
    total = np.bincount(codes[named], weights=np.nan_to_num(marks["dur"].to_numpy()[named]), minlength=len(names))
    longest = []
    for name in np.asarray(names, dtype=object)[np.argsort(-total, kind="stable")]:
        if len(longest) == MAX_ANNOTATIONS:
            break
        if not is_step_name(str(name)):
            longest.append(str(name))
    return pd.Index(names), longest


def analyze(trace: Trace, run: Measurement | None = None, progress: Progress | None = None) -> Analysis:
    """Tables, insights and the summary of `trace`; `run` adds what our runner measured beside it."""
    with paused_gc():  # a seventh of the time went to collections that found nothing (profiling/gc_pause.py)
        return _analyze(trace, run, progress)


def _analyze(trace: Trace, run: Measurement | None, progress: Progress | None) -> Analysis:
    report = progress or (lambda fraction, message: None)
    spec = run.spec if run else None
    device = spec.device if spec else None
    # Two threads share the work, each part on the thread that needs it least late: the second thread measures
    # the steps while this one finds the forwards, then makes the kernel table and a trace's insights (which need
    # nothing the tables here make) while this one makes the op and window tables. Their sorts, takes and
    # group-bys let go of the GIL: after a 1 GiB read, 4.1-4.3 s rather than 6.6-7.1 (docs/benchmarks.md). Both
    # only read the trace and fill its caches, each cache with what one function alone makes (a kernel name is
    # decoded once, under kernels.decode's lock).
    with ThreadPoolExecutor(1, thread_name_prefix="analysis") as beside:
        measured = beside.submit(step_breakdown, trace)  # the steps first (`profiler_steps`, kept on the trace)
        names, longest = annotation_names(trace)
        report(0.1, "finding the forwards")
        forwards = window_stats(trace, FORWARD, device) if FORWARD in names else None
        backward = window_stats(trace, BACKWARD, device) if BACKWARD in names else None
        scope = forwards or window_stats(trace, None, device)
        report(0.3, "building the kernel and op tables")
        found = None if run else beside.submit(_kernels_and_insights, trace, forwards, scope, backward)
        ops = op_table_from_trace(trace, with_annotations=run is not None)
        report(0.5, "measuring steps, GPU metrics and idle time")
        breakdown, steps = measured.result(), profiler_steps(trace)
        summary: RunSummary | TraceSummary = (
            run_summary(run, trace, scope, backward, ops)
            if run
            else trace_summary(trace, forwards, len(steps), len(names), breakdown)
        )
        report(0.7, "per-step and per-annotation tables")
        step_windows = steps.head(MAX_STEPS)
        steps_table = with_breakdown(step_table(trace, step_windows), breakdown.per_step)
        annotations_table = window_table(trace, longest)
        report(0.8, "finding insights")
        if found:
            kernels, insights = found.result()
        else:  # a run's insights read its summary, made above
            kernels = kernel_table(trace, forwards)
            insights = find_insights(trace, scope, kernels, spec, summary, backward)
    return_freed_heap()  # what the second thread freed stays in its own arena (profiling/heap_trim.py)
    summary["insights"] = [i.text for i in insights]
    summary["findings"] = [i.record() for i in insights]
    analysis = Analysis(
        trace=trace,
        forwards=forwards,
        step_windows=step_windows,
        op_table=ops,
        kernel_table=kernels,
        steps=steps_table,
        annotations=annotations_table,
        insights=insights,
        summary=summary,
    )
    # The events placed by lane and start serve the window tables just built; dropped, they leave the drawing
    # that follows 12 bytes an aten op and a launch more room (a later view places them again if it asks).
    trace.derived.lane_times.clear()
    return analysis


def _kernels_and_insights(
    trace: Trace, forwards: WindowStats | None, scope: WindowStats, backward: WindowStats | None
) -> tuple[pd.DataFrame, list[Insight]]:
    """A trace's kernel table, and its insights, which read it."""
    kernels = kernel_table(trace, forwards)
    return kernels, find_insights(trace, scope, kernels, None, None, backward)


def with_breakdown(steps: pd.DataFrame, per_step: pd.DataFrame) -> pd.DataFrame:
    """The steps table with each step's plugin-defined time and breakdown (µs) beside it, matched by position."""
    if per_step.empty:
        return steps
    return steps.merge(per_step.drop(columns="step"), on=POSITION, how="left", validate="one_to_one")


READ_SHARE = 0.6  # of a file's analysis progress: streaming it; the analysis takes the rest


def analyze_file(path: str | Path, progress: Progress | None = None, done_at: float = 1.0, **limits: int) -> Analysis:
    """Load and analyze a `.json` or `.json.gz` trace. Raises TraceError for a bad file.

    `progress` hears the bytes read, up to READ_SHARE of the way, then the analysis's stages up to
    `done_at`; `limits` override the reader's (see `load_trace`)."""
    report = progress or (lambda fraction, message: None)
    trace = load_trace(path, lambda f, m: report(READ_SHARE * f, m), **limits)
    return analyze(trace, progress=lambda f, m: report(READ_SHARE + (done_at - READ_SHARE) * f, m))
