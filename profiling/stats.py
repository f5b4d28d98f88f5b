"""Statistics on timing samples, in numpy: the speed-up's bootstrap interval and the Mann–Whitney U test.

Timings are distributions (issue 19): a ratio of two medians gets a 95% interval, and a difference between
two runs is "changed" only when a rank test says the samples differ. Criterion and `torch.utils.benchmark`
do the same; nothing here assumes normal timings (they are skewed by load).

`timing_of` reads a summary's `forward_ms_stats` / `backward_ms_stats` back; `stats_problem` says why one
is invalid, for the callers that refuse it by name (diff).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from profiling.timing import MAX_CALLS, TimingStats, stats_from_dict

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
MIN_SAMPLES = 5  # per side, for an interval or a rank test: fewer cannot tell a change from noise
MAX_SAMPLES = MAX_CALLS  # the most a summary keeps
MAX_RESAMPLES = 100_000
STATS_NUMBERS = ("n", "median", "p25", "p75", "min", "max", "cv")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def stats_problem(stats: Any) -> str | None:
    """Why `stats` is not a valid `*_ms_stats` dict (None, or a dict of finite numbers, `noisy` a bool and
    `samples` a list of at most MAX_SAMPLES finite, non-negative numbers), or None when it is."""
    if stats is None:
        return None
    if not isinstance(stats, dict):
        return "must be an object of timing statistics or null"
    samples = stats.get("samples")
    if samples is not None:
        if not isinstance(samples, (list, tuple)) or len(samples) > MAX_SAMPLES:
            return f"samples must be a list of at most {MAX_SAMPLES} numbers"
        if not all(_finite(s) and s >= 0 for s in samples):
            return "samples must be finite, non-negative numbers (ms)"
    for key in STATS_NUMBERS:
        if stats.get(key) is not None and not _finite(stats[key]):
            return f"{key} must be a finite number or null"
    if stats.get("noisy") is not None and not isinstance(stats["noisy"], bool):
        return "noisy must be true, false or null"
    return None


def timing_of(stats: Any) -> TimingStats | None:
    """A `*_ms_stats` dict read back (`timing.stats_from_dict`: its figures recomputed from its samples, as
    the cards show them); None where it holds no samples, or a sample that is not a positive time (a ratio
    of medians needs time that passed): summaries made before issue 19, inference's backward, crafted values."""
    timing = stats_from_dict(stats)
    return timing if timing is not None and timing.min > 0 else None


def _sample(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or not MIN_SAMPLES <= len(array) <= MAX_SAMPLES:
        raise ValueError(f"{name}: give {MIN_SAMPLES} to {MAX_SAMPLES} samples, not {array.size}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: samples must be finite")
    return array


def speedup_ci(
    baseline_ms: Sequence[float],
    other_ms: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(speed-up, lo, hi): the speed-up of `other` over `baseline`, median(baseline) / median(other), and its
    `level` percentile interval from `resamples` bootstrap resamples of each side, drawn with replacement
    with a fixed seed (the same samples give the same interval).

    Each side needs MIN_SAMPLES to MAX_SAMPLES positive samples (else ValueError).
    """
    base, other = _sample(baseline_ms, "baseline"), _sample(other_ms, "other")
    if (base <= 0).any() or (other <= 0).any():
        raise ValueError("samples must be positive times")
    if not 1 <= resamples <= MAX_RESAMPLES or not 0 < level < 1:
        raise ValueError(f"give 1 to {MAX_RESAMPLES} resamples and a level in (0, 1)")
    rng = np.random.default_rng(seed)
    # One index matrix per side, a row per resample: the medians come out along axis 1, with no Python loop.
    base_medians = np.median(base[rng.integers(0, len(base), size=(resamples, len(base)))], axis=1)
    other_medians = np.median(other[rng.integers(0, len(other), size=(resamples, len(other)))], axis=1)
    tail = (1 - level) / 2
    lo, hi = np.quantile(base_medians / other_medians, [tail, 1 - tail])
    return float(np.median(base) / np.median(other)), float(lo), float(hi)


def within_noise(ci: tuple[float, float] | Sequence[float]) -> bool:
    """Whether a speed-up interval (lo, hi) contains 1: no measurable difference."""
    lo, hi = ci[0], ci[-1]
    return lo <= 1 <= hi


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p value of the Mann–Whitney U test that `a` and `b` come from one distribution.

    The normal approximation with the tie correction and the continuity correction, as
    scipy.stats.mannwhitneyu(method="asymptotic") computes it: U = max(U1, U2),
    z = (U - n1·n2/2 - 0.5) / σ, σ² = n1·n2/12 · ((n + 1) - Σ(t³ - t) / (n(n - 1))), p = 2·P(Z > z).
    Each side needs MIN_SAMPLES to MAX_SAMPLES finite samples (else ValueError).
    """
    x, y = _sample(a, "a"), _sample(b, "b")
    n1, n2 = len(x), len(y)
    n = n1 + n2
    values = np.concatenate([x, y])
    # Midranks: each run of ties takes the mean of the ranks it spans.
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    midranks = np.cumsum(counts) - (counts - 1) / 2
    u1 = float(midranks[inverse][:n1].sum()) - n1 * (n1 + 1) / 2
    u = max(u1, n1 * n2 - u1)
    ties = float(np.sum(counts.astype(float) ** 3 - counts))
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    if sigma == 0:  # every value equal: nothing tells the samples apart
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / sigma
    return min(1.0, math.erfc(z / math.sqrt(2)))  # 2·P(Z > z) = erfc(z/√2)
