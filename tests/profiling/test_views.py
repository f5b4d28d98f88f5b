"""The views registry (profiling/views.py) on real recorded traces, against plain loops over their JSON.

Each figure below is read again from the raw events with plain Python (or from torch's own key_averages,
saved when the trace was recorded), never from the analysis modules the views call.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from profiling.memory_curve import MAX_CURVE_POINTS, thin
from profiling.trace import load_trace
from profiling.views import NO_KERNELS, NO_MEMORY, VIEWS, ViewError, view

DATA = Path(__file__).resolve().parents[1] / "data"
CPU_MEMORY = DATA / "cpu_memory" / "mlp_cpu_memory.json.gz"
CPU_MODULES = DATA / "cpu_modules" / "seq_linear_with_stack.json.gz"
MHA = DATA / "gpu" / "h100_nn-mha_fp32.json.gz"
OWLV2 = DATA / "gpu" / "h100_owlv2_eager-attn.json.gz"  # 13,474 memory events: the curve must be thinned
GPU_ACTIVITY = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCHES = {"cuda_runtime", "cuda_driver"}


@cache
def raw(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


@cache
def trace(path: Path):
    return load_trace(path)


def origin(events: list[dict]) -> float:
    """The first start of a duration or instant event."""
    return min(e["ts"] for e in events if e.get("ph") in ("X", "i"))


def device_of(args: dict) -> str | None:
    kind = args.get("Device Type")
    return "CPU" if kind == 0 else f"GPU{args['Device Id']}" if kind in (1, 6) else None


def memory_series(events: list[dict]) -> dict[str, list[tuple[float, float, float]]]:
    """Per device, (ts, Total Allocated, Total Reserved) of each [memory] event, in time order."""
    series = defaultdict(list)
    for e in sorted((e for e in events if e.get("name") == "[memory]" and e.get("ph") == "i"), key=lambda e: e["ts"]):
        args = e["args"]
        series[device_of(args)].append((e["ts"], args.get("Total Allocated"), args.get("Total Reserved")))
    return series


def innermost(events: list[dict], at: dict, category: str) -> dict | None:
    """The innermost `category` event on `at`'s thread whose [ts, ts + dur] holds `at`'s start."""
    best = None
    for e in events:
        if e.get("cat") != category or e.get("ph") != "X" or (e["pid"], e["tid"]) != (at["pid"], at["tid"]):
            continue
        if e["ts"] <= at["ts"] <= e["ts"] + e["dur"] and (
            best is None or (e["ts"], -e["dur"]) > (best["ts"], -best["dur"])
        ):
            best = e
    return best


def launched_by(events: list[dict]) -> dict[int, dict]:
    """Per GPU event's correlation id, the launch (runtime or driver call) that made it."""
    return {
        e["args"]["correlation"]: e for e in events if e.get("cat") in LAUNCHES and "correlation" in e.get("args", {})
    }


# Memory


def test_memory_peaks_are_the_raw_maximum_and_survive_thinning():
    events = raw(MHA)
    shown = view(trace(MHA), "memory")
    start = origin(events)
    peaks = shown.peaks.set_index("device")
    for device, points in memory_series(events).items():
        highest = max(a for _, a, _ in points)
        first_ts = next(ts for ts, a, _ in points if a == highest)
        assert peaks.loc[device, "peak allocated (B)"] == highest, device
        assert peaks.loc[device, "peak time (ms)"] == pytest.approx((first_ts - start) / 1000, abs=1e-6), device
        assert peaks.loc[device, "peak reserved (B)"] == max(r for _, _, r in points), device
        drawn = shown.curve[(shown.curve["device"] == device) & (shown.curve["series"] == "allocated")]
        # Fewer points than the cap: the whole curve is drawn.
        assert drawn["bytes"].tolist() == [a for _, a, _ in points], device
    assert f"GPU0 {94398464 / 2**20:.1f} MiB" in shown.note  # the raw peak, in the note


def test_memory_ops_match_key_averages():
    """torch's own self_cpu_memory_usage per op (saved beside the trace) is the view's self increase."""
    averages = json.loads((DATA / "cpu_memory" / "key_averages.json").read_text())["key_averages"]
    shown = view(trace(CPU_MEMORY), "memory")
    table = shown.table.set_index("name")
    ops = {name: figures for name, figures in averages.items() if name != "[memory]"}
    assert len(ops) >= 20
    for name, figures in ops.items():
        assert table.loc[name, "self increase (B)"] == figures["self_cpu_memory_usage"], name
    assert shown.rows == len(shown.table) and shown.curve is not None
    assert set(shown.curve["series"]) == {"allocated"}  # the CPU allocator reserves nothing: no flat line drawn


