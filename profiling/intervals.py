"""Interval arithmetic on numpy arrays: union, clipping, intersection, subtraction, per-window sums.

An interval set is a pair `(starts, ends)` of float arrays. The functions that return a set
return it merged: sorted, disjoint, with no empty intervals. They are the vectorised
counterparts of the TensorBoard plugin's `range_utils.py` (pytorch/kineto,
`tb_plugin/torch_tb_profiler/profiler/range_utils.py`: `merge_ranges`,
`intersection_ranges_lists`, `subtract_ranges_lists`, `merge_ranges_with_value`), so a
trace of 10M events never goes through a Python loop.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

Intervals = tuple[np.ndarray, np.ndarray]


def as_intervals(starts: object, ends: object) -> Intervals:
    """Two float arrays of the same length, from anything array-like."""
    s, e = np.asarray(starts, dtype=np.float64).ravel(), np.asarray(ends, dtype=np.float64).ravel()
    if s.shape != e.shape:
        raise ValueError(f"intervals: {len(s)} starts but {len(e)} ends")
    return s, e


def empty() -> Intervals:
    return np.empty(0), np.empty(0)


def union(starts: object, ends: object) -> Intervals:
    """Merge overlapping or touching intervals (range_utils.merge_ranges)."""
    s, e = as_intervals(starts, ends)
    keep = e > s
    s, e = s[keep], e[keep]
    if not len(s):
        return empty()
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # A new group starts where an interval begins after everything before it has ended.
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    return s[new], np.maximum.reduceat(e, np.flatnonzero(new))


def total(intervals: Intervals) -> float:
    """Summed length of a merged interval set."""
    s, e = intervals
    return float((e - s).sum())


def clip(intervals: Intervals, lo: float, hi: float) -> Intervals:
    """The part of a merged set inside [lo, hi]."""
    s, e = np.clip(intervals[0], lo, hi), np.clip(intervals[1], lo, hi)
    keep = e > s
    return s[keep], e[keep]


def _coverage(a: Intervals, b: Intervals) -> tuple[np.ndarray, np.ndarray]:
    """Elementary segments of the time line and, for each, 1 if in `a`, 2 if in `b`, 3 if in both."""
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    steps = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), 2 * np.ones(len(b[0])), -2 * np.ones(len(b[1]))])
    order = np.argsort(times, kind="stable")
    times, state = times[order], np.cumsum(steps[order])
    return times, state


def _segments_where(times: np.ndarray, state: np.ndarray, wanted: int) -> Intervals:
    if len(times) < 2:
        return empty()
    s, e = times[:-1], times[1:]
    keep = (np.rint(state[:-1]) == wanted) & (e > s)
    return union(s[keep], e[keep])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Where both merged sets are busy (range_utils.intersection_ranges_lists)."""
    return _segments_where(*_coverage(a, b), wanted=3)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Where merged set `a` is busy and `b` is not (range_utils.subtract_ranges_lists)."""
    return _segments_where(*_coverage(a, b), wanted=1)


def overlap_per_window(intervals: Intervals, win_starts: np.ndarray, win_ends: np.ndarray) -> np.ndarray:
    """For each window [start, end], how long the merged set is busy inside it.

    Uses the cumulative busy time F(t): busy time in [a, b] is F(b) - F(a).
    """
    s, e = intervals
    done = np.concatenate([[0.0], np.cumsum(e - s)])

    def busy_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, t, side="right")  # intervals that started by t
        partial = np.where(k > 0, np.minimum(t, e[np.clip(k - 1, 0, None)]) - s[np.clip(k - 1, 0, None)], 0.0)
        return done[np.clip(k - 1, 0, None)] * (k > 0) + np.clip(partial, 0.0, None)

    if not len(s):
        return np.zeros(len(win_starts))
    return np.clip(busy_until(np.asarray(win_ends, float)) - busy_until(np.asarray(win_starts, float)), 0.0, None)


def stacked_values(starts: object, ends: object, values: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segments where the summed value of the overlapping intervals is positive, with that sum clamped to 1.

    range_utils.merge_ranges_with_value: blocks per SM of concurrent kernels add up; an SM
    cannot be more than fully busy, so the sum is clamped to 1 (Est. SM Efficiency).
    """
    s, e = as_intervals(starts, ends)
    v = np.asarray(values, dtype=np.float64).ravel()
    if not len(s):
        return np.empty(0), np.empty(0), np.empty(0)
    times = np.concatenate([s, e])
    kinds = np.concatenate([np.zeros(len(s)), np.ones(len(e))])  # START before END at equal times
    order = np.lexsort((kinds, times))
    times, level = times[order], np.cumsum(np.concatenate([v, -v])[order])
    seg_s, seg_e, seg_v = times[:-1], times[1:], level[:-1]
    keep = (seg_e > seg_s) & (seg_v > 0.0)
    return seg_s[keep], seg_e[keep], np.minimum(seg_v[keep], 1.0)


def busy_per_group(group: np.ndarray, starts: np.ndarray, ends: np.ndarray, groups: int) -> np.ndarray:
    """For each group 0..groups-1, the length of the union of its intervals (nested or overlapping ones count once).

    One sort for all groups together: each interval adds what it reaches past everything that
    started before it in its group.
    """
    s, e = as_intervals(starts, ends)
    group = np.asarray(group, dtype=np.int64)
    if not len(s):
        return np.zeros(groups)
    order = np.lexsort((s, group))
    g, s, e = group[order], s[order], e[order]
    reach = pd.Series(e).groupby(g).cummax().to_numpy()
    before = np.concatenate([[-np.inf], reach[:-1]])
    before[np.flatnonzero(np.diff(g)) + 1] = -np.inf  # a group's first interval follows nothing
    added = np.nan_to_num(np.clip(e - np.maximum(s, before), 0.0, None))
    return np.bincount(g, weights=added, minlength=groups)
