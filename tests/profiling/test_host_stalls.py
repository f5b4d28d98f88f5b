"""Host stalls: blocking syncs over the GPU's idle time, and launch-bound steps, against plain loops over the raw
events of the real traces (tests/data/gpu), and on small synthetic traces with the evidence present and absent."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from profiling.host_stalls import SYNC_MIN_US, api_name, graph_launches, launch_stats
from profiling.insights.base import Evidence, Insight
from profiling.insights.host import blocking_sync, launch_bound, overhead_bound
from profiling.trace import Trace, load_trace, parse_trace
from profiling.windows import window_stats
from tests.gpu_oracle import end, intersection, union

GPU_DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"
TRACES = {
    "b200": "b200_vllm_gpt-oss_eager_rank0",
    "bert": "h100_bert-small_sdpa-flash",
    "mha": "h100_nn-mha_fp32",
    "owlv2": "h100_owlv2_eager-attn",
    "qwen_h100": "h100_qwen1.5-0.5b_prefill",
    "qwen_mi300x": "mi300x_qwen1.5-0.5b_prefill",
    "sglang": "mi300x_sglang_qwen3-8b_decode",
}
GPU = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH = ("cuda_runtime", "cuda_driver")
SYNC_CALLS = (
    "cudaMemcpy",
    "hipMemcpy",
    "hipMemcpyWithStream",
    "cudaStreamSynchronize",
    "hipStreamSynchronize",
    "cudaDeviceSynchronize",
    "hipDeviceSynchronize",
)
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense")
STEP = re.compile(r"ProfilerStep#\d+")


# ---- plain readings of the raw events ---------------------------------------------------------------------------


def raw(key: str) -> list[dict]:
    with gzip.open(GPU_DATA / f"{TRACES[key]}.json.gz") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]


def launches(events: list[dict]) -> dict:
    """Correlation id -> (start, end) of the first launch with it."""
    out: dict = {}
    for e in events:
        corr = e.get("args", {}).get("correlation")
        if e.get("cat") in LAUNCH and corr is not None and corr not in out:
            out[corr] = (e["ts"], end(e))
    return out


def plain_span(events: list[dict]) -> tuple[float, float, int]:
    """The steps' span (the ProfilerSteps, else the host's ops), reaching the end of the GPU work launched in it."""
    steps = [e for e in events if e.get("cat") in ("user_annotation", "cpu_op") and STEP.fullmatch(e["name"])]
    hosts = steps or [e for e in events if e.get("cat") == "cpu_op"]
    lo, hi = min(e["ts"] for e in hosts), max(end(e) for e in hosts)
    launched = launches(events)
    reach = hi
    for e in events:
        if e.get("cat") in GPU:
            at = launched.get(e["args"].get("correlation"))
            if at is not None and lo <= at[0] and at[1] <= hi:
                reach = max(reach, end(e))
    return lo, reach, len({(s["name"], s["ts"]) for s in steps}) or 1


def covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of `intervals` inside [lo, hi]."""
    return intersection(union(intervals), [(lo, hi)])


def plain_idle(events: list[dict]) -> tuple[float, float, list[tuple[float, float]]]:
    lo, hi, _ = plain_span(events)
    kernels = [(e["ts"], end(e)) for e in events if e.get("cat") == "kernel"]
    return (hi - lo) - covered(kernels, lo, hi), hi - lo, kernels


def plain_syncs(events: list[dict]) -> list[tuple[dict, float]]:
    """Every sync call or op with the GPU idle time it covers, most first."""
    lo, hi, _ = plain_span(events)
    kernels = [(e["ts"], end(e)) for e in events if e.get("cat") == "kernel"]
    out = []
    for e in events:
        is_call = e.get("cat") in LAUNCH and e["name"] in SYNC_CALLS
        if is_call or (e.get("cat") == "cpu_op" and e["name"] in SYNC_OPS):
            s, t = max(e["ts"], lo), min(end(e), hi)
            out.append((e, max(0.0, t - s) - covered(kernels, s, t) if t > s else 0.0))
    return sorted(out, key=lambda pair: -pair[1])


def enclosing_op(events: list[dict], inner: dict) -> str | None:
    """The innermost cpu_op on the same thread that holds `inner`."""
    around = [
        e
        for e in events
        if e.get("cat") == "cpu_op"
        and e is not inner
        and (e["pid"], e["tid"]) == (inner["pid"], inner["tid"])
        and e["ts"] <= inner["ts"]
        and end(e) >= end(inner)
    ]
    return max(around, key=lambda e: (e["ts"], -e["dur"]))["name"] if around else None