def test_memory_curve_thinned_on_a_long_real_trace():
    events = raw(OWLV2)
    shown = view(trace(OWLV2), "memory")
    start = origin(events)
    for device, points in memory_series(events).items():
        for column, series in ((1, "allocated"), (2, "reserved")):
            values = np.array([p[column] for p in points], dtype=np.float64)
            if series == "reserved" and not values.any():
                continue
            drawn = shown.curve[(shown.curve["device"] == device) & (shown.curve["series"] == series)]
            assert 0 < len(drawn) <= MAX_CURVE_POINTS
            assert drawn["bytes"].max() == values.max() and drawn["bytes"].min() == values.min()
            times = np.array([(p[0] - start) / 1000 for p in points])
            peak = int(np.argmax(values))  # the first at the peak
            hit = drawn[(drawn["bytes"] == values[peak])]
            assert hit["time (ms)"].iloc[0] == pytest.approx(times[peak], abs=1e-6), (device, series)
    gpu = shown.curve[(shown.curve["device"] == "GPU0") & (shown.curve["series"] == "allocated")]
    assert len(memory_series(events)["GPU0"]) > MAX_CURVE_POINTS >= len(gpu)


def test_thin_keeps_every_bucket_extreme():
    rng = np.random.default_rng(0)
    values = np.cumsum(rng.normal(size=100_000))
    values[54_321] = values.max() + 1000  # a one-point spike
    values[12_345] = values.min() - 1000
    kept = thin(values)
    assert len(kept) <= MAX_CURVE_POINTS and np.all(np.diff(kept) > 0)
    assert {0, 99_999, 54_321, 12_345} <= set(kept.tolist())
    # Every point has a kept point at least as high, and one at least as low, within one run of it.
    run = math.ceil(len(values) / ((MAX_CURVE_POINTS - 2) // 2))
    for i in rng.integers(0, len(values), 500).tolist():
        near = kept[(kept >= i - run) & (kept <= i + run)]
        assert values[near].max() >= values[i] and values[near].min() <= values[i]
    assert thin(values[:10]).tolist() == list(range(10))


def test_memory_chart_marks_the_raw_peak():
    from profiling.charts.memory import memory_chart

    events = raw(OWLV2)
    start, series = origin(events), memory_series(events)
    fig = memory_chart(view(trace(OWLV2), "memory"))
    marks = {t.name: t for t in fig.data if t.mode == "markers+text"}
    lines = [t for t in fig.data if t.mode == "lines"]
    assert set(marks) == {f"{device} peak" for device in series}
    for device, points in series.items():
        highest = max(a for _, a, _ in points)
        first_ts = next(ts for ts, a, _ in points if a == highest)
        assert marks[f"{device} peak"].y[0] == highest / 2**20
        assert marks[f"{device} peak"].x[0] == pytest.approx((first_ts - start) / 1000, abs=1e-6)
    for device, points in series.items():
        (allocated,) = (t for t in lines if t.name == f"{device} allocated")
        assert allocated.y.max() == max(a for _, a, _ in points) / 2**20
    assert all(len(t.x) <= MAX_CURVE_POINTS for t in lines) and len(lines) == 3  # CPU reserves nothing
    assert memory_chart(view(trace(OWLV2), "modules", top=1)) is None


def test_memory_events_pair_allocations_with_frees():
    """Rows = allocations plus frees whose allocation came before the trace, paired per (device, address)."""
    events = raw(CPU_MEMORY)
    open_at, rows, biggest = {}, 0, 0
    for e in sorted((e for e in events if e.get("name") == "[memory]" and e.get("ph") == "i"), key=lambda e: e["ts"]):
        key, size = (device_of(e["args"]), e["args"]["Addr"]), e["args"]["Bytes"]
        if size > 0:
            open_at[key], rows, biggest = size, rows + 1, max(biggest, size)
        elif open_at.pop(key, None) is None:
            rows += 1  # freed, allocated before the trace
    shown = view(trace(CPU_MEMORY), "memory events", top=5)
    assert shown.rows == rows and len(shown.table) == 5
    assert shown.table["size (B)"].iloc[0] == biggest
    assert "The first 5 of" in shown.note


def test_no_memory_events_says_why():
    for name in ("memory", "memory events"):
        shown = view(trace(CPU_MODULES), name)
        assert shown.table.empty and shown.rows == 0 and shown.note == NO_MEMORY
        assert len(shown.table.columns) >= 5  # the schema is kept
        json.dumps(shown.to_dict(), allow_nan=False)


# Modules


@pytest.mark.parametrize(("path", "events_expected"), [(MHA, 33), (CPU_MODULES, 9)])
def test_modules_calls_and_host_time(path, events_expected):
    events = [e for e in raw(path) if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")]
    assert len(events) == events_expected
    plain = defaultdict(lambda: [0, 0.0])
    for e in events:
        plain[e["name"].removeprefix("nn.Module: ")][0] += 1
        plain[e["name"].removeprefix("nn.Module: ")][1] += e["dur"]
    shown = view(trace(path), "modules")
    got = shown.table.groupby("module")[["calls", "host total (us)"]].sum()
    assert {m: (int(r["calls"]), r["host total (us)"]) for m, r in got.iterrows()} == {
        m: (c, pytest.approx(d)) for m, (c, d) in plain.items()
    }
    assert shown.table["calls"].sum() == events_expected


def test_modules_device_time_of_the_root():
    """The root module's device total: the GPU work of every launch made on its thread within its calls."""
    events = raw(MHA)
    roots = [e for e in events if e.get("name") == "nn.Module: SimpleTransformerLayer_0"]
    gpu = defaultdict(float)
    for e in events:
        if e.get("cat") in GPU_ACTIVITY and e.get("ph") == "X":
            gpu[e["args"]["correlation"]] += e["dur"]
    total = 0.0
    for launch in launched_by(events).values():
        if any(r["tid"] == launch["tid"] and r["ts"] <= launch["ts"] <= r["ts"] + r["dur"] for r in roots):
            total += gpu.get(launch["args"]["correlation"], 0.0)
    table = view(trace(MHA), "modules").table.set_index("module path")
    assert table.loc["SimpleTransformerLayer_0", "device total (us)"] == pytest.approx(total)
    assert total > 0


def test_modules_without_gpu_have_unknown_device_time():
    shown = view(trace(CPU_MODULES), "modules")
    assert shown.table["device total (us)"].isna().all() and "device time is unknown" in shown.note
    assert all(row["device total (us)"] is None for row in shown.to_dict()["table"])


# Grouping


def counted_ops(events: list[dict]) -> list[dict]:
    """The cpu_op events an op table counts: all but an op that is the only child of a same-name parent (the
    innermost enclosing cpu_op on its thread; of two with one span, the earlier in the file is the parent),
    which is merged into that parent."""
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    parent = {}
    for i, e in enumerate(ops):
        around = [
            (p["ts"], -p["dur"], j)
            for j, p in enumerate(ops)
            if j != i
            and (p["pid"], p["tid"]) == (e["pid"], e["tid"])
            and p["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= p["ts"] + p["dur"]
            and ((p["ts"], p["dur"]) != (e["ts"], e["dur"]) or j < i)
        ]
        parent[i] = max(around)[2] if around else None
    children = defaultdict(int)
    for j in parent.values():
        if j is not None:
            children[j] += 1
    return [
        e
        for i, e in enumerate(ops)
        if not (parent[i] is not None and ops[parent[i]]["name"] == e["name"] and children[parent[i]] == 1)
    ]


def test_ops_by_input_shape_calls_and_cpu_time():
    plain = defaultdict(lambda: [0, 0.0])
    for e in counted_ops(raw(CPU_MEMORY)):
        key = (e["name"], str(e["args"].get("Input Dims", "")))
        plain[key][0] += 1
        plain[key][1] += e["dur"]
    shown = view(trace(CPU_MEMORY), "ops by input shape")
    got = {(r["name"], r["input dims"]): (r["calls"], r["total cpu (us)"]) for r in shown.table.to_dict("records")}
    assert shown.rows == len(plain) == len(got) > 50
    assert got == {k: (c, pytest.approx(d)) for k, (c, d) in plain.items()}


def test_ops_by_call_stack_on_a_with_stack_trace():
    """Each op's stack: the python_function events around it on its thread, innermost first."""
    events = raw(CPU_MODULES)
    python = [e for e in events if e.get("cat") == "python_function" and e.get("ph") == "X"]
    plain = defaultdict(int)
    for op in counted_ops(events):
        around = [
            p
            for p in python
            if p["tid"] == op["tid"] and p["ts"] <= op["ts"] and op["ts"] + op["dur"] <= p["ts"] + p["dur"]
        ]
        around.sort(key=lambda p: (p["ts"], -p["dur"]), reverse=True)
        plain[(op["name"], " <- ".join(p["name"] for p in around[:16]))] += 1
    shown = view(trace(CPU_MODULES), "ops by call stack")
    got = {(r["name"], r["call stack"]): r["calls"] for r in shown.table.to_dict("records")}
    assert got == dict(plain)
    assert any("nn.Module: Linear_0" in stack for _, stack in got)


def test_kernels_by_launch_configuration():
    events = raw(MHA)
    launches = launched_by(events)
    plain = defaultdict(lambda: [0, 0.0])
    for k in (e for e in events if e.get("cat") == "kernel"):
        a = k["args"]
        op = innermost(events, launches[a["correlation"]], "cpu_op")
        key = (k["name"], op["name"] if op else "", str(a["grid"]), str(a["block"]))
        plain[key][0] += 1
        plain[key][1] += k["dur"]
    shown = view(trace(MHA), "kernels by launch")
    got = defaultdict(lambda: [0, 0.0])  # registers and shared memory split no group in this trace
    for r in shown.table.to_dict("records"):
        got[(r["kernel"], r["op"], r["grid"], r["block"])][0] += r["calls"]
        got[(r["kernel"], r["op"], r["grid"], r["block"])][1] += r["total (us)"]
    assert dict(got) == {k: [c, pytest.approx(d)] for k, (c, d) in plain.items()}
    assert shown.table["calls"].sum() == 48 == sum(c for c, _ in plain.values())


def test_tensor_cores_per_op():
    """Self kernel time per launching op, and the part in tensor-core kernels (sm90 xmma and CUTLASS tensorop
    GEMMs, by their names: this trace's TF32 GEMMs)."""
    events = raw(MHA)
    launches = launched_by(events)
    plain = defaultdict(lambda: [0.0, 0.0])
    for k in (e for e in events if e.get("cat") == "kernel"):
        op = innermost(events, launches[k["args"]["correlation"]], "cpu_op")
        plain[op["name"]][0] += k["dur"]
        plain[op["name"]][1] += k["dur"] if ("xmma" in k["name"] or "tensorop" in k["name"]) else 0.0
    shown = view(trace(MHA), "tensor cores")
    table = shown.table.set_index("name")
    for name, (ran, on_tc) in plain.items():
        assert table.loc[name, "self kernel (us)"] == pytest.approx(ran), name
        assert table.loc[name, "tc self kernel (us)"] == pytest.approx(on_tc), name
    assert bool(table.loc["aten::addmm", "tc eligible"]) and not bool(table.loc["aten::add", "tc eligible"])
    eligible = {"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul"}
    ran = sum(v[0] for n, v in plain.items() if n in eligible)
    assert f"of their {ran:,.1f} µs" in shown.note


def test_views_without_gpu_kernels_say_why():
    for name in ("kernels by launch", "tensor cores"):
        shown = view(trace(CPU_MEMORY), name)
        assert shown.note.startswith(NO_KERNELS), name
    assert view(trace(CPU_MEMORY), "kernels by launch").table.empty


# The registry


@pytest.mark.parametrize("path", [CPU_MEMORY, CPU_MODULES, MHA])
def test_every_view_is_json_native(path):
    for name in VIEWS:
        shown = view(trace(path), name, top=7)
        text = shown.to_json()
        assert json.loads(text) == shown.to_dict()
        assert json.dumps(json.loads(text), allow_nan=False)
        data = shown.to_dict()
        assert data["shown"] == len(data["table"]) <= 7 and data["rows"] >= data["shown"]
        assert data["columns"] == list(shown.table.columns)
        assert "path" not in data["columns"]  # gradio_client would fetch {"path": ...} objects as files
        if data["rows"] > 7:
            assert f"7 of {data['rows']:,}" in shown.note, name


def test_unknown_view_names_the_field():
    with pytest.raises(ViewError, match="^view: choose one of memory, "):
        view(trace(CPU_MEMORY), "flame graph")
