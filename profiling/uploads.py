"""An uploaded trace analysed on a shared server: within memory admission and a time limit, stoppable.

    with analysed_upload(path, time_limit_s=300, progress=report, cancelled=gone) as analysis:
        outputs = draw(analysis)  # drawn while the analysis's memory is still admitted

The analysis runs in the calling process (its tables come back as DataFrames, too big to pickle
cheaply from a worker), so the limit and `cancelled` are checked at each progress report: every
chunk the reader streams (at most `reader.CHUNK_BYTES` of input) and every analysis stage. The
time past the limit is at most the longest stage; the README states the figure measured.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from profiling.admission import analysis_cost, analysis_gate
from profiling.analysis import Analysis, analyze_file
from profiling.reader import Progress, TraceError

TIME_LIMIT_ENV = "ATTENTION_PROFILER_ANALYZE_TIME_LIMIT"
DEFAULT_TIME_LIMIT_S = 300.0
ANALYSED = 0.9  # of the progress bar: reading and analysing the file; drawing its outputs takes the rest


class AnalysisStopped(TraceError):
    """The analysis passed its time limit, or its caller left."""


def analyze_time_limit_s() -> float:
    """`ATTENTION_PROFILER_ANALYZE_TIME_LIMIT` seconds, else DEFAULT_TIME_LIMIT_S."""
    value = os.environ.get(TIME_LIMIT_ENV, "")
    try:
        limit = float(value) if value else DEFAULT_TIME_LIMIT_S
    except ValueError:
        raise ValueError(f"{TIME_LIMIT_ENV}: give a number of seconds, got {value!r}") from None
    if not limit > 0:
        raise ValueError(f"{TIME_LIMIT_ENV}: give a positive number of seconds, got {value!r}")
    return limit


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


@contextlib.contextmanager
def analysed_upload(
    path: str | Path,
    time_limit_s: float | None = None,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Iterator[Analysis]:
    """The analysis of the trace at `path`, its memory held from the analysis gate for the `with` block.

    Raises TraceError (AdmissionError: too big, or the server busy; AnalysisStopped: time limit or
    caller gone) with a message that starts with `trace:`.
    """
    check = _checked(progress, time_limit_s, cancelled)
    check(0.0, "counting the trace's JSON")
    cost = analysis_cost(path)
    check(0.02, f"waiting for memory for {cost.describe()}")
    with analysis_gate().admit(cost.peak_bytes, what=cost.describe(), cancelled=cancelled):
        yield analyze_file(path, check, done_at=ANALYSED, **cost.reader_limits())
