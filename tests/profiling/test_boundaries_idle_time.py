"""Idle time at its boundaries (issue 17: mutants at the boundaries).

Merged idle time over the steps' span with kernels crossing it, touching or of zero length; HTA's
per-stream rules at their edges: a launch exactly at the previous end, a gap of exactly the delay,
activity inside a longer earlier one, streams and devices told apart. Expected values are worked
out by hand in the comments, never read from the code.
"""

from __future__ import annotations

import pytest

from profiling.idle_time import CONSECUTIVE_KERNEL_DELAY_US, idle_breakdown_us, idle_time, merged_idle_us
from tests.profiling.test_boundaries_gpu_metrics import kernel, launch, step, trace_of


def waits(host: float = 0.0, kernel_wait: float = 0.0, other: float = 0.0) -> dict[str, float]:
    return {"host_wait": host, "kernel_wait": kernel_wait, "other": other}


def test_merged_idle_clips_kernels_to_the_span():
    # Step [0, 100]; kernels without launches: [-20, 10] gives 10 inside, [40, 40] nothing,
    # [50, 60] and [60, 70] touch at 60 (20 together), [90, 130] gives 10. Busy 40, idle 60.
    t = trace_of([step(0, 100), kernel(-20, 30), kernel(40, 0), kernel(50, 10), kernel(60, 10), kernel(90, 40)])
    assert merged_idle_us(t) == pytest.approx(100 - (10 + 20 + 10))


def test_merged_idle_spans_every_step_and_is_none_without_kernels():
    # Steps [0, 50] and [50, 100]: span [0, 100]; one kernel [45, 55] across the step boundary.
    t = trace_of([step(0, 50, 1), step(50, 50, 2), kernel(45, 10)])
    assert merged_idle_us(t) == pytest.approx(90.0)
    assert merged_idle_us(trace_of([step(0, 50)])) is None
    assert idle_time(trace_of([step(0, 50)])) == {"idle_time_us": None, "idle_breakdown_us": None}


def test_merged_idle_of_kernels_on_several_gpus_is_their_union():
    # [10, 30] on GPU 0 and [20, 40] on GPU 1: busy [10, 40], idle 100 - 30.
    t = trace_of([step(0, 100), kernel(10, 20, device=0), kernel(20, 20, device=1)])
    assert merged_idle_us(t) == pytest.approx(70.0)


def test_a_launch_exactly_at_the_previous_end_is_not_a_host_wait():
    # Stream 7: k1 [0, 10]; k2 launched at 10 (not after 10) runs [15, 20]: a 5 µs kernel_wait.
    # k3 launched at 20.5, after k2's end, runs [25, 30]: a 5 µs host_wait.
    t = trace_of(
        [
            step(-50, 200),
            kernel(0, 10, correlation=1),
            launch(10, 0.5, 2),
            kernel(15, 5, correlation=2),
            launch(20.5, 1, 3),
            kernel(25, 5, correlation=3),
        ]
    )
    assert idle_breakdown_us(t) == {"7": waits(host=5.0, kernel_wait=5.0)}


def test_a_gap_of_exactly_the_delay_is_other():
    delay = CONSECUTIVE_KERNEL_DELAY_US
    assert delay == 30.0
    # Gaps of 29.5 (kernel_wait), then exactly 30 and 31 (other); no launches, so never host_wait.
    t = trace_of([step(0, 300), kernel(0, 10), kernel(39.5, 10), kernel(79.5, 10), kernel(120.5, 10)])
    assert idle_breakdown_us(t) == {"7": waits(kernel_wait=29.5, other=30.0 + 31.0)}
    # With a delay of 31, the 30 µs gap is a kernel_wait; 31 is still other.
    assert idle_breakdown_us(t, consecutive_kernel_delay_us=31.0) == {"7": waits(kernel_wait=29.5 + 30.0, other=31.0)}


def test_activity_inside_a_longer_earlier_one_waits_for_nothing():
    # k1 [0, 100]; k2 [10, 20] inside it: no gap. k3 [50, 60]: the stream was busy until 100, no gap
    # (not 30 after k2). k4 [130, 140]: 30 after 100, other. Memcpy and memset count as activity.
    t = trace_of(
        [
            step(0, 300),
            kernel(0, 100),
            kernel(10, 10, cat="gpu_memcpy", name="Memcpy HtoD"),
            kernel(50, 10, cat="gpu_memset", name="Memset"),
            kernel(130, 10),
        ]
    )
    assert idle_breakdown_us(t) == {"7": waits(other=30.0)}


def test_streams_are_separate_and_the_first_activity_has_no_gap():
    # Stream 7: [0, 10], [20, 30] (kernel_wait 10). Stream 8: [100, 110] alone: no gap at all.
    # Stream -1 (no stream) and a missing stream are not streams.
    t = trace_of(
        [
            step(0, 300),
            kernel(0, 10),
            kernel(20, 10),
            kernel(100, 10, stream=8),
            kernel(5, 1, stream=-1),
            kernel(200, 10, stream=None),
        ]
    )
    assert idle_breakdown_us(t) == {"7": waits(kernel_wait=10.0), "8": waits()}


def test_several_devices_key_their_streams_by_device():
    # Stream 7 on devices 0 and 1: separate. Device 0: [0, 10], [15, 20] (kernel_wait 5).
    # Device 1: [0, 10], [50, 60] (other 40).
    t = trace_of(
        [
            step(0, 300),
            kernel(0, 10, device=0),
            kernel(15, 5, device=0),
            kernel(0, 10, device=1),
            kernel(50, 10, device=1),
        ]
    )
    assert idle_breakdown_us(t) == {"0:7": waits(kernel_wait=5.0), "1:7": waits(other=40.0)}
    one_device = trace_of([step(0, 300), kernel(0, 10, device=3), kernel(15, 5, device=3)])
    assert idle_breakdown_us(one_device) == {"7": waits(kernel_wait=5.0)}
    # Two devices and activity with none: that one is keyed "-1".
    three = [kernel(0, 10, device=0), kernel(0, 10, device=1), kernel(0, 10, device=None), kernel(12, 1, device=None)]
    assert idle_breakdown_us(trace_of([step(0, 300), *three])) == {
        "-1:7": waits(kernel_wait=2.0),
        "0:7": waits(),
        "1:7": waits(),
    }
    # One device and activity with none: still one device, keyed by stream alone (no "-1:7").
    unnamed = trace_of([step(0, 300), kernel(0, 10, device=3), kernel(15, 5, device=None)])
    assert idle_breakdown_us(unnamed) == {"7": waits(kernel_wait=5.0)}


def test_idle_time_without_gpu_work_has_no_breakdown():
    t = trace_of([step(0, 100), kernel(0, 10, stream=-1)])
    got = idle_time(t)
    assert got["idle_breakdown_us"] is None
    assert got["idle_time_us"] == pytest.approx(90.0)  # the kernel still counts as busy time


def test_idle_time_reports_both_parts():
    # Step [0, 300]; kernels [0, 10] and [20, 30]: 20 busy, a 10 µs kernel_wait between them.
    got = idle_time(trace_of([step(0, 300), kernel(0, 10), kernel(20, 10)]))
    assert got == {"idle_time_us": pytest.approx(300.0 - 20.0), "idle_breakdown_us": {"7": waits(kernel_wait=10.0)}}
