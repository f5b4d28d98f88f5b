"""Idle time: merged over the steps' span, and per stream by HTA's rules, against plain loops."""

from __future__ import annotations

import json
from collections import defaultdict

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
    """HTA 0.5.0 _analyze_idle_time_for_stream, written as loops; the previous end is the latest end so far
    (the union's), so that overlapping activity leaves no gap rather than a negative one."""
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
        reach = None
        for cur in work:
            if reach is None:  # the first activity on a stream has no gap
                reach = cur["ts"] + cur["dur"]
                continue
            prev_end, gap = reach, max(0.0, cur["ts"] - reach)
            reach = max(reach, cur["ts"] + cur["dur"])
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


def test_overlapping_kernels_on_one_stream_leave_no_negative_idle_time():
    """A kernel inside a longer one waited for nothing; HTA's literal rule would report -450 µs of kernel_wait."""

    def pair(ts: float, dur: float, corr: int, launched: float) -> list[dict]:
        launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launched, "dur": 2}
        kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "pid": 0, "tid": 7}
        launch |= {"pid": 1, "tid": 1, "args": {"correlation": corr}}
        kernel["args"] = {"correlation": corr, "stream": 7, "device": 0}
        return [launch, kernel]

    events = [
        *pair(0, 500, 1, launched=-10),
        *pair(50, 50, 2, launched=-8),  # inside the first kernel: no gap at all
        *pair(520, 10, 3, launched=-6),  # 20 µs after the first kernel's end (not 420 after the second's)
        *pair(600, 10, 4, launched=560),  # launched after everything before it ended: host_wait, 70 µs
    ]
    for e in events:
        e.setdefault("args", {})
    ours = idle_time(parse_trace(json.dumps(events).encode()))["idle_breakdown_us"]
    assert ours["7"] == pytest.approx(plain_hta_breakdown(events)["7"])
    assert ours["7"] == {"host_wait": 70.0, "kernel_wait": 20.0, "other": 0.0}
    assert min(ours["7"].values()) >= 0
