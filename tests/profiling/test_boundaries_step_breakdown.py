"""The plugin's steps at their boundaries (issue 17: mutants at the boundaries).

Which step a launch belongs to when it starts at a step's start, ends at its end, has zero length
at a shared boundary or crosses one; how GPU work past a step's end moves the next step's start;
the 80% rule for a partial last step. Each case is checked against `plain_steps` and
`plain_breakdown` (tests/profiling/test_step_breakdown.py: the plugin's two-pointer merge and a
sweep, in plain Python) and against the numbers worked out by hand in its comment.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from profiling import step_breakdown as sb
from tests.profiling.test_boundaries_gpu_metrics import kernel, launch, step, trace_of
from tests.profiling.test_step_breakdown import plain_breakdown, plain_steps


def op(ts: float, dur: float, name: str = "aten::mm") -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur}


def launched(ts: float, dur: float, correlation: int, k_ts: float, k_dur: float, **args: Any) -> list[dict[str, Any]]:
    """A launch at [ts, ts + dur] and the kernel it put on the GPU at [k_ts, k_ts + k_dur]."""
    return [launch(ts, dur, correlation), kernel(k_ts, k_dur, correlation=correlation, **args)]


def plain(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events as `plain_steps` reads them: host ones with a pid and tid, every one with args."""
    return [{"pid": 1, "tid": 1, "args": {}, **e} for e in events]


