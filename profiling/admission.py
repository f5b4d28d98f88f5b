"""Memory admission for `/analyze`: an analysis starts only while the memory held by all jobs fits.

An analysis's peak grows with its trace's inflated JSON and its events, so each is charged
`analysis_peak_bytes` of them before it reads a byte, against the one machine budget
(`attention.budget.machine_budget`) that every analysis and every CPU run of the process draws from. One
that does not fit waits (first come, first served) for others to finish; one that could never fit
is refused at once, with the numbers. Once its trace is read, the analysis process asks for what the
analysis of those events needs (`settle_read`, called by `load_trace`), and its share grows to that.

    cost = analysis_cost(path)  # inflates once to count the JSON: ~0.3 s per 100 MiB
    with analysis_gate().admit(cost.peak_bytes, what=cost.describe()) as share:
        top_up = TopUp(share, {path: cost.peak_bytes})
        worker.call(charged_reads, work, PEAK_PER_ROW, path, cost.reader_limits(), answer=top_up)  # work reads
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from attention.budget import MemoryBudget, MiB, Share, machine_budget
from attention.budget import size as _gib
from profiling.columns import NUMERIC_ARGS, OBJECT_ARGS
from profiling.reader import MAX_SKELETON_BYTES, Limits, TraceError, inflated, raw_chunks

if TYPE_CHECKING:  # profiling.trace imports this module (load_trace calls settle_read)
    from profiling.trace import Trace

ARG_COLUMNS = (*NUMERIC_ARGS.values(), *OBJECT_ARGS.values())

# An analysis is charged twice (issue 21), each time its peak RSS growth (`analyze_file`, then the tables
# rounded and the timeline and steps charts drawn, as `/analyze` does; the decode helper's ~46 MiB of private
# memory, profiling/reader_pool.py, is in the fixed part). Figures: tests/profiling/test_admission.py's
# PEAK_CHILD, a fresh process, VmHWM after /proc/self/clear_refs, 2026-12-06, 2 cores.
#
# 1. Before the read, from the JSON counted byte by byte (`analysis_cost`): enough for the read and its
#    events frame, whatever the events fill. Per byte, for big events (a real training trace, ~360 bytes an
#    event: 78 MiB read of 81 MiB of JSON, 1,505 MiB analysed of 1,038 MiB), and per object for small ones
#    (93-byte kernel events that fill every args column: 295 MiB read of 721,602, 409 bytes each; as every
#    event costs the analysis at least PEAK_PER_ROW, that is charged per object from the start). The
#    events are counted from above without parsing: every object that is an element of an array opens right
#    after `[` or `,` (JSON allows only blanks between), which no escape can hide, while an `args` object
#    opens after `:` and is not counted. Real traces hold ~1 such `{` per event.
# 2. Once read, from its events (`analysis_need_bytes`), the share grows to what their analysis needs:
#    per event, and per value of each args column some event fills, in the events frame and in each frame of
#    the categories that fill it (kernels, GPU activity: up to 3 more). Measured (bytes an event, growth
#    over the events, 64 MiB of small events): 504 for kernels, 437 for ops, 1,271 for kernels that fill
#    every args column (26), 1,060 for annotations that do; a real training trace, 479 from 81 to 1,038 MiB.
#    Before, one charge had to hold both the worst case's 1,271 bytes an event and real traces' 2.7x less.
PEAK_PER_INFLATED_BYTE = 1.6
PEAK_PER_ROW = 500
PEAK_PER_OBJECT = PEAK_PER_ROW  # an object is at most one event: the second charge's floor, known before the read
VIEW_PEAK_PER_ROW = 1250  # `/trace_views`: ops grouped by call stack held 548 MiB for 600,000 ops of distinct names
PEAK_PER_TEXT = 200  # per distinct name: an op of its own name cost 508 B an event, one of a shared name 437
PEAK_BASE_BYTES = 80 * MiB
FRAME_COPIES = 3
BYTES_PER_VALUE = 8
WAIT_ENV = "ATTENTION_PROFILER_ADMISSION_WAIT"  # seconds an analysis may wait for memory, then it is refused
DEFAULT_WAIT_S = 300


class AdmissionError(TraceError):
    """An analysis that cannot be given its memory: never (too big for the budget) or not now (busy)."""


def admission_wait_s() -> float:
    """How long an analysis waits for memory: `ATTENTION_PROFILER_ADMISSION_WAIT` seconds, else DEFAULT_WAIT_S."""
    value = os.environ.get(WAIT_ENV, "")
    if not value:
        return DEFAULT_WAIT_S
    if not value.isdigit():
        raise ValueError(f"{WAIT_ENV}: give a whole number of seconds, got {value!r}")
    return int(value)


def analysis_need_bytes(trace: Trace, per_event: int = PEAK_PER_ROW) -> int:
    """The peak memory growth the analysis of a read trace is charged: per event (`per_event`: a view's work
    may cost more than the analysis's), per distinct text, and per event again for each args column some
    event fills, in every frame of the categories that fill it.

    The reader leaves an args column that no event fills as a repeat that costs nothing, and the analysis's
    frames of kernels, GPU activity, annotations... (`trace.rows_of`) drop a column that none of their rows
    fills. So a filled column costs its 8 bytes a row in the events frame, and again in each frame of the
    categories whose rows fill it: a kernel's `grid` is copied into the kernel frames, an op's `Input Dims`
    into none of them."""
    events = trace.events
    categories, counts = _category_counts(events["cat"])
    filled = 0
    for column in ARG_COLUMNS:
        values = events[column].to_numpy()
        if values.strides == (0,):  # empty: a repeat of its missing value (`Columns.arrays`)
            continue
        present = pd.notna(values)
        if not present.any():
            continue
        with_it = np.bincount(categories[present], minlength=len(counts)) > 0
        filled += len(events) + FRAME_COPIES * int(counts[with_it].sum())
    texts = trace.distinct_texts * PEAK_PER_TEXT
    return PEAK_BASE_BYTES + len(events) * per_event + texts + filled * BYTES_PER_VALUE


def _category_counts(cat: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Each row's category as a code (missing: its own code), and the rows of each code."""
    codes, uniques = pd.factorize(cat.to_numpy(), use_na_sentinel=False)
    return codes, np.bincount(codes, minlength=len(uniques))


def analysis_peak_bytes(inflated_bytes: int, objects: int = 0, per_object: int = PEAK_PER_OBJECT) -> int:
    """The peak memory growth an analysis of this much JSON, holding at most `objects` JSON objects, is
    charged before its read (see PEAK_PER_INFLATED_BYTE and PEAK_PER_OBJECT); `TopUp` grows it after."""
    return PEAK_BASE_BYTES + int(max(PEAK_PER_INFLATED_BYTE * inflated_bytes, per_object * objects))


@dataclass(frozen=True)
class AnalysisCost:
    """What one trace file will cost to analyse, from its JSON counted byte by byte."""

    inflated_bytes: int
    peak_bytes: int
    objects: int = 0  # objects that are array elements (`{` after `[` or `,`): no fewer than its events

    def reader_limits(self) -> dict[str, int]:
        """For `load_trace(path, **limits)`: the read may not inflate past what was counted and charged."""
        return {"inflated_bytes": max(1, self.inflated_bytes)}

    def describe(self) -> str:
        return f"{_gib(self.inflated_bytes)} of JSON in {self.objects:,} objects"


def analysis_cost(path: str | Path, limits: Limits | None = None, per_object: int = PEAK_PER_OBJECT) -> AnalysisCost:
    """Count `path`'s JSON by inflating it once, through the reader's own bounded steps; charge `per_object`
    bytes an object (a view's work: VIEW_PEAK_PER_ROW) or 1.6 a byte, whichever is more.

    A gzip trailer's size could lie (and wraps at 4 GiB); counting cannot. A file past the reader's
    byte limits, or corrupt gzip, raises the reader's TraceError here, before any memory is admitted.
    """
    limits = limits or Limits()
    chunks = _not_blank_at_length(inflated(raw_chunks(Path(path), limits), limits.inflated_bytes))
    total = objects = 0
    last = b""  # the last byte before the chunk that was not a blank
    for chunk in chunks:
        total, objects = total + len(chunk), objects + elements_opened(chunk, last)
        last = chunk.rstrip(_BLANKS)[-1:] or last
    return AnalysisCost(total, analysis_peak_bytes(total, objects, per_object), objects)


_SPACED_ELEMENT = re.compile(rb"[,\[][ \t\n\r]+\{")


_BLANKS = b" \t\n\r"


def elements_opened(chunk: bytes, before: bytes = b"") -> int:
    """How many objects that are array elements open in `chunk`, counted from above: each `{` right after
    `[` or `,` (blanks between allowed); `before` is the last byte that was not a blank before the chunk."""
    count = chunk.count(b",{") + chunk.count(b"[{")
    if any(blank + b"{" in chunk for blank in (b" ", b"\t", b"\n", b"\r")):  # pretty-printed: rarer, slower
        count += len(_SPACED_ELEMENT.findall(chunk))
    if before in (b",", b"[") and chunk.lstrip(_BLANKS)[:1] == b"{":  # an opener cut at the chunk's start
        count += 1
    return count


def _not_blank_at_length(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """`chunks`, stopped with the reader's own message once they open with more blanks than it
    allows: a bomb of whitespace is refused after MAX_SKELETON_BYTES, not counted to the inflated cap."""
    blanks = 0
    for chunk in chunks:
        if blanks is not None:
            stripped = chunk.lstrip()
            blanks = None if stripped else blanks + len(chunk)
            if blanks is not None and blanks > MAX_SKELETON_BYTES:
                raise TraceError(f"trace: starts with more than {MAX_SKELETON_BYTES // MiB} MiB of blanks; not a trace")
        yield chunk


class AnalysisGate:
    """`/analyze`'s door to a memory budget: an analysis's own messages and AdmissionError (a TraceError)."""

    def __init__(self, budget: MemoryBudget | int) -> None:
        """`budget`: the budget to draw from (the machine's, see `analysis_gate`), or a size for a gate of its own."""
        self.budget = budget if isinstance(budget, MemoryBudget) else MemoryBudget(budget)

    @property
    def budget_bytes(self) -> int:
        return self.budget.budget_bytes

    @property
    def in_use_bytes(self) -> int:
        return self.budget.in_use_bytes

    def admit(
        self,
        need_bytes: int,
        *,
        field: str = "trace",
        what: str = "it",
        wait_s: float | None = None,
        cancelled: Callable[[], bool] | None = None,
        per_object: int = PEAK_PER_OBJECT,
    ) -> contextlib.AbstractContextManager[Share]:
        """Hold `need_bytes` of the budget for the `with` block, which gets the `Share` (grown by `TopUp` once
        the trace is read); wait up to `wait_s` (default `admission_wait_s()`) for room, while runs and other
        analyses hold it.

        Raises AdmissionError, its message starting with `field`, when the job can never fit (saying how much
        JSON, or how many objects at `per_object` bytes each, would), when the wait runs out, or when
        `cancelled()` turns true while it waits.
        """
        if need_bytes > self.budget_bytes:
            raise AdmissionError(
                f"{field}: analysing {what} needs about {_gib(need_bytes)} of memory; this server allows "
                f"{_gib(self.budget_bytes)} for runs and analyses together, which fits up to "
                f"{_gib(max(0.0, (self.budget_bytes - PEAK_BASE_BYTES) / PEAK_PER_INFLATED_BYTE))} of JSON "
                f"or {max(0, (self.budget_bytes - PEAK_BASE_BYTES) // per_object):,} objects"
            )
        return self.budget.admit(
            need_bytes,
            field=field,
            kind="analysis",
            wait_s=admission_wait_s() if wait_s is None else wait_s,
            cancelled=cancelled,
            error=lambda name, detail: AdmissionError(f"{name}: {detail}"),
        )


# In the analysis process, while `charged_reads` runs: how to ask the server for the memory a read trace needs,
# and the charge per event of the work that reads it.
_ask: contextvars.ContextVar[tuple[Callable[[Any], Any], int] | None] = contextvars.ContextVar("ask", default=None)


def charged_reads(
    work: Callable[..., Any], per_event: int, /, *args: Any, ask: Callable[[Any], Any], **kwargs: Any
) -> Any:
    """`work(*args, **kwargs)` (in the analysis process), where each trace that `load_trace` reads asks the
    server, through `ask`, to grow its admitted share to what `work` on those events needs (`per_event`)."""
    token = _ask.set((ask, per_event))
    try:
        return work(*args, **kwargs)
    finally:
        _ask.reset(token)


def settle_read(trace: Trace, path: str | Path) -> None:
    """Called by `load_trace` once a trace is read: inside `charged_reads`, ask for what its analysis needs
    (`analysis_need_bytes`) before the analysis starts; elsewhere nothing (the CLI admits nothing)."""
    asking = _ask.get()
    if asking is not None:
        ask, per_event = asking
        ask((str(Path(path)), analysis_need_bytes(trace, per_event)))


class TopUp:
    """The server's answer to `settle_read`: grow the share admitted for these traces (path -> what each was
    charged before its read) to what their reads say they need, each at least its first charge. It waits for
    room as admission does (`admission_wait_s`), but not past the time limit, `time_left_s` from now."""

    def __init__(
        self,
        share: Share,
        charged: dict[str, int],
        cancelled: Callable[[], bool] | None = None,
        time_left_s: float | None = None,
    ) -> None:
        self.share, self.cancelled = share, cancelled
        self.deadline = None if time_left_s is None else time.monotonic() + time_left_s
        self.charged = {str(Path(path)): need for path, need in charged.items()}
        self.needs: dict[str, int] = {}

    def __call__(self, question: tuple[str, int]) -> int:
        path, need = question
        self.needs[path] = max(self.needs.get(path, 0), int(need))
        total = sum(max(self.charged.get(p, 0), self.needs.get(p, 0)) for p in self.charged.keys() | self.needs.keys())
        wait_s = admission_wait_s()
        if self.deadline is not None:
            wait_s = max(0.0, min(wait_s, self.deadline - time.monotonic()))
        self.share.grow_to(total, wait_s, self.cancelled)
        return self.share.bytes


@functools.cache
def analysis_gate() -> AnalysisGate:
    """The gate every `/analyze` request in this process passes: the machine budget that runs hold too."""
    return AnalysisGate(machine_budget())