def plain_host_wait(events: list[dict], stream: int) -> float:
    """HTA's host wait on one stream: a gap counts where the next activity's launch began after the stream's
    work so far had ended."""
    launched = launches(events)
    work = sorted(
        (e for e in events if e.get("cat") in GPU and e["args"].get("stream") == stream), key=lambda e: e["ts"]
    )
    wait, reach = 0.0, None
    for e in work:
        if reach is not None:
            at = launched.get(e["args"].get("correlation"))
            if at is not None and at[0] > reach:
                wait += max(0.0, e["ts"] - reach)
            reach = max(reach, end(e))
        else:
            reach = end(e)
    return wait


def busiest_stream(kernels: list[dict]) -> int:
    time: dict = defaultdict(float)
    for e in kernels:
        time[e["args"]["stream"]] += e["dur"]
    return max(time, key=time.get)


def plain_gaps(kernels: list[dict]) -> list[tuple[float, float]]:
    """(gap, start of the kernel after it) between consecutive kernels, from the end of all earlier ones."""
    gaps, reach = [], None
    for e in sorted(kernels, key=lambda e: e["ts"]):
        if reach is not None:
            gaps.append((max(0.0, e["ts"] - reach), e["ts"]))
            reach = max(reach, end(e))
        else:
            reach = end(e)
    return gaps


# ---- fixtures ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traces() -> dict[str, Trace]:
    return {key: load_trace(GPU_DATA / f"{name}.json.gz") for key, name in TRACES.items()}


@pytest.fixture(scope="module")
def events() -> dict[str, list[dict]]:
    return {key: raw(key) for key in TRACES}


def evidence(trace: Trace) -> Evidence:
    """What the rules read for an upload: the whole trace as one window."""
    return Evidence(trace, window_stats(trace, None), pd.DataFrame())


def recorded(rule, trace: Trace) -> dict | None:
    """The rule's finding as the summaries carry it; the JSON must hold no NaN."""
    found = rule(evidence(trace))
    if found is None:
        return None
    record = Insight(rule.__name__, found.title, found.detail, found.evidence, found.gpu_time_percent).record()
    json.dumps(record, allow_nan=False)
    return record


# ---- blocking_sync on the real traces ------------------------------------------------------------------------------


def test_blocking_sync_explains_the_sglang_window(traces, events):
    trace, ev = traces["sglang"], events["sglang"]
    record = recorded(blocking_sync, trace)
    assert record is not None and record["gpu_time_percent"] is None  # about idle time, not GPU events
    idle, span, _ = plain_idle(ev)
    (sync, idle_covered), *_ = plain_syncs(ev)
    assert sync["name"] == "hipMemcpyWithStream" and sync["dur"] > 400_000  # the README's 463 ms copy
    found = record["evidence"]
    assert found["name"] == "hipMemcpyWithStream"
    assert found["dur_us"] == pytest.approx(sync["dur"])
    assert found["idle_covered_us"] == pytest.approx(idle_covered, abs=0.01)
    assert found["idle_us"] == pytest.approx(idle, abs=0.01)
    assert found["span_us"] == pytest.approx(span, abs=0.01)
    assert found["op"] == enclosing_op(ev, sync) == "aten::copy_"
    assert found["ts_us"] == pytest.approx(sync["ts"], abs=1e-3)
    assert found["step"] == "0"  # no ProfilerStep: the plugin's one step "0" over the host's ops
    copies = [e for e in ev if e.get("cat") == "gpu_memcpy" and e["args"]["correlation"] == sync["args"]["correlation"]]
    assert found["copy_bytes"] == copies[0]["args"]["bytes"] == 256
    assert idle_covered / idle > 0.99  # it fills the window
    busy = 100 * (1 - idle / span)
    assert f"busy {busy:.0f}%" in record["detail"] and "aten::copy_" in record["detail"]
    assert "populate_from_forward_batch" in record["detail"]  # the caller, past torch's own frames


def test_gpu_busy_names_the_blocking_sync(traces):
    """The whole-trace "GPU busy" finding names its cause instead of a bare percentage."""
    found = overhead_bound(evidence(traces["sglang"]))
    assert found is not None and found.title == "GPU busy"
    assert "hipMemcpyWithStream" in found.detail and "aten::copy_" in found.detail
    assert found.evidence["blocked_in"] == "hipMemcpyWithStream"


@pytest.mark.parametrize("key", ["b200", "bert"])
def test_gpu_busy_points_to_launch_bound(traces, key):
    """b200's "GPU busy 14%" is no bare percentage either: its cause is the host's launches."""
    found = overhead_bound(evidence(traces[key]))
    assert found is not None and "launch-bound" in found.detail


