"""Per-window tables: the vectorised pass agrees with the per-window definition."""

import pytest

from profiling.analysis import analyze, analyze_file
from profiling.structure import nest
from profiling.trace import load_trace, parse_trace
from profiling.windows import annotation_windows, per_window, window_stats, window_table
from tests.conftest import DATA


def test_step_table_matches_window_stats_step_by_step():
    trace = load_trace(DATA / "sampled_training_rank0.json.gz")
    steps = analyze_file(DATA / "sampled_training_rank0.json.gz").steps
    assert len(steps) == 2
    for row in steps.to_dict(orient="records"):
        one = window_stats(trace, row["step"])
        assert row["ops"] == len(one.ops)
        assert row["gpu activities"] == len(one.gpu)
        assert row["kernel time (us)"] == pytest.approx(one.gpu.loc[one.gpu["cat"] == "kernel", "dur"].sum())


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


MEASURED_FORWARD = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"


def test_gpu_windows_on_a_real_a100_trace():
    """The forward path on CUDA, on a real trace: launches inside the window, matched by correlation id."""
    trace = load_trace(DATA / "a100_simple_add.json.gz")
    stats = window_stats(trace, MEASURED_FORWARD)
    assert stats.on_gpu and stats.count == 2 and len(stats.gpu) > 0
    assert stats.kernels_per_window == len(stats.gpu) / 2
    assert stats.device_ms > 0 and stats.cpu_ms > stats.device_ms
    rows = per_window(trace, annotation_windows(trace, MEASURED_FORWARD))
    assert rows["gpu"].sum() == len(stats.gpu) and rows["ops"].sum() == len(stats.ops)


def test_overhead_bound_per_window_on_a_real_trace():
    from profiling.insights import find_insights
    from profiling.tables import kernel_table

    trace = load_trace(DATA / "a100_simple_add.json.gz")
    stats = window_stats(trace, MEASURED_FORWARD)
    found = {i.rule: i for i in find_insights(trace, stats, kernel_table(trace, stats))}
    overhead = found["overhead_bound"]
    assert overhead.text.startswith("Overhead-bound (the CPU is the bottleneck)")
    assert f"per {MEASURED_FORWARD}" in overhead.text
    assert overhead.evidence["gap_ms"] == pytest.approx(overhead.evidence["device_ms"] - overhead.evidence["busy_ms"])


def test_launches_sharing_a_correlation_id_count_its_work_once_in_every_table():
    """Two launches with one correlation id (a merged or crafted file): the GPU work goes to the first
    launch in the file only (`launches.first_launches`), in the steps and annotation tables as in the op
    table, so a 10 µs kernel is 10 µs once, in the step whose launch came first."""
    from profiling.analysis import analyze

    def x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: float) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}

    events = [
        x("user_annotation", "ProfilerStep#1", 0, 100),
        x("user_annotation", "ProfilerStep#2", 100, 100),
        x("user_annotation", "fwd", 10, 170),  # around both launches
        x("cpu_op", "aten::add", 20, 10),
        x("cuda_runtime", "cudaLaunchKernel", 21, 2, correlation=5),
        x("cpu_op", "aten::mul", 120, 10),
        x("cuda_runtime", "cudaLaunchKernel", 121, 2, correlation=5),  # the same id again, in step 2
        x("kernel", "k", 150, 10, tid=7, correlation=5, stream=7, device=0),
    ]
    analysis = analyze(parse_trace(__import__("json").dumps(events).encode()))
    steps = analysis.steps.set_index("step")
    assert list(steps["gpu activities"]) == [1, 0] and list(steps["kernel time (us)"]) == [10, 0]
    fwd = analysis.annotations.set_index("annotation").loc["fwd"]
    assert (fwd["kernels/window"], fwd["kernel time (us)"]) == (1, 10)
    ops = analysis.op_table.set_index("name")
    assert (ops.loc["aten::add", "self device (us)"], ops.loc["aten::mul", "self device (us)"]) == (10, 0)


def test_the_analysis_drops_its_placed_events_and_a_later_table_places_them_again():
    # The events placed by lane and start are memory held per aten op and launch: kept through the analysis's
    # window tables only, so the drawing after it has that room.
    trace = load_trace(DATA / "sampled_training_rank0.json.gz")
    analysis = analyze(trace)
    assert not trace.derived.lane_times
    names = list(analysis.annotations["annotation"])
    again = window_table(trace, names)
    assert again.equals(analysis.annotations)
    assert trace.derived.lane_times  # placed again, for the next table
