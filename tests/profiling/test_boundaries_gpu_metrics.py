"""GPU metrics at their boundaries (issue 17: mutants at the boundaries).

Small traces built here, one ProfilerStep over [0, 100] µs unless said otherwise; kernels carry no
correlation id, so no launch extends the step and the steps' span is the step itself. Expected
values are worked out by hand in the comments (or by a loop), never read from the code.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from profiling import devices
from profiling import gpu_metrics as gm
from profiling.trace import Trace, parse_trace

TENSOR = "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn"  # decodes as tensor cores
PLAIN = "volta_sgemm_128x64_nn"  # decodes as not tensor cores
ELEMENTWISE = "elementwise_kernel"  # decodes as unknown


def step(ts: float, dur: float, number: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "ts": ts, "dur": dur}


def launch(ts: float, dur: float, correlation: int, **fields: Any) -> dict[str, Any]:
    event = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": dur}
    return {**event, "pid": 1, "tid": 1, "args": {"correlation": correlation}, **fields}


def kernel(ts: float, dur: float, name: str = PLAIN, cat: str = "kernel", pid: Any = 0, **args: Any) -> dict[str, Any]:
    """A GPU activity on device 0, stream 7 unless `args` says otherwise (`args` keys as Kineto writes them)."""
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": 7}
    return {**event, "args": {"device": 0, "stream": 7, **args}}


def trace_of(events: list[dict[str, Any]], properties: list[dict[str, Any]] | None = None) -> Trace:
    host = [{"pid": 1, "tid": 1, **e} for e in events]  # events without pid/tid are the host's
    document: dict[str, Any] = {"traceEvents": host}
    if properties is not None:
        document["deviceProperties"] = properties
    return parse_trace(json.dumps(document).encode())


def metrics(*kernels: dict[str, Any], span: tuple[float, float] = (0.0, 100.0), **kw: Any) -> dict[str, Any]:
    return gm.gpu_metrics(trace_of([step(span[0], span[1] - span[0]), *kernels], **kw))


# --- which device a kernel ran on --------------------------------------------------------------


def test_device_zero_and_the_largest_index_are_devices_and_the_pid_is_the_fallback():
    t = trace_of(
        [
            kernel(0, 1, pid=5, device=0),  # device 0 is a device: not the pid
            kernel(1, 1, pid=5, device=2**31 - 1),  # the largest index is one too
            kernel(2, 1, pid=5, device=2**31),  # past it: the pid
            kernel(3, 1, pid=5, device=1.5),  # not whole: the pid
            kernel(4, 1, pid=6, device=-1),  # negative: the pid
            kernel(5, 1, pid="gpu", device=None),  # neither: NaN
            kernel(6, 1, pid=0, device=None),  # pid 0 is a device
        ]
    )
    got = devices.device_ids(t.kernels)
    assert got[:5].tolist() == [0.0, 2**31 - 1, 5.0, 5.0, 6.0]
    assert np.isnan(got[5]) and got[6] == 0.0


def test_device_properties_by_id_first_wins_and_by_position_within_bounds():
    index = devices.DeviceIndex.of(
        [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}, {"id": True, "name": "c"}, {"x": 0}]
    )
    assert index.entry(1)["name"] == "a"  # an id listed twice: the first entry
    assert index.entry(1.0)["name"] == "a"
    assert index.entry(0) == {}  # True is not an id 1 (nor 0)
    assert index.entry(None) == {"id": 1, "name": "a"}  # no device: the first entry
    by_position = devices.DeviceIndex.of([{"name": "p0"}, {"name": "p1"}])
    assert by_position.by_id is None
    assert [by_position.entry(d).get("name") for d in (0, 1, 2, -1)] == ["p0", "p1", None, None]
    assert devices.DeviceIndex.of([]).entry(None) == {}


def test_description_reads_either_spelling_and_refuses_what_is_not_a_count():
    new = {"name": "H100", "totalGlobalMem": 80, "computeMajor": 9, "computeMinor": 0, "numSms": 132}
    old = {"name": 7, "totalGlobalMem": -1, "major": 8, "minor": 6, "multiProcessorCount": 84}
    half = {"computeMajor": 9, "numSms": 1.5}
    assert devices.describe(new) == {
        "gpu_name": "H100",
        "gpu_memory_bytes": 80,
        "compute_capability": "9.0",
        "sm_count": 132,
        "gpu_arch": "sm_90",
    }
    assert devices.describe(old) == {
        "gpu_name": None,
        "gpu_memory_bytes": None,
        "compute_capability": "8.6",
        "sm_count": 84,
        "gpu_arch": "sm_86",
    }
    assert devices.describe(half)["compute_capability"] is None  # a major without a minor
    assert devices.describe(half)["sm_count"] is None and devices.describe(half)["gpu_arch"] is None
    assert devices.describe({}) == dict.fromkeys(gm.DEVICE_FIELDS)
    assert devices._int_or_none(0) == 0 and devices._int_or_none(2**63) == 2**63
    assert devices._int_or_none(-1) is None and devices._int_or_none(True) is None
    assert devices._int_or_none(float("nan")) is None


def test_2021_compute_properties_are_read_when_device_properties_are_absent():
    events = [step(0, 100), kernel(0, 10)]
    document = {"traceEvents": [{"pid": 1, "tid": 1, **e} for e in events]}
    document["computeProperties"] = [{"id": 0, "name": "V100", "numSms": 80}, "junk"]
    got = gm.gpu_metrics(parse_trace(json.dumps(document).encode()))
    assert (got["gpu_name"], got["sm_count"]) == ("V100", 80)


# --- valid values: the ends of the ranges are included ------------------------------------------


def test_occupancy_and_blocks_per_sm_keep_their_range_ends():
    occ = gm.valid_occupancy(np.array([-0.5, 0.0, 100.0, 100.5, np.nan]))
    assert occ[1:3].tolist() == [0.0, 100.0] and np.isnan(occ[[0, 3, 4]]).all()
    top = float(gm.MAX_GRID_BLOCKS)
    blocks = gm.valid_blocks_per_sm(np.array([-1.0, 0.0, top, top * 2]))
    assert blocks[1:3].tolist() == [0.0, top] and np.isnan(blocks[[0, 3]]).all()
    assert gm.MAX_GRID_BLOCKS == (2**31 - 1) * 65535 * 65535


# --- utilization, SM efficiency and occupancy over the steps' span -------------------------------


def test_kernels_crossing_the_span_count_only_inside_it():
    got = metrics(
        kernel(-20, 30, **{"blocks per SM": 0.5, "est. achieved occupancy %": 40}),  # [-20, 10]: 10 inside
        kernel(90, 40, **{"blocks per SM": 2.0, "est. achieved occupancy %": 10}),  # [90, 130]: 10 inside
    )
    assert got["gpu_utilization_percent"] == pytest.approx(100 * (10 + 10) / 100)
    assert got["sm_efficiency_percent"] == pytest.approx(100 * (10 * 0.5 + 10 * 1.0) / 100)  # 2.0 clamps to 1
    assert got["achieved_occupancy_percent"] == pytest.approx((40 * 10 + 10 * 10) / (10 + 10))


def test_kernels_touching_the_span_and_each_other():
    got = metrics(
        kernel(-10, 10, **{"blocks per SM": 1.0, "est. achieved occupancy %": 90}),  # ends where the span starts
        kernel(100, 10, **{"blocks per SM": 1.0, "est. achieved occupancy %": 90}),  # starts where it ends
        kernel(20, 10, **{"blocks per SM": 0.25, "est. achieved occupancy %": 0}),  # 0% counts
        kernel(30, 10, **{"blocks per SM": 0.5, "est. achieved occupancy %": 50}),  # back to back at 30
    )
    assert got["gpu_utilization_percent"] == pytest.approx(20.0)
    assert got["sm_efficiency_percent"] == pytest.approx(100 * (10 * 0.25 + 10 * 0.5) / 100)
    assert got["achieved_occupancy_percent"] == pytest.approx((0 * 10 + 50 * 10) / 20)


def test_zero_blocks_per_sm_and_missing_values_are_left_out():
    got = metrics(
        kernel(0, 50, **{"blocks per SM": 0, "est. achieved occupancy %": 200}),  # left out of both
        kernel(50, 10, **{"blocks per SM": 0.5}),  # no occupancy
        kernel(60, 10, **{"est. achieved occupancy %": 30}),  # no blocks
    )
    assert got["gpu_utilization_percent"] == pytest.approx(70.0)
    assert got["sm_efficiency_percent"] == pytest.approx(100 * 10 * 0.5 / 100)
    assert got["achieved_occupancy_percent"] == pytest.approx(30.0)
    none = metrics(kernel(0, 50, **{"blocks per SM": 0, "est. achieved occupancy %": -1}))
    assert none["sm_efficiency_percent"] is None and none["achieved_occupancy_percent"] is None
    assert none["gpu_utilization_percent"] == pytest.approx(50.0)


def test_work_outside_the_span_weighs_nothing_and_short_work_still_counts():
    # [0, 10] at 50% inside; [200, 210] at 10% wholly outside weighs 0 (not -100): the mean is 50.
    got = metrics(
        kernel(0, 10, **{"est. achieved occupancy %": 50}), kernel(200, 10, **{"est. achieved occupancy %": 10})
    )
    assert got["achieved_occupancy_percent"] == pytest.approx(50.0)
    # Under 1 µs of work in all is still work: 0.5 µs at 30% gives 30%, and it is all tensor-core time.
    short = metrics(kernel(10, 0.5, TENSOR, **{"est. achieved occupancy %": 30}))
    assert short["achieved_occupancy_percent"] == pytest.approx(30.0)
    assert short["tensor_core_time_percent"] == pytest.approx(100.0)


def test_a_kernel_missing_blocks_per_sm_before_the_others_is_left_out():
    # [0, 10] has no blocks per SM: left out, it must not poison the sum of those after it.
    got = metrics(kernel(0, 10), kernel(20, 10, **{"blocks per SM": 0.5}))
    assert got["sm_efficiency_percent"] == pytest.approx(100 * 10 * 0.5 / 100)


def test_occupancy_of_100_percent_everywhere_is_100_not_a_rounding_step_above():
    # 100% over 0.1, 0.1 and 0.7 µs: in float64 the weighted mean is 100.00000000000001.
    assert (100 * 0.1 + 100 * 0.1 + 100 * 0.7) / (0.1 + 0.1 + 0.7) > 100.0
    kernels = [kernel(0, d, "k", **{"est. achieved occupancy %": 100}) for d in (0.1, 0.1, 0.7)]
    assert metrics(*kernels)["achieved_occupancy_percent"] == 100.0
    assert gm.kernel_stats(trace_of(kernels)).loc["k", "achieved occupancy (%)"] == 100.0


def test_work_wholly_outside_the_span_gives_no_efficiency_or_occupancy():
    got = metrics(kernel(200, 10, **{"blocks per SM": 1.0, "est. achieved occupancy %": 50}))
    assert got["gpu_utilization_percent"] == 0.0
    assert got["sm_efficiency_percent"] is None and got["achieved_occupancy_percent"] is None


def test_a_huge_blocks_per_sm_does_not_swamp_a_small_one():
    # Unclamped, 1e18 + 0.5 - 1e18 is 0 in float64 and [10, 20] would look idle to the SMs.
    s, e, v = gm.sm_efficiency_ranges(
        trace_of([kernel(0, 10, **{"blocks per SM": 1e18}), kernel(5, 15, **{"blocks per SM": 0.5})]).kernels
    )
    assert list(zip(s.tolist(), e.tolist(), v.tolist(), strict=True)) == [
        (0.0, 5.0, 1.0),
        (5.0, 10.0, 1.0),
        (10.0, 20.0, 0.5),
    ]


def test_no_span_or_an_empty_span_leaves_the_metrics_out_but_not_the_tensor_core_share():
    kernels = trace_of([kernel(0, 10, TENSOR), kernel(10, 30, PLAIN)]).kernels
    uses = gm.tensor_core_use(kernels)
    for span in (None, (5.0, 5.0), (6.0, 5.0)):
        got = gm._device_metrics(kernels, span, uses)
        assert [got[k] for k in gm.METRICS[:3]] == [None, None, None]
        assert got["tensor_core_time_percent"] == pytest.approx(100 * 10 / 40)
    assert gm._device_metrics(kernels.iloc[:0], (0.0, 1.0), uses)["gpu_utilization_percent"] is None


def test_tensor_core_share_counts_only_known_tensor_core_kernels():
    got = metrics(kernel(0, 10, TENSOR), kernel(10, 20, PLAIN), kernel(30, 10, ELEMENTWISE), kernel(40, 10, TENSOR))
    assert got["tensor_core_time_percent"] == pytest.approx(100 * (10 + 10) / (10 + 20 + 10 + 10))
    kernels = trace_of([kernel(0, 0, TENSOR)]).kernels
    assert gm._tensor_core_share(kernels, gm.tensor_core_use(kernels)) is None  # no kernel time


# --- several GPUs ----------------------------------------------------------------------------------


def test_per_gpu_metrics_and_their_mean():
    got = metrics(
        kernel(0, 50, device=1, **{"est. achieved occupancy %": 20}),
        kernel(0, 10, device=0, **{"blocks per SM": 1.0}),
        properties=[{"id": 0, "name": "A", "numSms": 2}, {"id": 1, "name": "B", "numSms": 3}],
    )
    assert [g["device"] for g in got["gpus"]] == [0, 1]
    assert [g["gpu_name"] for g in got["gpus"]] == ["A", "B"]
    assert (got["gpu_name"], got["sm_count"], got["gpu_count"]) == ("A", 2, 2)  # the first GPU's description
    assert got["gpu_utilization_percent"] == pytest.approx((10.0 + 50.0) / 2)
    assert got["sm_efficiency_percent"] == pytest.approx(10.0)  # GPU 1 has none: the mean of GPU 0's alone
    assert got["achieved_occupancy_percent"] == pytest.approx(20.0)


def test_more_gpus_than_listed_keeps_the_busiest_in_id_order():
    n = gm.MAX_LISTED_GPUS + 2
    # Device d runs for d + 1 µs, except device 3 which runs longest: the two shortest (0, 1) drop out.
    kernels = [kernel(0, 1000 if d == 3 else d + 1, device=d) for d in range(n)]
    got = metrics(*kernels, span=(0.0, 2000.0))
    assert got["gpu_count"] == n
    assert [g["device"] for g in got["gpus"]] == list(range(2, n))
    assert gm._most_kernel_time(np.arange(3), np.arange(3), np.ones(3)).tolist() == [0, 1, 2]


def test_without_kernels_everything_is_none():
    got = metrics()
    assert got["gpu_count"] == 0 and got["gpus"] == []
    assert all(got[k] is None for k in gm.METRICS)


# --- the kernel table's columns --------------------------------------------------------------------


def test_kernel_stats_weight_by_duration_with_a_missing_value_as_zero():
    t = trace_of(
        [
            kernel(0, 10, "a", **{"blocks per SM": 2.0, "est. achieved occupancy %": 30}),
            kernel(20, 30, "a", **{"blocks per SM": 4.0}),  # occupancy missing: 0
            kernel(60, 0, "b", **{"blocks per SM": 8.0, "est. achieved occupancy %": 100}),  # zero weight: 0
            kernel(70, 5, TENSOR, **{"est. achieved occupancy %": 100}),
        ]
    )
    stats = gm.kernel_stats(t)
    assert list(stats.columns) == gm.KERNEL_STAT_COLUMNS and stats.index.name == "name"
    a = stats.loc["a"]
    assert (a["max (us)"], a["min (us)"]) == (30.0, 10.0)
    assert a["blocks per SM"] == pytest.approx((2 * 10 + 4 * 30) / 40)
    assert a["achieved occupancy (%)"] == pytest.approx((30 * 10 + 0 * 30) / 40)
    assert (stats.loc["b", "blocks per SM"], stats.loc["b", "achieved occupancy (%)"]) == (0.0, 0.0)
    assert stats.loc[TENSOR, "achieved occupancy (%)"] == 100.0
    assert stats["tensor cores"].tolist() == ["unknown", "unknown", "yes"]
    assert gm.kernel_stats(t, {"a": False, "b": None, TENSOR: True})["tensor cores"].tolist() == [
        "no",
        "unknown",
        "yes",
    ]
    # Under 1 µs of calls in all is still a weight: 0.25 µs at 3 blocks and 0.5 µs at 6 give 5.
    short = gm.kernel_stats(
        trace_of([kernel(0, 0.25, "c", **{"blocks per SM": 3.0}), kernel(1, 0.5, "c", **{"blocks per SM": 6.0})])
    )
    assert short.loc["c", "blocks per SM"] == pytest.approx((3 * 0.25 + 6 * 0.5) / 0.75)
    empty = gm.kernel_stats(trace_of([step(0, 10)]))
    assert empty.empty and list(empty.columns) == gm.KERNEL_STAT_COLUMNS and empty.index.name == "name"
