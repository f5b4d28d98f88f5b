"""GPU metrics and kernel statistics against the TensorBoard plugin's recorded outputs and plain loops.

Each metric is recomputed here from the raw JSON by for loops over lists (the plugin's own
definitions, written out), never by the vectorised code under test.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from profiling.gpu_metrics import gpu_metrics, kernel_stats, sm_efficiency_ranges
from profiling.kernels import decode
from profiling.names import cut_name
from profiling.trace import load_trace
from tests.conftest import DATA
from tests.profiling.test_step_breakdown import EXPECTED, NEW_FORMAT, RESNET, plain_steps, raw_events

GPU_METRICS_INPUT = DATA / "tb_plugin" / "gpu_metrics_input.json"
GPU_METRICS_EXPECTED = DATA / "tb_plugin" / "gpu_metrics_expected.json"
PATHS = {"resnet": RESNET, "gpu_metrics_input": GPU_METRICS_INPUT} | {n: DATA / f"{n}.json.gz" for n in NEW_FORMAT}


def span_of(events: list[dict]) -> tuple[float, float]:
    steps = plain_steps(events)
    if steps:
        return steps[0][1], steps[-1][2]
    return min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events)


def kernels_by_device(events: list[dict]) -> dict[int, list[dict]]:
    out = defaultdict(list)
    for e in events:
        if e["cat"] == "kernel" and e["args"].get("device") is not None:
            out[e["args"]["device"]].append(e)
    return out


def plain_utilization(kernels: list[dict], lo: float, hi: float) -> float:
    merged = []
    for s, e in sorted((k["ts"], k["ts"] + k["dur"]) for k in kernels):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    busy = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in merged)
    return 100.0 * busy / (hi - lo)


def plain_sm_segments(kernels: list[dict]) -> list[tuple[float, float, float]]:
    """merge_ranges_with_value: a sweep over START/END points, the running sum clamped to 1."""
    points = []
    for k in kernels:
        blocks = k["args"].get("blocks per SM")
        if blocks is not None and blocks > 0:
            points += [(k["ts"], 0, blocks), (k["ts"] + k["dur"], 1, blocks)]
    points.sort(key=lambda p: (p[0], p[1]))
    segments, level = [], 0.0
    for i, (t, kind, value) in enumerate(points):
        if i and t > points[i - 1][0] and level > 0:
            segments.append((points[i - 1][0], t, min(level, 1.0)))
        level += value if kind == 0 else -value
    return segments


def plain_sm_efficiency(kernels: list[dict], lo: float, hi: float) -> float | None:
    weighted = [(min(e, hi) - max(s, lo)) * v for s, e, v in plain_sm_segments(kernels) if min(e, hi) > max(s, lo)]
    return 100.0 * sum(weighted) / (hi - lo) if weighted else None


def plain_occupancy(kernels: list[dict], lo: float, hi: float) -> float | None:
    total = weighted = 0.0
    for k in kernels:
        occ = k["args"].get("est. achieved occupancy %")
        dur = min(k["ts"] + k["dur"], hi) - max(k["ts"], lo)
        # Left out: missing and negative values (the plugin), and over 100% (an estimate of a share of warps).
        if type(occ) in (int, float) and 0 <= occ <= 100 and dur > 0:
            total += dur
            weighted += occ * dur
    return weighted / total if total > 0 else None


def plain_tensor_core_share(kernels: list[dict]) -> float | None:
    total = sum(k["dur"] for k in kernels)
    tc = sum(k["dur"] for k in kernels if decode(k["name"]).tensor_cores is True)
    return 100.0 * tc / total if total > 0 else None


def approx(value: float | None) -> object:
    return None if value is None else pytest.approx(value, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("name", list(PATHS))
def test_gpu_metrics_match_plain_loops(name):
    events = raw_events(PATHS[name])
    ours = gpu_metrics(load_trace(PATHS[name]))
    devices = kernels_by_device(events)
    assert [g["device"] for g in ours["gpus"]] == sorted(devices)
    lo, hi = span_of(events)
    for gpu in ours["gpus"]:
        kernels = devices[gpu["device"]]
        assert gpu["gpu_utilization_percent"] == approx(plain_utilization(kernels, lo, hi))
        assert gpu["sm_efficiency_percent"] == approx(plain_sm_efficiency(kernels, lo, hi))
        assert gpu["achieved_occupancy_percent"] == approx(plain_occupancy(kernels, lo, hi))
        assert gpu["tensor_core_time_percent"] == approx(plain_tensor_core_share(kernels))
    if not devices:
        assert ours["gpu_utilization_percent"] is None and ours["gpus"] == []


def test_resnet50_gpu_summary_matches_the_plugins_recorded_overview():
    shown = {d["title"]: d["value"] for d in json.loads(EXPECTED.read_text().splitlines()[0])["gpu_metrics"]["data"]}
    ours = gpu_metrics(load_trace(RESNET))
    assert ours["gpu_name"] == shown["Name"]
    assert f"{ours['gpu_memory_bytes'] / 1024**3:.2f} GB" == shown["Memory"]
    assert ours["compute_capability"] == shown["Compute Capability"]
    assert f"{round(ours['gpu_utilization_percent'], 2)} %" == shown["GPU Utilization"]
    assert f"{round(ours['sm_efficiency_percent'], 2)} %" == shown["Est. SM Efficiency"]
    assert f"{round(ours['achieved_occupancy_percent'], 2)} %" == shown["Est. Achieved Occupancy"]
    assert f"{round(ours['tensor_core_time_percent'], 2)} %" == shown["Kernel Time using Tensor Cores"]
    assert ours["sm_count"] == 80


def test_sm_efficiency_segments_match_the_plugins_expected_timeline():
    """gpu_metrics_expected.json draws the plugin's SM-efficiency segments, scaled up 10x by its test."""
    counters = [
        e
        for e in json.loads(GPU_METRICS_EXPECTED.read_text())["traceEvents"]
        if e["name"] == "GPU 0 Est. SM Efficiency"
    ]
    # The first two counters mark the timeline's start; then each segment is (start, value), (end, 0).
    drawn = [
        (a["ts"], b["ts"], a["args"]["Est. SM Efficiency"] / 10)
        for a, b in zip(counters[2::2], counters[3::2], strict=True)
    ]
    starts, ends, values = sm_efficiency_ranges(load_trace(GPU_METRICS_INPUT).kernels)
    assert list(zip(starts, ends, strict=True)) == [(s, e) for s, e, _ in drawn]
    assert list(values) == pytest.approx([v for _, _, v in drawn])


