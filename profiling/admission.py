"""Memory admission for `/analyze`: an analysis starts only while the memory held by all jobs fits.

An analysis's peak grows with its trace's inflated JSON and its events, so each is charged
`analysis_peak_bytes` of them before it reads a byte, against the one machine budget
(`attention.budget.machine_budget`) that every analysis and every CPU run of the process draws from. One
that does not fit waits (first come, first served) for others to finish; one that could never fit
is refused at once, with the numbers.

    cost = analysis_cost(path)  # inflates once to count the JSON: ~0.3 s per 100 MiB
    with analysis_gate().admit(cost.peak_bytes, what=cost.describe()):
        trace = load_trace(path, **cost.reader_limits())
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from attention.budget import MemoryBudget, MiB, machine_budget
from attention.budget import size as _gib
from profiling.reader import MAX_SKELETON_BYTES, Limits, TraceError, inflated, raw_chunks

# Peak RSS growth of an analysis (`analyze_file`, then the tables rounded and the timeline and steps
# charts drawn, as `/analyze` does) per byte of inflated JSON, and its fixed part. Measured in a
# fresh process on tests/data/sampled_training_rank0 (a real CUDA training trace, ~360 bytes an
# event) repeated with shifted times and ids (2026-12-02, 2 cores, other jobs running):
#     inflated   10.1 MiB    40.5 MiB    101.5 MiB    203.3 MiB
#     growth     +52 MiB     +159 MiB    +381 MiB     +730 MiB   (3.4 per byte past the first ~30 MiB)
# tests/profiling/test_admission.py measures it again on every run.
PEAK_PER_INFLATED_BYTE = 4.0
# Per event the analysis holds ~1.2 kB at its peak whatever the event's size, so a trace of small
# events costs more per byte: 12.5x its JSON for 93-byte kernel events, 14x for 82-byte ones without
# args (2026-12-03, 32 and 64 MiB of them). An event is a JSON object, so the count of `{` in the
# JSON bounds the events from above, and no escape can hide one (a `{` in a string only adds to
# the count). Real traces hold 1.8 to 2.3 `{` per event (their args are objects too), so for them this
# term charges 2-3x what they use: the price of an upper bound that small events cannot slip under.
PEAK_PER_OBJECT = 1200
PEAK_BASE_BYTES = 64 * MiB
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


def analysis_peak_bytes(inflated_bytes: int, objects: int = 0) -> int:
    """The peak memory growth an analysis of this much JSON, holding at most `objects` JSON objects, is
    charged (see PEAK_PER_INFLATED_BYTE and PEAK_PER_OBJECT)."""
    return PEAK_BASE_BYTES + int(max(PEAK_PER_INFLATED_BYTE * inflated_bytes, PEAK_PER_OBJECT * objects))


@dataclass(frozen=True)
class AnalysisCost:
    """What one trace file will cost to analyse, from its JSON counted byte by byte."""

    inflated_bytes: int
    peak_bytes: int
    objects: int = 0  # `{` bytes in the JSON: no fewer than its events

    def reader_limits(self) -> dict[str, int]:
        """For `load_trace(path, **limits)`: the read may not inflate past what was counted and charged."""
        return {"inflated_bytes": max(1, self.inflated_bytes)}

    def describe(self) -> str:
        return f"{_gib(self.inflated_bytes)} of JSON in {self.objects:,} objects"


def analysis_cost(path: str | Path, limits: Limits | None = None) -> AnalysisCost:
    """Count `path`'s JSON by inflating it once, through the reader's own bounded steps.

    A gzip trailer's size could lie (and wraps at 4 GiB); counting cannot. A file past the reader's
    byte limits, or corrupt gzip, raises the reader's TraceError here, before any memory is admitted.
    """
    limits = limits or Limits()
    chunks = _not_blank_at_length(inflated(raw_chunks(Path(path), limits), limits.inflated_bytes))
    total = objects = 0
    for chunk in chunks:
        total, objects = total + len(chunk), objects + chunk.count(b"{")
    return AnalysisCost(total, analysis_peak_bytes(total, objects), objects)


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
    ) -> contextlib.AbstractContextManager[None]:
        """Hold `need_bytes` of the budget for the `with` block; wait up to `wait_s` (default
        `admission_wait_s()`) for room, while runs and other analyses hold it.

        Raises AdmissionError, its message starting with `field`, when the job can never fit, when
        the wait runs out, or when `cancelled()` turns true while it waits.
        """
        if need_bytes > self.budget_bytes:
            raise AdmissionError(
                f"{field}: analysing {what} needs about {_gib(need_bytes)} of memory; this server allows "
                f"{_gib(self.budget_bytes)} for runs and analyses together, which fits up to "
                f"{_gib(max(0.0, (self.budget_bytes - PEAK_BASE_BYTES) / PEAK_PER_INFLATED_BYTE))} of JSON "
                f"or {max(0, (self.budget_bytes - PEAK_BASE_BYTES) // PEAK_PER_OBJECT):,} objects"
            )
        return self.budget.admit(
            need_bytes,
            field=field,
            kind="analysis",
            wait_s=admission_wait_s() if wait_s is None else wait_s,
            cancelled=cancelled,
            error=lambda name, detail: AdmissionError(f"{name}: {detail}"),
        )


@functools.cache
def analysis_gate() -> AnalysisGate:
    """The gate every `/analyze` request in this process passes: the machine budget that runs hold too."""
    return AnalysisGate(machine_budget())
