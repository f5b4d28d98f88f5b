"""`windows.LaneTimes`: events placed once by lane and start, then each set of windows by binary search. It
must pick, for every event, the window a plain loop picks, and agree with `latest_start_on_lane` (the one
sort of windows and events together that the other callers keep) on every input, missing starts included."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from profiling.windows import LaneTimes, latest_start_on_lane

lanes = st.integers(0, 3)
starts = st.sampled_from([0.0, 0.5, 1.0, 2.0, 2.5, 3.0, 7.0, 1.7e15])  # repeats, and a start no event has


def plain_latest(windows: list[tuple[int, float]], events: list[tuple[int, float]]) -> list[int]:
    """Per event, the window on its lane that started last at or before it (the last listed of equal starts)."""
    found = []
    for lane, ts in events:
        best = -1
        for k, (window_lane, start) in enumerate(windows):
            if window_lane == lane and start <= ts and (best < 0 or start >= windows[best][1]):
                best = k
        found.append(best)
    return found


@settings(max_examples=300, deadline=None)
@given(
    windows=st.lists(st.tuples(lanes, starts), min_size=0, max_size=12),
    events=st.lists(st.tuples(st.integers(0, 4), starts), min_size=0, max_size=30),
)
def test_the_window_a_plain_loop_picks(windows, events):
    placed = LaneTimes.of(np.array([e[0] for e in events], int), np.array([e[1] for e in events], float))
    got = placed.latest_start(np.array([w[0] for w in windows], int), np.array([w[1] for w in windows], float))
    assert got.tolist() == plain_latest(windows, events)


@settings(max_examples=300, deadline=None)
@given(
    windows=st.lists(st.tuples(lanes, starts), min_size=1, max_size=12),
    events=st.lists(st.tuples(st.integers(0, 4), starts | st.just(math.nan)), min_size=0, max_size=30),
)
def test_the_same_answer_as_one_sort_of_windows_and_events(windows, events):
    window_lane, window_start = np.array([w[0] for w in windows], int), np.array([w[1] for w in windows], float)
    lane, ts = np.array([e[0] for e in events], int), np.array([e[1] for e in events], float)
    want = latest_start_on_lane(window_lane, window_start, lane, ts)
    assert LaneTimes.of(lane, ts).latest_start(window_lane, window_start).tolist() == want.tolist()


@settings(max_examples=300, deadline=None)
@given(
    windows=st.lists(st.tuples(lanes, starts, starts | st.just(math.nan)), min_size=1, max_size=12),
    events=st.lists(st.tuples(st.integers(0, 4), starts | st.just(math.nan)), min_size=0, max_size=30),
)
def test_a_windows_reach_keeps_exactly_its_members_that_start_by_it(windows, events):
    # `window_of` asks only for the events that start by a window's end (+ 1 ns): the members without a reach,
    # in the same order, less those that start after it (or have no start); none where the reach is NaN.
    window_lane, window_start = np.array([w[0] for w in windows], int), np.array([w[1] for w in windows], float)
    reach = np.array([w[2] for w in windows], float)
    lane, ts = np.array([e[0] for e in events], int), np.array([e[1] for e in events], float)
    placed = LaneTimes.of(lane, ts)
    every = zip(*placed.members(window_lane, window_start), strict=True)
    want = [(w, e) for w, e in every if ts[e] <= reach[w]]
    assert list(zip(*placed.members(window_lane, window_start, reach), strict=True)) == want