def test_kernel_table_matches_the_plugins_recorded_kernel_view():
    table = json.loads(EXPECTED.read_text().splitlines()[3])["data"]
    ours = kernel_stats(load_trace(RESNET))
    assert len(ours) == len(table["rows"])
    for name, tensor_cores, _calls, _total, _mean, longest, shortest, blocks, occupancy in table["rows"]:
        row = ours.loc[name]
        assert (row["max (us)"], row["min (us)"]) == (longest, shortest)
        assert row["blocks per SM"] == pytest.approx(blocks, abs=0.005 + 1e-9)  # shown rounded to 2 places
        assert row["achieved occupancy (%)"] == pytest.approx(occupancy, abs=0.005 + 1e-9)
        # The plugin's allow-list knew no tensor-core kernel here; our decoder may only say no or unknown.
        assert tensor_cores == "No" and row["tensor cores"] in ("no", "unknown")


@pytest.mark.parametrize("name", ["resnet", "a100_simple_add", "sampled_training_rank0", "triton_driver_launch"])
def test_kernel_stats_match_a_plain_loop(name):
    calls = defaultdict(list)
    for e in raw_events(PATHS[name]):
        if e["cat"] == "kernel":
            calls[cut_name(e["name"])].append(e)  # the reader cuts names (profiling/names.py)
    ours = kernel_stats(load_trace(PATHS[name]))
    assert sorted(ours.index) == sorted(calls)
    for kernel, events in calls.items():
        weight = sum(e["dur"] for e in events)

        def weighted(key: str, events: list = events, weight: float = weight) -> float:
            # kernel_parser.weighted_avg: a missing value counts as 0; zero total weight gives 0
            return sum((e["args"].get(key) or 0) * e["dur"] for e in events) / weight if weight else 0.0

        row = ours.loc[kernel]
        assert row["max (us)"] == max(e["dur"] for e in events)
        assert row["min (us)"] == min(e["dur"] for e in events)
        assert row["blocks per SM"] == pytest.approx(weighted("blocks per SM"))
        assert row["achieved occupancy (%)"] == pytest.approx(weighted("est. achieved occupancy %"))
        assert row["tensor cores"] == {True: "yes", False: "no", None: "unknown"}[decode(kernel).tensor_cores]


