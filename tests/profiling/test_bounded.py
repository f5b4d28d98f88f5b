"""Hostile traces (issue 16, "bounded everything"): repeated step names, annotations on tens of
thousands of threads, 200,000 one-event threads, names built to blow up hover text.

Every number is checked against a plain loop over the JSON events; the two timing tests compare
a trace with ten times the threads side by side, best of three, against a wide margin.
"""

from __future__ import annotations

import bisect
import json
import time
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import pytest

from profiling import intervals as iv
from profiling.analysis import MAX_STEPS, analyze
from profiling.charts import MAX_CATEGORIES, MAX_HEIGHT, timeline, window_chart
from profiling.lanes import MAX_LANES
from profiling.step_breakdown import step_breakdown
from profiling.structure import structure
from profiling.trace import Trace, parse_trace
from profiling.windows import annotation_windows, window_of, window_table
from tests.profiling.test_step_breakdown import plain_steps
from tests.timing_slack import TIMING_SLACK

# 10x the events may cost up to 20x the time; a scan per lane or per event would cost 100x. TIMING_SLACK
# widens it on a loaded machine (up to a slack of 5, a quadratic cost still fails).
MAX_GROWTH = 20 * TIMING_SLACK

REPEATED_STEPS = 2000
FIGURE_BYTES = 1_000_000
MAX_BARS_DRAWN = 3000


def parse(events: list[dict]) -> Trace:
    return parse_trace(json.dumps({"traceEvents": events}).encode())


def bars(fig) -> int:
    return sum(len(t.x) for t in fig.data)


# --- 2,000 steps that share one name ---------------------------------------------------------


def repeated_step_events() -> list[dict]:
    """2,000 `ProfilerStep#1` steps, each with an op that launches a kernel; the first step recorded twice."""
    events = []
    for i in range(REPEATED_STEPS):
        t0 = 100.0 * i
        events += [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": t0, "dur": 90 - i % 3},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t0 + 10, "dur": 20 + i % 2},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 12, "dur": 3, "args": {}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "ts": t0 + 20, "dur": 10 + i % 5, "pid": 0, "tid": 7},
        ]
        for e in events[-4:-1]:
            e |= {"pid": 1, "tid": 1}
        events[-2]["args"] = {"correlation": i}
        events[-1]["args"] = {"correlation": i, "stream": 7, "device": 0}
    events.append(dict(events[0]))  # the same span twice: one step
    return events


def plain_step_rows(events: list[dict]) -> list[dict]:
    """Per step in time order (the same span once): its ops, GPU activities and kernel µs, by a plain loop."""
    spans = sorted({(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "ProfilerStep#1"})
    starts = [s for s, _ in spans]
    rows = [{"cpu (ms)": (u - s) / 1e3, "ops": 0, "gpu activities": 0, "kernel time (us)": 0.0} for s, u in spans]
    kernels = {e["args"]["correlation"]: e for e in events if e["cat"] == "kernel"}

    def step_of(e: dict) -> int | None:
        k = bisect.bisect_right(starts, e["ts"]) - 1
        return k if k >= 0 and e["ts"] + e["dur"] <= spans[k][1] else None

    for e in events:
        k = step_of(e) if e.get("tid") == 1 else None
        if k is None:
            continue
        if e["name"].startswith("aten::"):
            rows[k]["ops"] += 1
        if e["cat"] == "cuda_runtime":
            rows[k]["gpu activities"] += 1
            rows[k]["kernel time (us)"] += kernels[e["args"]["correlation"]]["dur"]
    return rows


@pytest.fixture(scope="module")
def repeated_steps() -> tuple[list[dict], object]:
    events = repeated_step_events()
    return events, analyze(parse(events))


def test_repeated_step_name_is_one_step_per_event_and_the_table_is_capped_in_rows(repeated_steps):
    events, analysis = repeated_steps
    assert len(analysis.steps) == MAX_STEPS  # 500 rows, not 2,000 names merged into 4 million
    assert analysis.summary["profiler_steps"] == REPEATED_STEPS  # the duplicate span counts once
    assert list(analysis.steps["position"]) == list(range(MAX_STEPS))
    assert (analysis.steps["step"] == "ProfilerStep#1").all()


def test_steps_matched_by_position_agree_with_a_plain_loop(repeated_steps):
    events, analysis = repeated_steps
    expected = plain_step_rows(events)
    ours = analysis.steps.to_dict(orient="records")
    for position, (want, got) in enumerate(zip(expected[:MAX_STEPS], ours, strict=True)):
        for column, value in want.items():
            assert got[column] == pytest.approx(value), (position, column)
    plugin = plain_steps([dict(e, args=e.get("args", {})) for e in events])
    assert len(plugin) == REPEATED_STEPS
    for position, ((_, start, stop), got) in enumerate(zip(plugin, ours, strict=False)):
        assert got["step time (us)"] == pytest.approx(stop - start), position
        assert got["kernel (us)"] == pytest.approx(expected[position]["kernel time (us)"]), position


def test_breakdown_per_step_carries_the_position(repeated_steps):
    events, analysis = repeated_steps
    per_step = step_breakdown(analysis.trace).per_step
    assert list(per_step["position"]) == list(range(REPEATED_STEPS))
    assert per_step["position"].is_unique


def test_steps_chart_draws_one_bar_per_step_when_names_repeat(repeated_steps):
    _, analysis = repeated_steps
    fig = window_chart(analysis.steps)
    assert len(fig.data[0].x) == MAX_STEPS and len(set(fig.data[0].x)) == MAX_STEPS


# --- annotations on many threads -----------------------------------------------------------------


def threads_events(n: int) -> list[dict]:
    """One `region` annotation per thread, an op inside it, and one op outside it."""
    events = []
    for i in range(n):
        events += [
            {"ph": "X", "cat": "user_annotation", "name": "region", "ts": 3 * i, "dur": 10, "pid": 1, "tid": i},
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 3 * i + 1, "dur": 5, "pid": 1, "tid": i},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "ts": 3 * i + 20, "dur": 5, "pid": 1, "tid": i},
        ]
    return events


