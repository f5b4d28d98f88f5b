"""Per-window tables: the vectorised pass agrees with the per-window definition."""

import pytest

from profiling.analyze import analyze_file
from profiling.structure import nest
from profiling.trace import load_trace, parse_trace
from profiling.windows import annotation_windows, per_window, window_stats
from tests.conftest import DATA


def test_step_table_matches_window_stats_step_by_step():
    trace = load_trace(DATA / "sampled_training_rank0.json.gz")
    steps = analyze_file(DATA / "sampled_training_rank0.json.gz").steps
    assert len(steps) == 2
    for row in steps.itertuples():
        one = window_stats(trace, row.step)
        assert row.ops == len(one.ops)
        assert row._5 == len(one.gpu)  # "gpu activities"
        assert row._6 == pytest.approx(one.gpu.loc[one.gpu["cat"] == "kernel", "dur"].sum())


def test_per_window_on_our_forwards(cpu_runs):
    trace = cpu_runs["naive"].trace
    rows = per_window(trace, annotation_windows(trace))
    assert list(rows["ops"]) == [cpu_runs["naive"].summary["ops_per_forward"]] * 3
    assert rows["device_ms"].isna().all()  # a CPU run launched nothing


def test_nesting_depth_and_parent():
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "outer", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "ts": 1, "dur": 5, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "leaf", "ts": 2, "dur": 1, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "sibling", "ts": 7, "dur": 2, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "other-thread", "ts": 2, "dur": 1, "pid": 1, "tid": 2},
    ]
    trace = parse_trace(__import__("json").dumps(events).encode())
    depth, parent = nest(trace.events)
    assert list(depth) == [0, 1, 2, 1, 0]
    assert list(parent) == [-1, 0, 1, 0, -1]