def ours(events: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    steps = sb.adjusted_steps(trace_of(events))
    return list(zip(steps["step"], steps["start"].astype(float), steps["end"].astype(float), strict=True))


def check(events: list[dict[str, Any]], expected: list[tuple[str, float, float]]) -> None:
    assert plain_steps(plain(events)) == expected  # the hand-worked numbers are the plugin's rule
    assert ours(events) == expected


def test_a_launch_starting_at_a_steps_start_belongs_to_that_step():
    # Steps [0, 10] and [10, 20]. The launch [10, 11] starts at step 2's start: its kernel [25, 30]
    # extends step 2 to 30. Were it read as step 1's (or no step's), step 2 would end at 20.
    events = [step(0, 10, 1), step(10, 10, 2), op(1, 2), *launched(10, 1, 1, 25, 5)]
    check(events, [("ProfilerStep#1", 0.0, 10.0), ("ProfilerStep#2", 10.0, 30.0)])


def test_a_launch_ending_at_a_steps_end_belongs_to_it_and_one_ending_later_to_none():
    # Launch [8, 10] ends at step 1's end: its kernel [12, 15] is step 1's, so step 1 ends at 15 and
    # step 2 starts there. Launch [18, 20.5] crosses step 2's end: its kernel [40, 50] is no step's
    # (else step 2 would end at 50). Step 2's own launch [12, 13] runs [16, 17], before its CPU end 20.
    events = [step(0, 10, 1), step(10, 10, 2), *launched(8, 2, 1, 12, 3), *launched(18, 2.5, 2, 40, 10)]
    events += launched(12, 1, 3, 16, 1)
    check(events, [("ProfilerStep#1", 0.0, 15.0), ("ProfilerStep#2", 15.0, 20.0)])
    counts = sb.adjusted_steps(trace_of(events))["gpu_activities"].tolist()
    assert counts == [1, 1]


def test_a_zero_length_launch_at_a_shared_boundary_belongs_to_the_earlier_step():
    # Steps [0, 10] and [10, 20]; a 0 µs launch at 10 is inside both: the plugin's merge gives it to
    # step 1. Its kernel [30, 31] then ends step 1 at 31; step 2's launch [12, 13] runs [32, 33], so
    # step 2 is [31, 33]. Given to step 2, it would leave step 1 [0, 10] and step 2 [10, 33].
    events = [step(0, 10, 1), step(10, 10, 2), *launched(10, 0, 1, 30, 1), *launched(12, 1, 2, 32, 1)]
    check(events, [("ProfilerStep#1", 0.0, 31.0), ("ProfilerStep#2", 31.0, 33.0)])
    assert sb.adjusted_steps(trace_of(events))["gpu_activities"].tolist() == [1, 1]
    k = sb._step_of_launch(np.array([0.0, 10.0]), np.array([10.0, 20.0]), np.array([10.0]), np.array([10.0]))
    assert k.tolist() == [0]


def test_step_of_launch_at_every_edge():
    starts, ends = np.array([0.0, 10.0, 30.0]), np.array([10.0, 20.0, 40.0])
    launch_start = np.array([-1.0, 0.0, 5.0, 9.0, 10.0, 19.0, 20.0, 25.0, 30.0, 40.0, 41.0, 10.0])
    launch_end = np.array([1.0, 1.0, 10.0, 11.0, 10.0, 20.0, 20.0, 26.0, 40.0, 40.0, 42.0, 20.5])
    # Plainly: the first step wholly containing the launch, else -1.
    expected = []
    for s, e in zip(launch_start, launch_end, strict=True):
        inside = [i for i in range(3) if starts[i] <= s and e <= ends[i]]
        expected.append(inside[0] if inside else -1)
    assert expected == [-1, 0, 0, -1, 0, 1, 1, -1, 2, 2, -1, -1]
    assert sb._step_of_launch(starts, ends, launch_start, launch_end).tolist() == expected


def test_gpu_work_past_a_step_moves_the_next_steps_start():
    # Step 1 [0, 10] launches a kernel [5, 25]: it ends at 25, after step 2's CPU end 20, so step 2
    # is [25, 25] unless its own work reaches further: its kernel [26, 28] ends it at 28.
    events = [step(0, 10, 1), step(10, 10, 2), *launched(1, 1, 1, 5, 20), *launched(12, 1, 2, 26, 2)]
    check(events, [("ProfilerStep#1", 0.0, 25.0), ("ProfilerStep#2", 25.0, 28.0)])


def test_unmatched_gpu_work_before_the_first_steps_work_moves_its_start():
    # A kernel [2, 4] with no launch ends before step 1's first kernel [6, 8]: step 1 starts at 4.
    # A second unmatched kernel ending at 7, after 6, does not count.
    events = [step(0, 10, 1), step(10, 10, 2), kernel(2, 2), kernel(5, 2), *launched(1, 1, 1, 6, 2)]
    events.append(launched(11, 1, 2, 12, 1)[0])  # a launch in step 2 without a kernel
    events.append(kernel(12, 1, correlation=2))
    check(events, [("ProfilerStep#1", 4.0, 10.0), ("ProfilerStep#2", 10.0, 20.0)])
    # Without work in step 1, its start stays at its CPU start.
    quiet = [step(0, 10, 1), step(10, 10, 2), kernel(2, 2), *launched(11, 1, 2, 12, 1)]
    check(quiet, [("ProfilerStep#1", 0.0, 10.0), ("ProfilerStep#2", 10.0, 20.0)])


def tail(counts: list[int]) -> list[dict[str, Any]]:
    """Steps [10i, 10i + 10], step i launching counts[i] kernels, each 1 µs inside it."""
    events, corr = [], 0
    for i, n in enumerate(counts):
        events.append(step(10 * i, 10, i + 1))
        for j in range(n):
            corr += 1
            events += launched(10 * i + 0.1 * j, 0.05, corr, 10 * i + 0.1 * j + 0.01, 0.01)
    return events


@pytest.mark.parametrize(
    "counts",
    [[5, 4], [5, 3], [10, 8], [10, 7], [5, 4, 0], [5, 0, 3], [0, 5], [0, 0], [5], [3, 5, 0, 0], [5, 5, 3]],
)
def test_the_80_percent_rule_for_a_partial_last_step(counts):
    # Trailing steps that launched nothing go; then the last launching step goes if it launched fewer
    # than 80% of the step before it: n_last < 0.8 n_before, in whole numbers 5 n_last < 4 n_before.
    keep = len(counts)
    if len(counts) > 1 and any(counts):
        last = max(i for i, n in enumerate(counts) if n)
        keep = last if last > 0 and 5 * counts[last] < 4 * counts[last - 1] else last + 1
    got = sb.adjusted_steps(trace_of(tail(counts)))
    assert len(got) == keep
    assert len(plain_steps(plain(tail(counts)))) == keep
    assert got["gpu_activities"].tolist() == counts[:keep]
    assert sb._steps_kept(np.array(counts)) == keep


def test_steps_span_covers_the_kept_steps():
    events = tail([5, 3])  # the second step is partial: the span is the first step's
    assert sb.steps_span(trace_of(events)) == (0.0, 10.0)
    assert sb.steps_span(trace_of(tail([5, 4]))) == (0.0, 20.0)


def test_breakdown_of_kernels_crossing_step_boundaries_matches_a_sweep():
    # Step 1 [0, 10] launches [1, 2] -> kernel [8, 14]; step 2 [10, 20] launches [15, 16] -> kernel
    # [16, 30]; step 1 ends at 14, step 2 is [14, 30]. The kernel time splits at 14, not at 10.
    events = [step(0, 10, 1), step(10, 10, 2), op(0, 3), op(14, 3)]
    events += launched(1, 1, 1, 8, 6) + launched(15, 1, 2, 16, 14)
    steps = plain_steps(plain(events))
    assert steps == [("ProfilerStep#1", 0.0, 14.0), ("ProfilerStep#2", 14.0, 30.0)]
    result = sb.step_breakdown(trace_of(events))
    expected = plain_breakdown(plain(events), steps)
    assert [e["kernel"] for e in expected] == [6.0, 14.0]
    for role in ["kernel", "runtime", "cpu_exec", "other"]:
        assert result.per_step[f"{role} (us)"].tolist() == pytest.approx([e[role] for e in expected])
    assert result.per_step["step time (us)"].tolist() == [14.0, 16.0]
    assert result.average_step_time_us == 15.0
    assert result.breakdown_us["kernel"] == pytest.approx((6.0 + 14.0) / 2)
    assert "communication" not in result.breakdown_us


def test_touching_and_zero_length_events_in_the_breakdown():
    # One step [0, 20]: op [0, 5] and op [5, 10] touch (10 of cpu_exec); a 0 µs op adds nothing; a
    # 0 µs launch at 10 adds no runtime; a kernel [10, 12] is 2 of kernel; [12, 20] is other.
    events = [step(0, 20, 1), op(0, 5), op(5, 5), op(15, 0), *launched(10, 0, 1, 10, 2)]
    got = sb.step_breakdown(trace_of(events)).per_step.iloc[0]
    assert (got["cpu_exec (us)"], got["runtime (us)"], got["kernel (us)"], got["other (us)"]) == (10.0, 0.0, 2.0, 8.0)
    expected = plain_breakdown(plain(events), plain_steps(plain(events)))[0]
    assert (expected["cpu_exec"], expected["kernel"], expected["other"]) == (10.0, 2.0, 8.0)


def test_step_names_are_whole_and_at_most_18_digits():
    assert sb.is_step_name("ProfilerStep#0") and sb.is_step_name("ProfilerStep#" + "9" * 18)
    for name in [
        "ProfilerStep#" + "9" * 19,
        "ProfilerStep#1\n",
        "ProfilerStep#",
        "xProfilerStep#1",
        "ProfilerStep#\u0661",
    ]:
        assert not sb.is_step_name(name), name


def test_a_step_recorded_twice_counts_once_and_a_repeated_name_elsewhere_twice():
    events = [step(0, 10, 1), step(0, 10, 1), step(20, 10, 1), step(10, 10, 2), op(1, 1)]
    events.append({**step(40, 10, 3), "cat": "cpu_op"})  # a step recorded as an op is a step too
    events.append({**step(60, 10, 4), "cat": "python_function"})  # as a Python call it is not
    steps = sb.profiler_steps(trace_of(events))
    assert steps["name"].tolist() == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#1", "ProfilerStep#3"]
    assert steps["ts"].tolist() == [0.0, 10.0, 20.0, 40.0]
    assert steps[sb.POSITION].tolist() == [0, 1, 2, 3]


def test_launch_spans_take_the_first_launch_of_each_correlation():
    events = [step(0, 100), launch(20, 5, 5), launch(10, 2, 5), launch(30, 1, 6), op(40, 2)]
    events.append({**launch(50, 3, 7), "cat": "cuda_driver", "name": "cuLaunchKernel"})
    starts, ends = sb.launch_spans(trace_of(events), np.array([5.0, 6.0, 7.0, 9.0, np.nan]))
    # Correlation 5: the launch first in the file ([20, 25]), not the earlier one in time.
    assert starts[:3].tolist() == [20.0, 30.0, 50.0] and ends[:3].tolist() == [25.0, 31.0, 53.0]
    assert np.isnan(starts[3:]).all() and np.isnan(ends[3:]).all()


def test_every_role_at_its_priority_matches_a_sweep():
    # One step [0, 40]. Dataloader [0, 5]; nccl:all_reduce op [5, 8] with external id 77 (communication);
    # a kernel named nccl [9, 11] and one with external id 77 [12, 13] (communication); memcpy [14, 16]
    # under a kernel [15, 17] (the kernel wins [15, 16]); memset [18, 19]; an op [17, 22] around it and
    # a launch [20, 21] (runtime over CPU exec: 3 of CPU exec left); a python_function [30, 35] (no role).
    ext = {"External id": 77}
    events = [step(0, 40), {**op(0, 5, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")}]
    events += [{**op(5, 3, "nccl:all_reduce"), "args": ext}, kernel(9, 2, "ncclKernel_AllReduce")]
    events += [kernel(12, 1, "gemm", **ext), kernel(14, 2, "Memcpy HtoD", cat="gpu_memcpy"), kernel(15, 2)]
    events += [kernel(18, 1, "Memset", cat="gpu_memset"), op(17, 5), launch(20, 1, 99)]
    events += [{**op(30, 5, "f"), "cat": "python_function"}]
    result = sb.step_breakdown(trace_of(events))
    expected = plain_breakdown(plain(events), [("ProfilerStep#1", 0.0, 40.0)])[0]
    by_hand = {"kernel": 2, "memcpy": 1, "memset": 1, "communication": 3 + 2 + 1, "runtime": 1}
    by_hand |= {"dataloader": 5, "cpu_exec": (18 - 17) + (20 - 19) + (22 - 21)}
    assert {role: expected[role] for role in by_hand} == by_hand
    row = result.per_step.iloc[0]
    for role in [*by_hand, "other"]:
        assert row[f"{role} (us)"] == pytest.approx(expected[role]), role
    assert result.breakdown_us["communication"] == pytest.approx(6.0)


def test_without_profiler_steps_the_fallback_step_spans_the_ops_and_the_work_they_launched():
    # Ops [5, 10] and [20, 30]; the launch [21, 22] puts a kernel at [40, 50]: step "0" is [5, 50].
    events = [op(5, 5), op(20, 10), *launched(21, 1, 1, 40, 10)]
    check(events, [("0", 5.0, 50.0)])
    t = trace_of(events)
    assert sb.steps_source(t) == "fallback" and sb.steps_span(t) == (5.0, 50.0)
    with_steps = trace_of([step(0, 100), *events])
    assert sb.steps_source(with_steps) == "profiler_steps"


def test_without_any_host_op_the_span_is_the_whole_trace_and_without_events_none():
    t = trace_of([kernel(3, 2), kernel(10, 10), launch(1, 1, 9)])
    assert sb.steps_source(t) is None and sb.steps_span(t) == (1.0, 20.0)
    assert sb.step_breakdown(t).average_step_time_us is None
    assert sb.steps_span(trace_of([{"ph": "i", "name": "mark", "ts": 5, "s": "t"}])) is None


def test_python_events_are_cpu_work_only_in_2021_spelling():
    # One step [0, 20], an op [15, 16] and a Python call [2, 8]: the call is 6 µs of CPU exec when spelled
    # 2021's `Python`, else other. (The op keeps plain_breakdown's sweep from an empty list of points.)
    for spelling, cpu_exec in [("Python", 6.0 + 1.0), ("python_function", 1.0)]:
        events = [step(0, 20), op(15, 1), {**op(2, 6, "f"), "cat": spelling}]
        row = sb.step_breakdown(trace_of(events)).per_step.iloc[0]
        expected = plain_breakdown(plain(events), [("ProfilerStep#1", 0.0, 20.0)])[0]
        assert row["cpu_exec (us)"] == expected["cpu_exec"] == cpu_exec, spelling
        assert row["other (us)"] == expected["other"] == 20.0 - cpu_exec
