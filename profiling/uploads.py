"""An uploaded trace analysed on a shared server: admitted to memory, in a killable process, bounded in time.

    outputs = analyze_upload(path, time_limit_s=300, progress=report, cancelled=gone)

The analysis runs in a process of its own (forked from the worker's forkserver), because a hostile
trace can make any stage slow and only a process can be stopped anywhere: at the time limit, or
when the caller leaves, it is killed, and it gives all its memory back to the OS when it ends.
It sends back only what the page shows: the summary, tables cut to `MAX_TABLE_ROWS` rows, and the
charts as plotly JSON (the timeline is at most `charts.MAX_BARS` bars in `lanes.MAX_LANES` lanes and
one "others" lane). The memory it may use is admitted first, in this process, against the one budget
every analysis shares: a charge from the JSON's bytes and objects before the read, grown once the trace is
read to what its events need (`admission.analysis_need_bytes`), asked for by the analysis process.

With the worker off (`ATTENTION_PROFILER_WORKER=0`, the default on ZeroGPU) the analysis runs here,
and the limit and `cancelled` are checked at each chunk read and each stage.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from profiling.admission import PEAK_PER_ROW, TopUp, analysis_cost, analysis_gate, charged_reads
from profiling.reader import Progress, TraceError
from profiling.worker import Cancelled, Worker, death_cause

TIME_LIMIT_ENV = "ATTENTION_PROFILER_ANALYZE_TIME_LIMIT"
DEFAULT_TIME_LIMIT_S = 300.0
ANALYSED = 0.9  # of the progress bar: reading and analysing the file; drawing its outputs takes the rest
MAX_TABLE_ROWS = 1000  # rows of the op and kernel tables sent to the page, the largest totals first


class AnalysisStopped(TraceError):
    """The analysis passed its time limit, or its caller left."""


@dataclass(frozen=True)
class UploadOutputs:
    """What the Analyze tab shows, small enough to pickle back from the analysis process."""

    summary: dict[str, Any]
    op_table: pd.DataFrame
    kernel_table: pd.DataFrame
    timeline_json: str  # plotly figure JSON
    steps: pd.DataFrame
    annotations: pd.DataFrame
    insights_markdown: str
    steps_chart_json: str


class AnalysisWorker(Worker):
    """A worker for one analysis: recycled after its call (its memory goes back to the OS), with errors
    worded for a trace."""

    def __init__(self) -> None:
        super().__init__(recycle_rss_bytes=0)

    def limit_error(self, limit_s: float, stage: str) -> Exception:
        return AnalysisStopped(
            f"trace: the analysis passed its {limit_s:g} s limit while {stage}; try a trace with fewer steps"
        )

    def death_error(self, exitcode: int | None, stage: str) -> Exception:
        return AnalysisStopped(f"trace: the analysis process died ({death_cause(exitcode)}) while {stage}")


def analyze_time_limit_s() -> float:
    """`ATTENTION_PROFILER_ANALYZE_TIME_LIMIT` seconds, else DEFAULT_TIME_LIMIT_S."""
    value = os.environ.get(TIME_LIMIT_ENV, "")
    try:
        limit = float(value) if value else DEFAULT_TIME_LIMIT_S
    except ValueError:
        raise ValueError(f"{TIME_LIMIT_ENV}: give a number of seconds, got {value[:100]!r}") from None
    if not limit > 0:
        raise ValueError(f"{TIME_LIMIT_ENV}: give a positive number of seconds, got {value[:100]!r}")
    return limit


def upload_outputs(path: str, limits: dict[str, int], progress: Progress | None = None) -> UploadOutputs:
    """Load, analyse and draw the trace at `path`: the page's outputs (runs in the analysis process)."""
    from profiling.analysis import analyze_file
    from profiling.charts import timeline, window_chart
    from profiling.markdown import insights_markdown
    from profiling.tables import rounded

    report = progress or (lambda fraction, message: None)
    result = analyze_file(path, report, done_at=ANALYSED, **limits)
    report(0.95, "drawing the timeline")
    return UploadOutputs(
        summary=dict(result.summary),
        op_table=rounded(result.op_table.head(MAX_TABLE_ROWS)),
        kernel_table=rounded(result.kernel_table.head(MAX_TABLE_ROWS)),
        timeline_json=timeline(result).to_json(),
        steps=rounded(result.steps),
        annotations=rounded(result.annotations),
        insights_markdown=insights_markdown(result.insights),
        steps_chart_json=window_chart(result.steps).to_json(),
    )


def _checked(progress: Progress | None, limit_s: float | None, cancelled: Callable[[], bool] | None) -> Progress:
    """`progress`, after checking the clock and the caller at each report."""
    started, report = time.monotonic(), progress or (lambda fraction, message: None)

    def check(fraction: float, message: str) -> None:
        if cancelled is not None and cancelled():
            raise AnalysisStopped("trace: the analysis was stopped because its caller left")
        if limit_s is not None and time.monotonic() - started > limit_s:
            raise AnalysisStopped(
                f"trace: the analysis passed its {limit_s:g} s limit while {message}; try a trace with fewer steps"
            )
        report(fraction, message)

    return check


def stop_waiting(cancelled: Callable[[], bool] | None, worker: Worker) -> Callable[[], bool]:
    """Whether to stop waiting for memory: the caller left, or the analysis process died meanwhile."""
    return lambda: (cancelled is not None and cancelled()) or worker.exited()


def analyze_upload(
    path: str | Path,
    time_limit_s: float | None = None,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None,
    worker: Worker | None = None,
    work: Callable[..., Any] = upload_outputs,
    args: tuple[Any, ...] = (),
    per_event: int = PEAK_PER_ROW,
) -> Any:
    """The page's outputs for the trace at `path`, analysed within its admitted memory and `time_limit_s`.

    `work(path, reader_limits, *args, progress=...)` is what runs in the analysis process: `upload_outputs`
    (the Analyze tab's outputs) unless another reading of the trace is named (`profiling.views.view_file`);
    it is charged per event `per_event` (a view's work: `admission.VIEW_PEAK_PER_ROW`), and as /analyze is.

    Raises TraceError (AdmissionError: too big, or the server busy; AnalysisStopped: time limit or
    caller gone) with a message that starts with `trace:`. `worker` defaults to a fresh one, stopped
    after the call.
    """
    started = time.monotonic()
    check = _checked(progress, time_limit_s, cancelled)
    check(0.0, "counting the trace's JSON")
    cost = analysis_cost(path, per_object=per_event)
    check(0.02, f"waiting for memory for {cost.describe()}")
    own = worker or AnalysisWorker()
    try:
        gate = analysis_gate()
        with gate.admit(cost.peak_bytes, what=cost.describe(), cancelled=cancelled, per_object=per_event) as share:
            left = None if time_limit_s is None else max(0.0, time_limit_s - (time.monotonic() - started))
            return own.call(
                charged_reads,
                work,
                per_event,
                str(path),
                cost.reader_limits(),
                *args,
                time_limit_s=left,
                progress=check if not own.enabled else progress,
                cancelled=cancelled,
                answer=TopUp(share, {str(path): cost.peak_bytes}, stop_waiting(cancelled, own), time_left_s=left),
            )
    except Cancelled:
        raise AnalysisStopped("trace: the analysis was stopped because its caller left") from None
    finally:
        if worker is None:
            own.close()
