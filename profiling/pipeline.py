"""Measure, then analyze: one profiled run from spec to tables, insights and summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

import attention
from attention import AttentionSpec
from profiling.analysis import Analysis, analyze
from profiling.insights import Insight
from profiling.run_time import refuse_if_too_long
from profiling.runner import Measurement, Progress, measure
from profiling.summary import RunSummary
from profiling.trace import Trace, load_trace
from profiling.worker import Worker, default_worker

MEASURE_SHARE = 0.85  # of the progress bar; the analysis takes the rest


@dataclass
class RunResult:
    """A run's measurement and the analysis of its trace."""

    measurement: Measurement
    analysis: Analysis

    @property
    def spec(self) -> AttentionSpec:
        return self.measurement.spec

    @property
    def trace(self) -> Trace:
        return self.analysis.trace

    @property
    def summary(self) -> RunSummary:
        return self.analysis.summary  # type: ignore[return-value]

    @property
    def insights(self) -> list[Insight]:
        return self.analysis.insights

    @property
    def op_table(self) -> pd.DataFrame:
        return self.analysis.op_table

    @property
    def kernel_table(self) -> pd.DataFrame:
        return self.analysis.kernel_table

    @property
    def trace_path(self) -> Path:
        return self.measurement.trace_path

    @property
    def table_path(self) -> Path:
        return self.measurement.table_path


def profile_attention(
    spec: AttentionSpec,
    trace_dir: str | Path,
    progress: Progress | None = None,
    time_limit_s: float | None = None,
    cancelled: Callable[[], bool] | None = None,
    worker: Worker | None = None,
) -> RunResult:
    """Profile `spec` (see `runner.measure`) in the worker process, then analyze the trace it wrote.

    A run that does not fit the machine's memory budget beside the analyses in progress (SpecError),
    or is estimated to take longer than `time_limit_s` (RunError with the estimate), is refused before
    it starts. The worker is killed, and RunError raised, when the measurement passes `time_limit_s` or as soon
    as `cancelled()` is true (the client left); the analysis, bounded by the trace's small size, runs here.
    """
    report = progress or (lambda fraction, message: None)
    # The run's estimated peak is held in the machine's one budget (beside analyses) while it measures.
    with attention.admit_run(spec, cancelled=cancelled):
        refuse_if_too_long(spec, time_limit_s)
        measured = (worker or default_worker()).call(
            measure,
            spec,
            Path(trace_dir),
            time_limit_s=time_limit_s,
            progress=lambda f, m: report(MEASURE_SHARE * f, m),
            cancelled=cancelled,
            private=spec,  # its first call, timed cold, must not be another session's
        )
    report(MEASURE_SHARE, "reading the trace")
    analysis = analyze(
        load_trace(measured.trace_path),
        measured,
        lambda f, m: report(MEASURE_SHARE + (1 - MEASURE_SHARE) * f, m),
    )
    report(1.0, "done")
    return RunResult(measured, analysis)