def best_of(run: Callable[[object], None], make: Callable[[], object] = lambda: None, repeats: int = 3) -> float:
    """The shortest of `repeats` timings of `run(make())`, the making untimed."""
    times = []
    for _ in range(repeats):
        arg = make()
        start = time.perf_counter()
        run(arg)
        times.append(time.perf_counter() - start)
    return min(times)


def test_annotation_windows_on_many_threads_are_found_in_linear_time():
    """The stage that scanned every event once per lane: 10x the threads must cost well under 100x."""
    small, big = parse(threads_events(2_000)), parse(threads_events(20_000))
    for trace in (small, big):
        structure(trace)  # the nesting walk is timed with the structure module, not here
    table = window_table(big, ["region"]).iloc[0]
    assert table["count"] == 20_000 and table["ops/window"] == 1.0  # the add inside, not the mul after
    t_small = best_of(lambda _: window_table(small, ["region"]))
    t_big = best_of(lambda _: window_table(big, ["region"]))
    assert t_big < MAX_GROWTH * t_small, (t_small, t_big)


def test_whole_analysis_and_timeline_of_many_threads_scale_linearly():
    small, big = json.dumps({"traceEvents": threads_events(2_000)}), json.dumps({"traceEvents": threads_events(20_000)})

    def parsed(data: str) -> Callable[[], Trace]:
        return lambda: parse_trace(data.encode())  # a fresh trace each time: nothing cached from the last run

    def run(trace: Trace) -> None:
        timeline(analyze(trace))

    t_small, t_big = best_of(run, parsed(small)), best_of(run, parsed(big))
    assert t_big < MAX_GROWTH * t_small, (t_small, t_big)


def plain_window_of(events: list[dict], windows: list[dict], key: Callable[[dict], object]) -> list[int]:
    """Per event, the window on its lane that started last at or before it, if that window holds it; else -1."""
    out = []
    for e in events:
        best = -1
        for j, w in enumerate(windows):
            if key(w) == key(e) and w["ts"] <= e["ts"] and (best < 0 or w["ts"] >= windows[best]["ts"]):
                best = j
        w = windows[best] if best >= 0 else None
        out.append(best if w is not None and e["ts"] + e["dur"] <= w["ts"] + w["dur"] + 1e-3 else -1)
    return out


@pytest.mark.parametrize("across_threads", [False, True])
def test_window_of_matches_a_plain_loop(across_threads):
    rng = np.random.default_rng(16)
    events = []
    for pid in (1, 2):
        for tid in range(6):
            t = float(rng.integers(0, 5))
            for _ in range(4):  # windows on a lane, never overlapping; some touch, some start together on other lanes
                dur = float(rng.integers(0, 4)) * 5
                events.append({"ph": "X", "cat": "user_annotation", "name": "w", "ts": t, "dur": dur})
                events[-1] |= {"pid": pid, "tid": tid}
                t += dur + float(rng.integers(0, 3)) * 5
    for _ in range(400):
        ts, dur = float(rng.integers(0, 90)), float(rng.integers(0, 12))
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::x", "ts": ts, "dur": dur})
        events[-1] |= {"pid": int(rng.integers(1, 3)), "tid": int(rng.integers(0, 7))}
    trace = parse(events)
    windows = annotation_windows(trace, "w")
    ordered = [events[i] for i in windows.index]  # the windows as window_of numbers them
    key = (lambda e: e["pid"]) if across_threads else (lambda e: (e["pid"], e["tid"]))
    got = window_of(trace, windows, across_threads=across_threads)
    assert list(got) == plain_window_of(events, ordered, key)


# --- 200,000 one-event threads: the timeline stays small ---------------------------------------