@pytest.mark.parametrize("key", ["b200", "bert", "mha", "owlv2", "qwen_h100", "qwen_mi300x"])
def test_blocking_sync_silent_where_no_sync_covers_the_idle_time(traces, events, key):
    """Those traces hold syncs (owlv2: 73 ms stream syncs) but the GPU is busy under them: a plain reading
    finds none over both thresholds, and the rule says nothing."""
    idle, _, _ = plain_idle(events[key])
    worst = plain_syncs(events[key])
    assert not worst or worst[0][1] < max(SYNC_MIN_US, 0.1 * idle)
    assert blocking_sync(evidence(traces[key])) is None
    busy = overhead_bound(evidence(traces[key]))
    assert busy is None or "blocked" not in busy.detail  # no cause invented


# ---- launch_bound on the real traces -------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["b200", "bert"])
def test_launch_bound_fires_on_host_bound_eager_traces(traces, events, key):
    ev = events[key]
    record = recorded(launch_bound, traces[key])
    assert record is not None and record["gpu_time_percent"] is None
    found = record["evidence"]
    lo, hi, steps = plain_span(ev)
    kernels = [e for e in ev if e.get("cat") == "kernel" and lo <= e["ts"] <= hi]
    stream = busiest_stream(kernels)
    wait = plain_host_wait(ev, stream)
    assert not any(e.get("cat") in LAUNCH and "GraphLaunch" in e["name"] for e in ev)
    assert found["stream"] == str(stream)
    assert found["span_us"] == pytest.approx(hi - lo, abs=0.01)
    assert found["host_wait_us"] == pytest.approx(wait, abs=0.01)
    assert found["host_wait_percent"] == pytest.approx(100 * wait / (hi - lo))
    assert found["host_wait_percent"] >= 50
    assert found["kernels_per_step"] == pytest.approx(len(kernels) / steps)
    assert found["median_kernel_us"] == pytest.approx(statistics.median(e["dur"] for e in kernels))
    gaps = plain_gaps([e for e in kernels if e["args"]["stream"] == stream])
    assert found["median_gap_us"] == pytest.approx(statistics.median(g for g, _ in gaps), abs=1e-6)
    widest = max(gaps, key=lambda pair: pair[0])  # the first of the widest, as the analysis takes it
    assert found["widest_gap_us"] == pytest.approx(widest[0], abs=1e-6)
    assert found["ts_us"] == pytest.approx(widest[1], abs=1e-3)  # the kernel after it, to find in Perfetto
    assert "CUDA graph" in record["detail"]


def test_launch_bound_bert_reads_as_the_readme_says(traces):
    """README: GPU idle about 3.6 of 3.9 ms waiting on the host; a 307 µs workload."""
    found = launch_stats(traces["bert"])
    assert found is not None
    assert found.host_wait_us == pytest.approx(3600, abs=100)


def test_launch_bound_b200_gpu_busy_14_percent(events):
    """README: GPU busy only ~14% (host-bound eager execution); a plain reading over the step."""
    idle, span, _ = plain_idle(events["b200"])
    assert 100 * (1 - idle / span) == pytest.approx(14, abs=2)


def test_launch_bound_silent_on_graph_replay(traces, events):
    """SGLang replays a HIP graph: one hipGraphLaunch, so launch overhead is not per kernel."""
    assert sum(e.get("cat") in LAUNCH and e["name"] == "hipGraphLaunch" for e in events["sglang"]) == 1
    assert graph_launches(traces["sglang"]) == 1
    assert launch_bound(evidence(traces["sglang"])) is None


@pytest.mark.parametrize("key", ["qwen_h100", "owlv2"])
def test_launch_bound_silent_where_the_gpu_is_busy(traces, events, key):
    """The H100 qwen prefill (GPU busy ~90%) and owlv2 (host wait ~42%) stay under the threshold."""
    ev = events[key]
    lo, hi, _ = plain_span(ev)
    kernels = [e for e in ev if e.get("cat") == "kernel" and lo <= e["ts"] <= hi]
    assert 100 * plain_host_wait(ev, busiest_stream(kernels)) / (hi - lo) < 50
    assert launch_bound(evidence(traces[key])) is None


# ---- synthetic traces ----------------------------------------------------------------------------------------------


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict:
    args = {"correlation": corr, "device": 0, "stream": stream}
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream, "args": args}


def call(name: str, ts: float, dur: float, corr: int, cat: str = "cuda_runtime") -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": 1,
        "tid": 1,
        "args": {"correlation": corr},
    }


