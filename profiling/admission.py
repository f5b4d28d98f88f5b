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
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from attention.budget import MemoryBudget, MiB, machine_budget
from attention.budget import size as _gib
from profiling.reader import MAX_SKELETON_BYTES, Limits, TraceError, inflated, raw_chunks

# Peak RSS growth of an analysis (`analyze_file`, then the tables rounded and the timeline and steps
# charts drawn, as `/analyze` does) per byte of inflated JSON, and its fixed part. Measured with the
# typed reader in a fresh process (tests/profiling/test_admission.py's PEAK_CHILD: VmHWM after
# /proc/self/clear_refs) on its `scaled_trace` of tests/data/sampled_training_rank0 (a real CUDA training
# trace, ~360 bytes an event; 2026-12-05, 2 cores), since empty args columns cost nothing (issue 21):
#     inflated   20.2 MiB    84.6 MiB    257.8 MiB   1,038 MiB (bench/parse_scale.py's replica, 665x)
#     growth     +52 MiB     +133 MiB    +358 MiB    +1,464 MiB before drawing, +1,505 with it
# (1.30 per byte from 85 to 258 MiB; 1.75 before). The read's decode helper (profiling/reader_pool.py,
# forked past 16 MiB of JSON) holds another ~46 MiB of private memory at most: in the fixed part.
PEAK_PER_INFLATED_BYTE = 1.6
# Per event the analysis holds ~0.5 kB at its peak whatever the event's size, so a trace of small events
# costs more per byte: 5.6x its JSON for 93-byte kernel events, 6.2x for 82-byte ones without args,
# 5.2x for 85-byte ops (the same child, 16 MiB of each; 521, 508 and 443 bytes an event, 2026-12-05; 1140,
# 1120 and 884 before empty args columns cost nothing). The events are
# counted from above without parsing: every object that is an element of an array opens right after
# `[` or `,` (JSON allows only blanks between), which no escape can hide, while an `args` object
# opens after `:` and is not counted. Real traces hold ~1 such `{` per event (they held 2.3 `{` of
# any kind, which the previous charge counted, charging them 2-4x what they use).
PEAK_PER_OBJECT = 1250  # covers a trace whose args columns are all filled (one event with every key suffices)
PEAK_BASE_BYTES = 80 * MiB
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
    objects: int = 0  # objects that are array elements (`{` after `[` or `,`): no fewer than its events

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
    last = b""  # the last byte before the chunk that was not a blank
    for chunk in chunks:
        total, objects = total + len(chunk), objects + elements_opened(chunk, last)
        last = chunk.rstrip(_BLANKS)[-1:] or last
    return AnalysisCost(total, analysis_peak_bytes(total, objects), objects)


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
