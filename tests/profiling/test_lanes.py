"""Timeline lanes are named from the trace's own `ph: M` metadata (issue 20, Charts), read within bounds, and
the bars of the initial view are kept apart when a big trace is merged.

Every expected name comes from a plain loop over the trace's JSON, never from the reader.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import profiling.reader as reader
from profiling.analysis import analyze
from profiling.charts import timeline
from profiling.charts.timeline import focus_range
from profiling.lane_names import MAX_LANE_NAMES
from profiling.lanes import FOCUS_SHARE
from profiling.names import MAX_NAME_CHARS
from profiling.reader import read_text
from profiling.trace import load_trace, parse_trace
from tests.conftest import DATA

GPU_TRACES = sorted((DATA / "gpu").glob("*.json.gz"))
NAMED = [
    *GPU_TRACES,
    DATA / "a100_simple_add.json.gz",
    DATA / "sampled_training_rank0.json.gz",
    DATA / "cpu_only.json.gz",
]
RESNET = DATA / "tb_plugin" / "resnet50_num_workers_4.pt.trace.json.gz"  # torch 1.8: tid "stream 7"
HOST = {"cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver", "Operator", "Runtime", "Python"}
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def events_of(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    document = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return document["traceEvents"] if isinstance(document, dict) else document


def plain_names(events: list[dict[str, Any]]) -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """Thread names per (pid, tid) and process labels per pid, the first of each, as a plain loop reads them."""
    threads: dict[tuple[str, str], str] = {}
    labels: dict[str, str] = {}
    for e in events:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if e.get("ph") != "M":
            continue
        if e.get("name") == "thread_name" and isinstance(args.get("name"), str):
            threads.setdefault((str(e.get("pid")), str(e.get("tid"))), args["name"].strip())
        elif e.get("name") == "process_labels" and isinstance(args.get("labels"), str):
            labels.setdefault(str(e.get("pid")), args["labels"].strip())
    return threads, labels


def plain_lane_labels(events: list[dict[str, Any]]) -> set[str]:
    """The label every drawn lane should carry: a device stream as "<process label> · <thread name>", a host
    thread by its thread name, each from the metadata where it names them, from the ids where it does not."""
    threads, labels = plain_names(events)
    drawn = [e for e in events if e.get("ph") == "X" and e.get("name") and e.get("cat") != "Trace"]
    device_pids = {str(e.get("pid")) for e in drawn if e.get("cat") in DEVICE}
    host_lanes = {(str(e.get("pid")), str(e.get("tid"))) for e in drawn if e.get("cat") in HOST}
    out = set()
    for pid, tid in {(str(e.get("pid")), str(e.get("tid"))) for e in drawn}:
        name = threads.get((pid, tid))
        if pid in device_pids and (pid, tid) not in host_lanes:
            stream = name or (tid if tid.startswith("stream") else f"stream {tid}")
            out.add(f"{labels.get(pid) or f'GPU {pid}'} · {stream}")
        else:
            out.add(name or f"CPU thread {tid}")
    return out


def ticks(fig: Any) -> list[str]:
    return list(fig.layout.yaxis.ticktext)


@pytest.mark.parametrize("path", [*NAMED, RESNET], ids=lambda p: p.name)
def test_lane_names_are_the_metadata_names(path):
    events = events_of(path)
    fig = timeline(analyze(load_trace(path)))
    assert sorted(ticks(fig)) == sorted(plain_lane_labels(events))
    threads, _ = plain_names(events)
    drawn = {(str(e.get("pid")), str(e.get("tid"))) for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"}
    for lane in drawn & set(threads):  # every lane the trace names is drawn under that name
        assert any(tick == threads[lane] or tick.endswith(f" · {threads[lane]}") for tick in ticks(fig)), lane
    assert not any("stream stream" in t or t.startswith("CPU thread -") for t in ticks(fig))


def test_kineto_gpu_streams_read_gpu_0_stream_7():
    labels = ticks(timeline(analyze(load_trace(DATA / "a100_simple_add.json.gz"))))
    assert {"GPU 0 · stream 7", "GPU 0 · stream 20", "GPU 0 · Device 0"} <= set(labels)  # syncs: the device's lane
    assert "thread 493459 (python3.10)" in labels
    old = ticks(timeline(analyze(load_trace(RESNET))))  # torch 1.8 wrote the tid as "stream 7", and no labels
    assert "GPU 0 · stream 7" in old and "thread 5555 (python)" in old


def test_a_host_thread_under_a_device_pid_is_a_cpu_lane():
    # Kineto's Python tracer writes `python_function` events under pid 0, the GPU's pid, as "thread 0 (python3)".
    path = DATA / "gpu" / "h100_qwen1.5-0.5b_prefill.json.gz"
    assert any(e.get("pid") == 0 and e.get("cat") == "python_function" for e in events_of(path))
    labels = ticks(timeline(analyze(load_trace(path))))
    assert "thread 0 (python3)" in labels and not any("· thread 0" in t for t in labels)
    assert labels.index("thread 0 (python3)") < labels.index("GPU 0 · stream 7")  # host lanes first


def test_our_cpu_run_lanes_are_its_thread_names(cpu_runs):
    result = cpu_runs["naive"]
    events = json.loads(result.trace_path.read_text())["traceEvents"]
    threads, _ = plain_names(events)
    assert threads, "torch writes thread_name metadata for its CPU thread"
    labels = ticks(timeline(result.analysis))
    assert labels == sorted(plain_lane_labels(events)) and set(labels) <= set(threads.values())


@pytest.mark.parametrize("path", [*NAMED, RESNET], ids=lambda p: p.name)
def test_the_reader_keeps_the_metadata_names_by_both_routes(path):
    events = events_of(path)
    want = {}
    for e in events:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        key = {"thread_name": "name", "process_name": "name", "process_labels": "labels"}.get(e.get("name"))
        if e.get("ph") == "M" and key and isinstance(args.get(key), str):
            want.setdefault((e["name"], str(e.get("pid")), str(e.get("tid"))), args[key])
    data = path.read_bytes()
    assert read_text(data).lane_names == want
    assert read_text(data, typed=False).lane_names == want


def test_the_decode_helper_keeps_the_names(monkeypatch):
    monkeypatch.setattr(reader, "START_AFTER_BYTES", 0)
    monkeypatch.setattr(reader, "helper_wanted", lambda: True)
    events = events_of(DATA / "sampled_training_rank0.json.gz")
    data = json.dumps({"traceEvents": events * 3}).encode()
    threads, labels = plain_names(events)
    names = read_text(data).lane_names
    assert {(p, t): n.strip() for (k, p, t), n in names.items() if k == "thread_name"} == threads
    assert {p: n for (k, p, _), n in names.items() if k == "process_labels"} == labels


def meta(kind: str, pid: Any, tid: Any, value: Any) -> dict[str, Any]:
    return {
        "ph": "M",
        "name": kind,
        "pid": pid,
        "tid": tid,
        "args": {"labels" if kind == "process_labels" else "name": value},
    }


def op(pid: Any, tid: Any, ts: float = 0, name: str = "aten::mm", cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": 1}


def test_names_are_bounded_in_count_and_length():
    many = [meta("thread_name", 1, i, f"worker {i}") for i in range(MAX_LANE_NAMES + 500)]
    long = meta("thread_name", 2, 1, "x" * (MAX_NAME_CHARS * 3))
    trace = parse_trace(json.dumps({"traceEvents": [long, *many, op(1, 0), op(2, 1)]}).encode())
    assert len(trace.lane_names) == MAX_LANE_NAMES
    assert ("thread_name", "1", str(MAX_LANE_NAMES - 2)) in trace.lane_names  # the first ones, in file order
    assert ("thread_name", "1", str(MAX_LANE_NAMES - 1)) not in trace.lane_names
    assert len(trace.lane_names[("thread_name", "2", "1")]) == MAX_NAME_CHARS
    labels = ticks(timeline(analyze(trace)))
    assert "worker 0" in labels and max(map(len, labels)) <= 120  # a lane label is cut as before


def test_odd_names_name_nothing_and_markup_stays_text():
    events = [
        meta("thread_name", 1, 1, 42),  # a number names nothing: the ids do
        meta("thread_name", 1, 2, ["a"]),
        meta("thread_name", 1, 3, '<img src="http://x/y.png">'),
        meta("thread_name", 1, 4, "   "),  # blank: the ids
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 5, "args": None},
        *(op(1, tid) for tid in (1, 2, 3, 4, 5)),
    ]
    data = json.dumps({"traceEvents": events}).encode()
    assert read_text(data).lane_names == read_text(data, typed=False).lane_names
    labels = ticks(timeline(analyze(parse_trace(data))))
    assert {"CPU thread 1", "CPU thread 2", "CPU thread 4", "CPU thread 5"} <= set(labels)
    assert "&lt;img src=&quot;http://x/y.png&quot;&gt;" in labels and not any("<img" in t for t in labels)


def test_a_big_trace_keeps_the_first_forwards_bars_apart():
    """3,000 forwards of 5 ops each plus their window: past the bar budget, the first forward's events (the
    initial view) are still drawn one bar each, and the total stays within the budget."""
    events = []
    for i in range(3000):
        start = i * 100.0
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": "attn_fwd", "ts": start, "dur": 50, "pid": 1, "tid": 1}
        )
        events += [op(1, 1, start + 1 + 9 * k, name=f"aten::op{k}") | {"dur": 8} for k in range(5)]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    analysis = analyze(trace)
    lo, hi = focus_range(analysis)
    inside = [e for e in events if e["ts"] + e["dur"] >= lo and e["ts"] <= hi]
    assert len(inside) == 6  # the first window and its five ops, by a plain reading
    fig = timeline(analysis, max_bars=2000)
    bars = [(b, w) for t in fig.data for b, w in zip(t.base, t.x, strict=True)]
    assert len(bars) <= 2000
    t0 = min(e["ts"] for e in events)
    in_view = sorted(round(b, 4) for b, w in bars if b * 1e3 + t0 <= hi and (b + w) * 1e3 + t0 >= lo)
    assert in_view == sorted(round((e["ts"] - t0) / 1e3, 4) for e in inside)  # each at its own start
    assert list(fig.layout.xaxis.range) == pytest.approx([(lo - t0) / 1e3, (hi - t0) / 1e3])
    assert 0 < FOCUS_SHARE < 1


def test_a_big_traces_texts_are_drawn_from_codes_as_the_columns_hold_them():
    # Past the bar budget the timeline reads names, categories and lanes as Categoricals of the trace's codes.
    # Every event's values must be the columns' own: missing categories, numeric ids, markup, all events kept.
    from profiling.lanes import TIMELINE_COLUMNS, timed_events

    events = [
        {"ph": "X", "name": name, "cat": cat, "ts": i, "dur": 1 + i % 3, "pid": pid, "tid": tid}
        for i, (name, cat, pid, tid) in enumerate(
            [
                ("<b>op</b>", "cpu_op", 1, 7),
                ("kernel", "kernel", 0, 7.0),
                ("k", None, "host", "stream 9"),
                ("n", 7, 1, 8),
                ("", "cpu_op", 1, 7),  # no name: not drawn
                ("Trace", "Trace", 1, 7),  # the profiler's own span: not drawn
            ]
            * 300
        )
    ]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    coded, plain = timed_events(trace, 0), timed_events(trace, len(events))
    assert len(coded) == len(plain) == 4 * 300
    assert (coded.index == plain.index).all()
    for column in TIMELINE_COLUMNS:
        assert coded[column].astype(object).tolist() == plain[column].astype(object).tolist(), column
    assert (coded["cat"] == "").sum() == 2 * 300  # no text category (missing, or a number) reads as ""


def _keys_by_sorting(events, max_bars: int, span=None):
    """merge_keys's rule by the plain route: the finest power-of-two buckets whose (lane, depth, bucket) keys,
    counted as a set, number at most `max_bars`."""
    import numpy as np

    from profiling.lanes import MAX_DEPTH

    levels = max(0, int(max_bars).bit_length() - 1)
    t0, t1 = span if span is not None else (float(events["ts"].min()), float(events["end"].max()))
    width = float(t1 - t0) or 1.0
    fraction = np.nan_to_num((events["ts"].to_numpy() - t0) / width)
    bucket = np.clip((fraction * 2**levels).astype(np.int64), 0, 2**levels - 1)
    fine = [
        ((int(lane) * (MAX_DEPTH + 1) + int(depth)) << levels) + int(b)
        for lane, depth, b in zip(events["lane"], events["depth"], bucket, strict=True)
    ]
    for shift in range(levels + 1):
        if len({key >> shift for key in fine}) <= max_bars:
            break
    return [key >> shift for key in fine]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_bars", [1, 2, 7, 64, 3000, 5_000_000])
def test_merge_keys_are_the_plain_counts_at_every_budget(seed, max_bars):
    # A budget of 5 million takes 22 levels: 41 lanes x 7 rows of keys pass the counted mask, and are sorted.
    import numpy as np
    import pandas as pd

    from profiling.lanes import MAX_DEPTH, MAX_LANES, merge_keys

    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 4_000))
    ts = np.round(rng.uniform(0, rng.choice([1.0, 1e3, 1e6]), size), 1)
    events = pd.DataFrame(
        {
            "ts": ts,
            "end": ts + rng.uniform(0, 10, size),
            "lane": rng.integers(0, rng.integers(1, MAX_LANES + 2), size),
            "depth": rng.integers(0, MAX_DEPTH + 1, size),
        }
    )
    span = None if seed % 2 else (float(ts.min()) + 1.0, float(ts.max()))
    assert merge_keys(events, max_bars, span).tolist() == _keys_by_sorting(events, max_bars, span)


def test_merge_keys_at_the_budgets_edge_and_past_the_counted_keys():
    import pandas as pd

    from profiling.lanes import merge_keys

    # A budget of 4 makes 4 buckets of the span [0, 4): one per µs. Depth 0 fills buckets 0-2 and depth 1 buckets 0-1:
    # 5 keys, one more than the budget, so the buckets are halved (3 keys). Without depth 1's second event, 4 keys:
    # the budget exactly, kept as they are.
    five = pd.DataFrame({"ts": [0.0, 1.0, 2.0, 0.0, 1.0], "lane": 0, "depth": [0, 0, 0, 1, 1]})
    five["end"] = five["ts"] + 0.5
    assert merge_keys(five, 4, (0.0, 4.0)).tolist() == [0, 0, 1, 2, 2]
    assert merge_keys(five.head(4), 4, (0.0, 4.0)).tolist() == [0, 1, 2, 4]
    # A budget of 2**40 would count keys up to 2**48 by presence: sorted instead, in the memory of the events.
    assert merge_keys(five, 2**40).tolist() == _keys_by_sorting(five, 2**40)


def _bars_by_a_plain_loop(events, keys) -> list[tuple]:
    """The merged bars by a loop over the events: per key the first of its longest events names and places the bar,
    ts the least, end the most, dur the sum (NaN counting 0), then the bars longest first, ties in event order."""
    bars: dict[int, list] = {}
    for row, (key, event) in enumerate(zip(keys, events.itertuples(index=False), strict=True)):
        length = -math.inf if math.isnan(event.dur) else event.dur
        bar = bars.setdefault(key, [length, row, event, event.ts, event.end, 0.0, 0])
        if length > bar[0]:
            bar[0], bar[1], bar[2] = length, row, event
        bar[3], bar[4] = min(bar[3], event.ts), max(bar[4], event.end)
        bar[5] += 0.0 if math.isnan(event.dur) else event.dur
        bar[6] += 1
    ordered = sorted(bars.values(), key=lambda bar: (-bar[0], bar[1]))
    return [
        (str(e.name), str(e.cat), ts, end, total, count, int(e.lane), int(e.depth), int(e.origin))
        for _, _, e, ts, end, total, count in ordered
    ]


def _drawn_events(path: Path):
    from profiling.lanes import assign_lanes, timed_events

    trace = load_trace(path)
    events, _ = assign_lanes(trace, timed_events(trace, 0))
    return events.drop(columns=["pid", "tid"])


@pytest.mark.parametrize("path", [DATA / "sampled_training_rank0.json.gz", *GPU_TRACES[:3]], ids=lambda p: p.name)
@pytest.mark.parametrize("max_bars", [1, 7, 300, 3000])
def test_merged_bars_are_the_plain_loops(path, max_bars):
    from profiling.lanes import _merged, merge_keys

    events = _drawn_events(path)
    assert events["dur"].duplicated().sum() > len(events) // 4  # ties decide which event names many bars
    span = None if max_bars % 2 else (float(events["ts"].quantile(0.3)), float(events["end"].quantile(0.6)))
    bars = _merged(events, max_bars, span)
    want = _bars_by_a_plain_loop(events, merge_keys(events, max_bars, span).tolist())
    assert len(bars) == len(want)
    got = [
        (str(b.name), str(b.cat), b.ts, b.end, b.dur, b.merged, b.lane, b.depth, b.origin)
        for b in bars.itertuples(index=False)
    ]
    for have, expected in zip(got, want, strict=True):
        assert have[:4] == expected[:4] and have[5:] == expected[5:]
        assert have[4] == pytest.approx(expected[4], rel=1e-12)


def test_the_bars_are_those_of_a_stable_sort_longest_first_and_unmerged_events_come_in_that_order():
    from profiling.lanes import merge

    events = pd.DataFrame(
        {
            "name": ["a", "b", "c", "d", "e", "f"],
            "cat": "kernel",
            "ts": [0.0, 1.0, 2.0, 3.0, 50.0, 51.0],
            "dur": [2.0, 5.0, 5.0, float("nan"), 1.0, 1.0],
            "lane": 0,
            "depth": 0,
            "origin": [3, 4, 5, 6, 7, 8],
        }
    )
    events["end"] = events["ts"] + events["dur"].fillna(0)
    whole, none_merged = merge(events, 6)
    assert none_merged == 0 and whole["name"].tolist() == ["b", "c", "a", "e", "f", "d"]  # ties in order, NaN last
    many = pd.DataFrame({"name": [f"e{i}" for i in range(200)], "ts": 0.0, "dur": [float(i % 3) for i in range(200)]})
    drawn, _ = merge(many.assign(end=many["dur"]), 200)  # past 16 rows numpy's default sort leaves ties in no order
    assert drawn["name"].tolist() == [f"e{i}" for i in sorted(range(200), key=lambda i: (-(i % 3), i))]
    bars, merged = merge(events, 2)  # two buckets of the span: [0, 26) and [26, 52]
    assert merged == 4
    assert bars[["name", "ts", "end", "dur", "merged", "origin"]].values.tolist() == [
        ["b", 0.0, 7.0, 12.0, 4, 4],  # b and c last 5: the first names the bar; d's NaN adds nothing
        ["e", 50.0, 52.0, 2.0, 2, 7],
    ]