def op(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": {}}


def step(ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def parsed(events: list[dict]) -> Trace:
    return parse_trace(json.dumps({"traceEvents": events}).encode())


def sync_trace(sync: str, sync_dur: float, kernel_during: bool = False) -> list[dict]:
    """A step with a kernel before and after a sync call inside `aten::copy_`."""
    events = [step(0, 20_000), op("aten::copy_", 100, sync_dur + 20), call(sync, 110, sync_dur, 2)]
    events += [call("cudaLaunchKernel", 10, 5, 1), kernel("k_before", 20, 50, 1)]
    events += [call("cudaLaunchKernel", sync_dur + 200, 5, 3), kernel("k_after", sync_dur + 210, 50, 3)]
    if kernel_during:  # launched earlier, runs all through the sync: the GPU is busy, not idle
        events += [call("cudaLaunchKernel", 30, 5, 4), kernel("k_long", 40, sync_dur + 100, 4, stream=8)]
    return events


@pytest.mark.parametrize("name", ["cudaMemcpy", "hipMemcpyWithStream", "cudaMemcpy_v3020"])
def test_blocking_sync_synthetic_present(name):
    """CUPTI may write an API name with its version (`_v3020`): the same call."""
    record = recorded(blocking_sync, parsed(sync_trace(name, 5_000)))
    assert record is not None
    found = record["evidence"]
    # Idle: the step's 20,000 µs less the two 50 µs kernels; the sync covers all 5,000 µs of its own time.
    assert found["idle_us"] == pytest.approx(20_000 - 100)
    assert found["idle_covered_us"] == pytest.approx(5_000)
    assert found["op"] == "aten::copy_" and found["step"] == "ProfilerStep#3" and found["ts_us"] == 110
    assert f"{name} issued by aten::copy_" in record["detail"] and "non_blocking" in record["detail"]


@pytest.mark.parametrize(
    ("sync", "dur", "busy"),
    [
        ("cudaMemcpy", 900, False),  # under 1 ms
        ("cudaMemcpyAsync", 5_000, False),  # not a synchronous call
        ("cudaStreamSynchronize", 5_000, True),  # the GPU runs a kernel all through it
    ],
)
def test_blocking_sync_synthetic_absent(sync, dur, busy):
    assert blocking_sync(evidence(parsed(sync_trace(sync, dur, busy)))) is None


def test_blocking_sync_under_a_tenth_of_the_idle_time_is_silent():
    """2 ms of sync in 40 ms of idle time: over 1 ms but under 10% of the idle time."""
    events = sync_trace("cudaDeviceSynchronize", 2_000)
    events[0]["dur"] = 40_000
    assert blocking_sync(evidence(parsed(events))) is None


def test_blocking_sync_item_counted_once_and_named_by_its_op():
    """`aten::item` holds `_local_scalar_dense`, which holds the copy and the sync: one finding, about the item."""
    events = [step(0, 10_000), op("aten::item", 100, 3_000), op("aten::_local_scalar_dense", 110, 2_980)]
    events += [call("cudaMemcpyAsync", 120, 10, 2), call("cudaStreamSynchronize", 140, 2_900, 3)]
    events += [call("cudaLaunchKernel", 10, 5, 1), kernel("k", 20, 50, 1)]
    found = recorded(blocking_sync, parsed(events))
    assert found is not None
    assert found["evidence"]["name"] == "aten::item" and found["evidence"]["syncs"] == 1
    assert ".item()" in found["detail"]


def launch_trace(gap: float, graph: bool = False) -> list[dict]:
    """One step of 20 kernels of 2 µs, each launched `gap` µs after the previous one."""
    events = [step(0, 20 * gap + 100)]
    for i in range(20):
        events += [call("cudaLaunchKernel", 10 + i * gap, 3, i + 1), kernel(f"k{i % 3}", 15 + i * gap, 2, i + 1)]
    if graph:
        events.append(call("cudaGraphLaunch", 5, 2, 999))
    return events


def test_launch_bound_synthetic_present():
    record = recorded(launch_bound, parsed(launch_trace(gap=50)))
    assert record is not None
    found = record["evidence"]
    assert found["kernels_per_step"] == 20 and found["median_kernel_us"] == 2 and found["median_gap_us"] == 48
    assert found["host_wait_us"] == 19 * 48 and found["span_us"] == 20 * 50 + 100
    assert found["step"] == "ProfilerStep#3" and found["ts_us"] == 65  # k1, after the first widest gap


@pytest.mark.parametrize(("gap", "graph"), [(50, True), (2.5, False)])
def test_launch_bound_synthetic_absent(gap, graph):
    """A graph launch silences it; so does a GPU that the host keeps fed (host wait under half the span)."""
    events = launch_trace(gap, graph)
    if not graph:
        events[0]["dur"] = 60  # the step is the kernels' run: 0.5 µs gaps in 60 µs
    assert launch_bound(evidence(parsed(events))) is None


def test_api_names_lose_their_suffix_in_linear_time():
    """A crafted 4,000-character name of repeated `_v1` is no API name: left as it is, at once."""
    assert api_name("cudaMemcpy_v3020") == "cudaMemcpy" and api_name("cudaStreamSynchronize_ptsz") == (
        "cudaStreamSynchronize"
    )
    crafted = "cudaMemcpy" + "_v1" * 1300
    assert api_name(crafted) == crafted