def test_occupancy_is_weighted_by_duration_not_a_plain_mean():
    """Weighting by duration, as the plugin does, changes the answer on a real trace (the issue: 20% vs 92%)."""
    ours = kernel_stats(load_trace(DATA / "sampled_training_rank0.json.gz"))
    assert ours["achieved occupancy (%)"].between(0, 100).all()
    calls = defaultdict(list)
    for e in raw_events(DATA / "sampled_training_rank0.json.gz"):
        if e["cat"] == "kernel":
            calls[e["name"]].append((e["args"].get("est. achieved occupancy %") or 0, e["dur"]))
    differs = [
        k for k, v in calls.items() if abs(sum(o for o, _ in v) / len(v) - ours.loc[k, "achieved occupancy (%)"]) > 1
    ]
    assert differs  # weighting changes the answer on a real trace


def test_without_kernels_every_metric_is_null_and_the_table_keeps_its_schema():
    trace = load_trace(DATA / "cupti_counters_no_kernels.json.gz")
    ours = gpu_metrics(trace)
    assert ours["gpus"] == [] and ours["gpu_utilization_percent"] is None and ours["sm_efficiency_percent"] is None
    assert ours["gpu_name"] is not None  # deviceProperties still describe the GPU
    assert list(kernel_stats(trace).columns) == [
        "max (us)",
        "min (us)",
        "blocks per SM",
        "achieved occupancy (%)",
        "tensor cores",
    ]


def test_two_gpus_are_measured_apart_and_described_by_their_own_properties():
    """Kernels on GPU 0 and GPU 1: one `gpus` entry each; the top level averages them."""
    from profiling.trace import parse_trace

    def kernel(device: int, ts: float, dur: float) -> dict:
        return {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "ts": ts,
            "dur": dur,
            "pid": device,
            "tid": 7,
            "args": {"device": device, "stream": 7, "blocks per SM": 2.0, "est. achieved occupancy %": 50},
        }

    document = {
        "deviceProperties": [{"id": 0, "name": "GPU zero", "numSms": 10}, {"id": 1, "name": "GPU one", "numSms": 20}],
        "traceEvents": [kernel(0, 0, 50), kernel(0, 25, 50), kernel(1, 0, 25), kernel(1, 75, 25)],
    }
    ours = gpu_metrics(parse_trace(json.dumps(document).encode()))
    assert [(g["device"], g["gpu_name"], g["sm_count"]) for g in ours["gpus"]] == [
        (0, "GPU zero", 10),
        (1, "GPU one", 20),
    ]
    assert [g["gpu_utilization_percent"] for g in ours["gpus"]] == pytest.approx([75.0, 50.0])  # span 0..100
    assert [g["sm_efficiency_percent"] for g in ours["gpus"]] == pytest.approx([75.0, 50.0])  # clamped to 1
    assert ours["gpu_utilization_percent"] == pytest.approx(62.5)
    assert ours["gpu_name"] == "GPU zero"
