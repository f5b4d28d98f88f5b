"""Idle time: merged over the steps' span, and per stream by HTA's rules, against plain loops."""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import pairwise

import pytest

from profiling.gpu_metrics import gpu_metrics
from profiling.idle_time import idle_time
from profiling.trace import load_trace, parse_trace
from tests.conftest import DATA
from tests.profiling.test_gpu_metrics import PATHS, span_of
from tests.profiling.test_step_breakdown import LAUNCH, raw_events

GPU = ("kernel", "gpu_memcpy", "gpu_memset")


def plain_merged_idle(events: list[dict]) -> float | None:
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "kernel")
    if not kernels:
        return None
    lo, hi = span_of(events)
    busy, reach = 0.0, lo
    for s, e in kernels:
        s, e = max(s, reach), min(e, hi)
        if e > s:
            busy += e - s
            reach = e
    return (hi - lo) - busy


def plain_hta_breakdown(events: list[dict], delay: float = 30.0) -> dict:
    """HTA 0.5.0 _analyze_idle_time_for_stream, written as loops."""
    launch_ts = {}
    for e in events:
        corr = e["args"].get("correlation")
        if e["cat"] in LAUNCH and corr is not None:
            launch_ts.setdefault(corr, e["ts"])
    streams = defaultdict(list)
    for e in events:
        if e["cat"] in GPU and e["args"].get("stream") is not None and e["args"]["stream"] >= 0:
            streams[str(e["args"]["stream"])].append(e)
    out = {}
    for stream, work in streams.items():
        work.sort(key=lambda e: e["ts"])
        totals = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
        for prev, cur in pairwise(work):
            prev_end, gap = prev["ts"] + prev["dur"], cur["ts"] - (prev["ts"] + prev["dur"])
            launched = launch_ts.get(cur["args"].get("correlation"))
            if launched is not None and launched > prev_end:
                totals["host_wait"] += gap
            elif gap < delay:
                totals["kernel_wait"] += gap
            else:
                totals["other"] += gap
        out[stream] = totals
    return out


@pytest.mark.parametrize("name", [n for n in PATHS if n != "gpu_metrics_input"])
def test_idle_time_matches_plain_loops(name):
    events = raw_events(PATHS[name])
    ours = idle_time(load_trace(PATHS[name]))
    expected = plain_merged_idle(events)
    assert ours["idle_time_us"] == (None if expected is None else pytest.approx(expected, abs=1e-3))
    breakdown = plain_hta_breakdown(events)
    if not breakdown:
        assert ours["idle_breakdown_us"] is None
        return
    assert set(ours["idle_breakdown_us"]) == set(breakdown)
    for stream, totals in breakdown.items():
        assert ours["idle_breakdown_us"][stream] == pytest.approx(totals, abs=1e-3), stream


@pytest.mark.parametrize("name", ["resnet", "sampled_training_rank0", "a100_simple_add"])
def test_utilization_and_idle_time_add_up_to_the_span(name):
    """One GPU: busy share + idle share = 100%, so utilization can never read above 100%."""
    trace = load_trace(PATHS[name])
    lo, hi = span_of(raw_events(PATHS[name]))
    busy = gpu_metrics(trace)["gpu_utilization_percent"] / 100 * (hi - lo)
    assert busy + idle_time(trace)["idle_time_us"] == pytest.approx(hi - lo)
    assert 0 <= gpu_metrics(trace)["gpu_utilization_percent"] <= 100


def test_each_idle_category_on_a_small_trace():
    """host_wait: launched after the previous kernel ended; kernel_wait: a gap under 30 µs; other: the rest."""

    def kernel(ts: float, dur: float, corr: int) -> dict:
        return {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "ts": ts,
            "dur": dur,
            "pid": 0,
            "tid": 7,
            "args": {"correlation": corr, "stream": 7, "device": 0},
        }

    def launch(ts: float, corr: int) -> dict:
        return {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": ts,
            "dur": 2,
            "pid": 1,
            "tid": 1,
            "args": {"correlation": corr},
        }

    events = [
        launch(0, 1),
        kernel(10, 10, 1),  # first kernel: no gap before it
        launch(1, 2),
        kernel(25, 10, 2),  # gap 5 µs, launched long before: kernel_wait
        launch(2, 3),
        kernel(135, 10, 3),  # gap 100 µs, launched before: other (e.g. waiting on an event)
        launch(200, 4),
        kernel(210, 10, 4),  # gap 65 µs, launched after the previous kernel ended: host_wait
    ]
    result = idle_time(parse_trace(json.dumps(events).encode()))
    assert result["idle_breakdown_us"] == {"7": {"host_wait": 65.0, "kernel_wait": 5.0, "other": 100.0}}
    assert result["idle_time_us"] == pytest.approx((220 - 0) - 40)  # whole trace: first launch to last kernel end


def test_no_gpu_work_gives_nulls():
    result = idle_time(load_trace(DATA / "cpu_only.json.gz"))
    assert result == {"idle_time_us": None, "idle_breakdown_us": None}
