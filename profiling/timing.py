"""The unprofiled wall-clock loop, and the statistics every timed figure carries.

A timing is a distribution, never a lone number: `time_calls` times a call again and again, without
the profiler, and `TimingStats` keeps the samples with their median, quartiles and coefficient of
variation. The stop rules follow the anchors of issue 19: pyperf warns when the standard deviation
passes 10% of the mean (NOISY_CV); Google Benchmark reports the CV of its repetitions; like
`torch.utils.benchmark.Timer.blocked_autorange`, the loop runs until it has a stable estimate or its
time budget is spent.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

STABLE_CV = 0.05  # stop when cv <= this with n >= MIN_CALLS
NOISY_CV = 0.10  # cv above this: the figure is noisy (pyperf's warning threshold)
MIN_CALLS = 7
MAX_CALLS = 200  # also the most samples kept
DEFAULT_BUDGET_S = 0.5
BUDGET_ENV = "ATTENTION_PROFILER_TIMING_BUDGET_S"
MS_DIGITS = 6  # milliseconds kept to the nanosecond: a fused GPU kernel can take 5 µs
CV_DIGITS = 4


def timing_budget_s() -> float:
    """Seconds one timing loop may spend: ATTENTION_PROFILER_TIMING_BUDGET_S, default DEFAULT_BUDGET_S.

    Raises ValueError, naming the variable, for anything but a finite number of seconds above 0.
    """
    raw = os.environ.get(BUDGET_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_BUDGET_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{BUDGET_ENV}: {raw[:40]!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{BUDGET_ENV}: {raw[:40]!r} must be a finite number of seconds above 0")
    return value


@dataclass(frozen=True)
class TimingStats:
    """The samples of one timed call (milliseconds, in call order) and their summary statistics."""

    n: int
    median: float
    p25: float
    p75: float
    min: float
    max: float
    cv: float  # sample standard deviation / mean; 0 with fewer than 2 samples
    noisy: bool  # cv > NOISY_CV
    samples: tuple[float, ...]

    @property
    def half_iqr(self) -> float:
        """Half the interquartile range: the ± the cards show beside the median."""
        return (self.p75 - self.p25) / 2

    def as_dict(self) -> dict[str, Any]:
        """The JSON-native form the summaries carry as `forward_ms_stats` and `backward_ms_stats`."""
        return {
            "n": self.n,
            **{key: round(getattr(self, key), MS_DIGITS) for key in ("median", "p25", "p75", "min", "max")},
            "cv": round(self.cv, CV_DIGITS),
            "noisy": self.noisy,
            "samples": [round(s, MS_DIGITS) for s in self.samples],
        }


def _cv(values: np.ndarray) -> float:
    if len(values) < 2:
        return 0.0
    mean = float(values.mean())
    return float(values.std(ddof=1)) / mean if mean > 0 else 0.0


def stats_of(samples_ms: Sequence[float]) -> TimingStats:
    """The statistics of `samples_ms` (at least one finite, non-negative time). Quartiles interpolate
    linearly between samples (numpy's default, as `torch.utils.benchmark.Measurement` does)."""
    values = np.asarray(samples_ms, dtype=float)
    if values.ndim != 1 or not len(values) or not np.isfinite(values).all() or (values < 0).any():
        raise ValueError("samples_ms: need at least one finite, non-negative time in milliseconds")
    p25, median, p75 = (float(q) for q in np.percentile(values, (25, 50, 75)))
    cv = _cv(values)
    return TimingStats(
        n=len(values),
        median=median,
        p25=p25,
        p75=p75,
        min=float(values.min()),
        max=float(values.max()),
        cv=cv,
        noisy=cv > NOISY_CV,
        samples=tuple(float(v) for v in values),
    )


def time_calls(
    call: Callable[[], object],
    before: Callable[[], object] | None = None,
    after: Callable[[], object] | None = None,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], object] | None = None,
) -> TimingStats:
    """Time `call` alone, again and again: before(), sync, start, call(), sync, stop, after().

    `before` is untimed setup (the forward whose backward is timed); `after` runs between calls (a
    deadline check); `sync` waits for the device (torch.cuda.synchronize on CUDA). The loop stops at
    the first of: cv <= STABLE_CV with at least MIN_CALLS samples, `budget_s` (default
    `timing_budget_s()`) spent since the loop began, setup included, or MAX_CALLS calls. At least one
    call is made: the budget wins over MIN_CALLS, so a call longer than the budget is timed once.
    """
    budget = timing_budget_s() if budget_s is None else budget_s
    wait = sync or (lambda: None)
    samples: list[float] = []
    began = clock()
    while True:
        if before is not None:
            before()
        wait()
        start = clock()
        call()
        wait()
        stop = clock()
        samples.append((stop - start) * 1e3)
        if after is not None:
            after()
        stable = len(samples) >= MIN_CALLS and _cv(np.asarray(samples)) <= STABLE_CV
        if stable or stop - began >= budget or len(samples) >= MAX_CALLS:
            return stats_of(samples)


def stats_from_dict(d: Any) -> TimingStats | None:
    """A summary's `*_ms_stats` read back, its statistics recomputed from its samples (the first
    MAX_CALLS); None when it is missing, holds no samples, or any sample is not a time."""
    if not isinstance(d, Mapping):
        return None
    samples = d.get("samples")
    if not isinstance(samples, (list, tuple)) or not samples:
        return None
    samples = samples[:MAX_CALLS]
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in samples):
        return None
    try:
        return stats_of(samples)
    except (ValueError, OverflowError):  # OverflowError: an integer past float's range
        return None