def one_event_threads(n: int, busy: int) -> list[dict]:
    """`n` threads with one op each; the first `busy` threads' ops are longer than all the rest."""
    return [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::add",
            "ts": i,
            "dur": 100 + i if i < busy else 1,
            "pid": 1,
            "tid": i,
        }
        for i in range(n)
    ]


def test_two_hundred_thousand_one_event_threads_make_a_small_figure():
    busy = MAX_LANES + 5
    fig = timeline(analyze(parse(one_event_threads(200_000, busy))))
    size = len(fig.to_json())
    lanes = list(fig.layout.yaxis.ticktext)
    assert bars(fig) < MAX_BARS_DRAWN and size < FIGURE_BYTES, (bars(fig), size)
    assert len(lanes) == MAX_LANES + 1 and lanes[-1].startswith("others")
    assert fig.layout.height <= MAX_HEIGHT
    # The busiest lanes by a plain reading: the longest ops, of threads busy - MAX_LANES .. busy - 1.
    assert sorted(lanes[:-1]) == sorted(f"CPU thread {tid}" for tid in range(busy - MAX_LANES, busy))


def plain_union_per_lane(events: list[dict]) -> dict[object, float]:
    by_lane = defaultdict(list)
    for e in events:
        by_lane[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    out = {}
    for lane, spans in by_lane.items():
        total, reach = 0.0, -np.inf
        for s, u in sorted(spans):
            total += max(0.0, u - max(s, reach))
            reach = max(reach, u)
        out[lane] = total
    return out


def test_lanes_kept_are_the_busiest_by_the_union_of_their_events():
    """A thread of deeply nested ops is busy for its outermost op only: summing durations would overrate it."""
    events = []
    for tid in range(MAX_LANES + 20):
        if tid % 2:
            events.append({"ph": "X", "cat": "cpu_op", "name": "outer", "ts": 0, "dur": 10 + tid, "tid": tid})
            for k in range(5):  # nested inside the outer op: adds nothing to the busy time
                events.append({"ph": "X", "cat": "cpu_op", "name": "inner", "ts": 1 + k, "dur": 8, "tid": tid})
        else:
            events.append({"ph": "X", "cat": "cpu_op", "name": "flat", "ts": 0, "dur": 5 + tid, "tid": tid})
            events.append({"ph": "X", "cat": "cpu_op", "name": "flat", "ts": 200, "dur": 7, "tid": tid})
    for e in events:
        e["pid"] = 1
    busy = plain_union_per_lane(events)
    top = sorted(busy, key=lambda lane: -busy[lane])[:MAX_LANES]
    fig = timeline(analyze(parse(events)))
    lanes = list(fig.layout.yaxis.ticktext)
    assert sorted(lanes[:-1]) == sorted(f"CPU thread {tid}" for tid in top)
    hovers = [h for t in fig.data for h, y in zip(t.hovertext, t.y, strict=True) if y >= fig.layout.yaxis.tickvals[-1]]
    assert hovers and all("on CPU thread " in h for h in hovers)  # an "others" bar names its own thread


def test_hostile_names_keep_the_figure_under_a_megabyte():
    """Names, shapes and categories of characters that escape to 6 bytes each (`&quot;`, `\\u20ac`)."""
    quote, euro = '"' * 200, "€" * 200
    events = []
    for i in range(MAX_BARS_DRAWN):
        events.append(
            {
                "ph": "X",
                "cat": "kernel" if i % 2 else euro,
                "name": quote + str(i),
                "ts": i * 10,
                "dur": 5,
                "pid": 0,
                "tid": 7,
                "args": {"correlation": i, "stream": 7, "device": 0, "grid": [i, 1, 1], "block": [128, 1, 1]},
            }
        )
    fig = timeline(analyze(parse(events)))
    assert bars(fig) == MAX_BARS_DRAWN  # a trace this small is drawn whole
    assert len(fig.to_json()) < FIGURE_BYTES
    assert all("&quot;" in h for t in fig.data for h in t.hovertext)  # still named, still escaped


def test_many_categories_share_one_legend_entry_past_the_cap():
    events = [
        {"ph": "X", "cat": f"cat{i % 100}", "name": f"op{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1}
        for i in range(1000)
    ]
    fig = timeline(analyze(parse(events)))
    assert len(fig.data) == MAX_CATEGORIES + 1 and [t.name for t in fig.data].count("other categories") == 1
    assert bars(fig) == 1000


def test_busy_per_group_matches_a_plain_union():
    rng = np.random.default_rng(7)
    group = rng.integers(0, 9, 500)
    starts = rng.integers(0, 1000, 500).astype(float)
    ends = starts + rng.integers(0, 60, 500)
    got = iv.busy_per_group(group, starts, ends, 10)
    events = [{"tid": int(g), "ts": float(s), "dur": float(e - s)} for g, s, e in zip(group, starts, ends, strict=True)]
    want = plain_union_per_lane(events)
    assert list(got) == pytest.approx([want.get(g, 0.0) for g in range(10)])
