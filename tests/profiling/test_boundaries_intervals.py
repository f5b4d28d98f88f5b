"""Interval arithmetic at its boundaries, against plain loops (issue 17: mutants at the boundaries).

Every expected value is computed here by a loop over the intervals (unit cells of an integer
grid, or a sweep over sorted points), never by `profiling.intervals`. Integer endpoints on a
small grid make ties common: intervals that touch at a shared µs, zero-length ones, equal starts.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from profiling import intervals as iv

Pairs = list[tuple[float, float]]


def plain_union(pairs: Pairs) -> Pairs:
    """Sorted, disjoint, non-empty intervals covering the same points; touching ones join."""
    merged: list[list[float]] = []
    for s, e in sorted(p for p in pairs if p[1] > p[0]):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def cells(pairs: Pairs) -> set[int]:
    """The unit cells [t, t + 1] of an integer grid that a set of integer intervals covers."""
    return {t for s, e in pairs for t in range(int(s), int(e))}


def from_cells(covered: set[int]) -> Pairs:
    return plain_union([(t, t + 1) for t in covered])


def as_pairs(intervals: iv.Intervals) -> Pairs:
    return [(float(s), float(e)) for s, e in zip(*intervals, strict=True)]


def random_pairs(rng: random.Random, n: int, span: int = 20) -> Pairs:
    out = []
    for _ in range(n):
        s = rng.randint(0, span)
        out.append((s, s + rng.choice([0, 0, 1, 2, 3, 5, 8])))  # zero-length ones on purpose
    return out


def arrays(pairs: Pairs) -> tuple[list[float], list[float]]:
    return [float(s) for s, _ in pairs], [float(e) for _, e in pairs]


def test_as_intervals_flattens_and_refuses_unequal_lengths():
    s, e = iv.as_intervals([[1, 2]], [[3, 4]])
    assert s.dtype == np.float64 and e.dtype == np.float64
    assert s.tolist() == [1.0, 2.0] and e.tolist() == [3.0, 4.0]
    with pytest.raises(ValueError, match=r"^intervals: 2 starts but 1 ends$"):
        iv.as_intervals([1, 2], [3])
    empty = iv.empty()
    assert len(empty) == 2 and empty[0].shape == (0,) and empty[1].shape == (0,)


def test_union_joins_touching_intervals_and_drops_empty_ones():
    assert as_pairs(iv.union([0, 1], [1, 2])) == [(0.0, 2.0)]  # touching at a shared µs: one interval
    assert as_pairs(iv.union([0, 1], [2, 3])) == [(0.0, 3.0)]
    assert as_pairs(iv.union([0, 3], [1, 4])) == [(0.0, 1.0), (3.0, 4.0)]
    assert as_pairs(iv.union([5, 0], [5, 1])) == [(0.0, 1.0)]  # a zero-length interval is no busy time
    assert as_pairs(iv.union([5], [4])) == []  # nor an inverted one
    assert as_pairs(iv.union([], [])) == []
    # A long interval reaches past shorter ones that start after it: the group holds until its end.
    assert as_pairs(iv.union([0, 1, 5], [10, 2, 6])) == [(0.0, 10.0)]
    assert as_pairs(iv.union([3, 0, 1], [4, 10, 2])) == [(0.0, 10.0)]


def test_union_total_and_clip_match_plain_loops_on_random_sets():
    rng = random.Random(0)
    for _ in range(300):
        pairs = random_pairs(rng, rng.randint(0, 8))
        merged = iv.union(*arrays(pairs))
        assert as_pairs(merged) == plain_union(pairs)
        assert iv.total(merged) == len(cells(pairs))
        lo, hi = sorted(rng.sample(range(0, 30), 2))
        clipped = plain_union([(max(s, lo), min(e, hi)) for s, e in plain_union(pairs)])
        assert as_pairs(iv.clip(merged, lo, hi)) == clipped


def test_clip_keeps_the_part_inside_and_drops_what_only_touches():
    merged = iv.union([0.0, 10.0, 20.0], [5.0, 15.0, 25.0])
    assert as_pairs(iv.clip(merged, 5.0, 20.0)) == [(10.0, 15.0)]  # [0,5] and [20,25] only touch it
    assert as_pairs(iv.clip(merged, 3.0, 22.0)) == [(3.0, 5.0), (10.0, 15.0), (20.0, 22.0)]
    assert iv.total(iv.clip(merged, 3.0, 22.0)) == 2.0 + 5.0 + 2.0


def test_intersect_and_subtract_match_unit_cells():
    rng = random.Random(1)
    for _ in range(300):
        a, b = random_pairs(rng, rng.randint(0, 6)), random_pairs(rng, rng.randint(0, 6))
        ma, mb = iv.union(*arrays(a)), iv.union(*arrays(b))
        assert as_pairs(iv.intersect(ma, mb)) == from_cells(cells(a) & cells(b))
        assert as_pairs(iv.subtract(ma, mb)) == from_cells(cells(a) - cells(b))


def test_intersect_and_subtract_at_shared_boundaries():
    a, b = iv.union([0.0], [10.0]), iv.union([10.0], [20.0])  # touching: no common time
    assert as_pairs(iv.intersect(a, b)) == []
    assert as_pairs(iv.subtract(a, b)) == [(0.0, 10.0)]
    a, b = iv.union([0.0], [10.0]), iv.union([0.0], [10.0])  # equal
    assert as_pairs(iv.intersect(a, b)) == [(0.0, 10.0)]
    assert as_pairs(iv.subtract(a, b)) == []
    a, b = iv.union([0.0], [10.0]), iv.union([2.0, 6.0], [4.0, 8.0])  # holes inside
    assert as_pairs(iv.intersect(a, b)) == [(2.0, 4.0), (6.0, 8.0)]
    assert as_pairs(iv.subtract(a, b)) == [(0.0, 2.0), (4.0, 6.0), (8.0, 10.0)]
    assert as_pairs(iv.subtract(a, iv.empty())) == [(0.0, 10.0)]
    assert as_pairs(iv.subtract(iv.empty(), a)) == []
    assert as_pairs(iv.intersect(a, iv.empty())) == []


def plain_overlap(pairs: Pairs, lo: float, hi: float) -> float:
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in plain_union(pairs))


def test_overlap_per_window_matches_a_plain_loop():
    rng = random.Random(2)
    for _ in range(300):
        pairs = random_pairs(rng, rng.randint(0, 8))
        merged = iv.union(*arrays(pairs))
        windows = [tuple(sorted(rng.sample(range(-3, 35), 2))) for _ in range(6)]
        windows += [(s, e) for s, e in plain_union(pairs)[:2]]  # windows on an interval's own ends
        got = iv.overlap_per_window(merged, np.array([w[0] for w in windows]), np.array([w[1] for w in windows]))
        assert got.tolist() == [plain_overlap(pairs, lo, hi) for lo, hi in windows]


def test_overlap_per_window_at_an_intervals_ends():
    merged = iv.union([10.0, 30.0], [20.0, 40.0])
    starts = np.array([0.0, 10.0, 20.0, 15.0, 25.0, 40.0, 10.0, 5.0, 12.5])
    ends = np.array([10.0, 20.0, 30.0, 35.0, 30.0, 50.0, 40.0, 45.0, 12.5])
    assert iv.overlap_per_window(merged, starts, ends).tolist() == [0.0, 10.0, 0.0, 10.0, 0.0, 0.0, 20.0, 20.0, 0.0]
    assert iv.overlap_per_window(iv.empty(), np.array([0.0, 1.0]), np.array([5.0, 2.0])).tolist() == [0.0, 0.0]


def plain_stacked(pairs: Pairs, values: list[float]) -> list[tuple[float, float, float]]:
    """merge_ranges_with_value: between consecutive distinct points, the summed value of what covers it."""
    points = sorted({p for pair in pairs for p in pair})
    out = []
    for a, b in itertools.pairwise(points):
        level = sum(v for (s, e), v in zip(pairs, values, strict=True) if s <= a and e >= b)
        if level > 0:
            out.append((a, b, min(level, 1.0)))
    return out


def test_stacked_values_match_a_sweep_over_points():
    rng = random.Random(3)
    for _ in range(300):
        pairs = random_pairs(rng, rng.randint(0, 7))
        values = [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0, 2.0]) for _ in pairs]
        s, e, v = iv.stacked_values(*arrays(pairs), values)
        assert list(zip(s.tolist(), e.tolist(), v.tolist(), strict=True)) == plain_stacked(pairs, values)


def test_stacked_values_at_shared_boundaries():
    # Back to back at 10: the level never drops to 0 there, and never doubles either.
    s, e, v = iv.stacked_values([0.0, 10.0], [10.0, 20.0], [0.5, 0.25])
    assert (s.tolist(), e.tolist(), v.tolist()) == ([0.0, 10.0], [10.0, 20.0], [0.5, 0.25])
    s, e, v = iv.stacked_values([0.0, 5.0], [10.0, 15.0], [0.75, 0.75])  # clamped to 1 where they overlap
    assert (s.tolist(), e.tolist(), v.tolist()) == ([0.0, 5.0, 10.0], [5.0, 10.0, 15.0], [0.75, 1.0, 0.75])
    s, e, v = iv.stacked_values([3.0], [3.0], [0.5])  # zero-length: no segment
    assert (s.tolist(), e.tolist(), v.tolist()) == ([], [], [])
    s, e, v = iv.stacked_values([], [], [])
    assert (len(s), len(e), len(v)) == (0, 0, 0)


def plain_busy_per_group(groups: list[int], pairs: Pairs, n: int) -> list[float]:
    return [float(len(cells([p for g, p in zip(groups, pairs, strict=True) if g == k]))) for k in range(n)]


def test_busy_per_group_matches_unit_cells():
    rng = random.Random(4)
    for _ in range(300):
        pairs = random_pairs(rng, rng.randint(0, 9))
        groups = [rng.randint(0, 2) for _ in pairs]
        got = iv.busy_per_group(np.array(groups, dtype=np.int64), *map(np.array, arrays(pairs)), 4)
        assert got.tolist() == plain_busy_per_group(groups, pairs, 4)


def test_busy_per_group_does_not_carry_reach_across_groups():
    # Group 0 reaches to 100; group 1's interval starts before that and must still count whole.
    got = iv.busy_per_group(np.array([0, 1, 1]), np.array([0.0, 10.0, 12.0]), np.array([100.0, 20.0, 15.0]), 3)
    assert got.tolist() == [100.0, 10.0, 0.0]
    # Groups given as whole floats (codes read from a float column) are group numbers all the same.
    got = iv.busy_per_group(np.array([0.0, 1.0, 1.0]), np.array([0.0, 10.0, 12.0]), np.array([100.0, 20.0, 15.0]), 2)
    assert got.tolist() == [100.0, 10.0]
    assert iv.busy_per_group(np.array([], dtype=np.int64), np.array([]), np.array([]), 2).tolist() == [0.0, 0.0]
