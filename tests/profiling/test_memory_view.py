"""The Memory view against plain loops over the raw JSON, and against torch's own `key_averages` memory columns."""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from profiling.memory_view import EVENT_COLUMNS, OP_COLUMNS, has_memory, memory_view
from profiling.trace import load_trace, parse_trace

DATA = Path(__file__).resolve().parents[1] / "data"
CPU_TRACE = DATA / "cpu_memory" / "mlp_cpu_memory.json.gz"
KEY_AVERAGES = DATA / "cpu_memory" / "key_averages.json"
# Traces small enough for the quadratic plain loop of op ownership; the others are checked on their curve.
OWNED = [CPU_TRACE, DATA / "gpu" / "h100_nn-mha_fp32.json.gz", DATA / "gpu" / "h100_bert-small_sdpa-flash.json.gz"]
WITH_MEMORY = [
    DATA / "gpu" / name
    for name in (
        "h100_bert-small_sdpa-flash.json.gz",
        "h100_nn-mha_fp32.json.gz",
        "h100_owlv2_eager-attn.json.gz",
        "h100_qwen1.5-0.5b_prefill.json.gz",
        "mi300x_qwen1.5-0.5b_prefill.json.gz",
    )
]


def raw_events(path: Path) -> list[dict]:
    return json.load(gzip.open(path))["traceEvents"]


def device_of(args: dict) -> str | None:
    kind = args.get("Device Type")
    return "CPU" if kind == 0 else f"GPU{args.get('Device Id')}" if kind in (1, 6) else None  # 6: HIP (ROCm)


def plain_records(events: list[dict]) -> list[dict]:
    """The [memory] events in time order (file order among equal times), as the plugin sorts them."""
    records = [e for e in events if e.get("name") == "[memory]" and e.get("ph") == "i"]
    return sorted(records, key=lambda e: e["ts"])


def plain_owner(events: list[dict], record: dict) -> dict | None:
    """The innermost cpu_op of the record's (pid, tid) holding its ts in [ts, ts + dur): the latest start."""
    best = None
    for e in events:
        if e.get("cat") != "cpu_op" or e.get("ph") != "X" or (e["pid"], e["tid"]) != (record["pid"], record["tid"]):
            continue
        if e["ts"] <= record["ts"] < e["ts"] + e["dur"] and (
            best is None or (e["ts"], -e["dur"]) > (best["ts"], -best["dur"])
        ):
            best = e
    return best


@pytest.fixture(scope="module")
def cpu_view():
    return memory_view(load_trace(CPU_TRACE))


def test_self_increase_and_calls_match_key_averages(cpu_view):
    """torch's `self_cpu_memory_usage` (recorded beside the trace) is the plugin's self increase."""
    averages = json.loads(KEY_AVERAGES.read_text())["key_averages"]
    ops = cpu_view.ops.set_index("name")
    compared = 0
    for name, figures in averages.items():
        if name == "[memory]":  # events in no op: torch's own row for them
            continue
        assert ops.loc[name, "self_increase_bytes"] == figures["self_cpu_memory_usage"], name
        compared += 1
    assert compared >= 20
    owned = {k: v for k, v in averages.items() if k != "[memory]"}
    assert set(ops.index[(ops["self_increase_bytes"] != 0) | (ops["increase_bytes"] != 0)]) <= set(owned)


def test_unowned_events_are_torch_s_memory_row(cpu_view):
    averages = json.loads(KEY_AVERAGES.read_text())["key_averages"]
    events = raw_events(CPU_TRACE)
    loose = [r["args"]["Bytes"] for r in plain_records(events) if plain_owner(events, r) is None]
    assert len(loose) == averages["[memory]"]["count"]
    assert sum(loose) == averages["[memory]"]["self_cpu_memory_usage"]


@pytest.mark.parametrize("path", OWNED, ids=lambda p: p.name)
def test_op_table_matches_a_plain_loop(path):
    events = raw_events(path)
    self_figures: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0])
    for record in plain_records(events):
        owner, device = plain_owner(events, record), device_of(record["args"])
        if owner is None or device is None:
            continue
        size = record["args"]["Bytes"]
        figures = self_figures[(device, owner["name"])]
        figures[0] += size > 0
        figures[1] += max(size, 0)
        figures[2] += size
    view = memory_view(load_trace(path))
    assert list(view.ops.columns) == OP_COLUMNS
    got = {
        (r.device, r.name): [r.self_alloc_count, r.self_alloc_bytes, r.self_increase_bytes]
        for r in view.ops.itertuples()
        if r.self_alloc_count or r.self_alloc_bytes or r.self_increase_bytes
    }
    assert got == {k: v for k, v in self_figures.items() if any(v)}
    assert view.op_count == len(view.ops)  # under the cap


def plain_totals(events: list[dict]) -> dict[tuple[str, str], list[float]]:
    """Each op instance's figures over every record inside it, summed per name (the plugin's totals)."""
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    owners = [(plain_owner(events, r), r) for r in plain_records(events)]
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0])
    for op in ops:
        for owner, record in owners:
            device = device_of(record["args"])
            if owner is None or device is None or (owner["pid"], owner["tid"]) != (op["pid"], op["tid"]):
                continue
            if op["ts"] <= owner["ts"] and owner["ts"] + owner["dur"] <= op["ts"] + op["dur"]:  # op holds the owner
                size = record["args"]["Bytes"]
                figures = totals[(device, op["name"])]
                figures[0] += size > 0
                figures[1] += max(size, 0)
                figures[2] += size
    return totals


def test_totals_match_a_plain_loop_on_the_cpu_trace(cpu_view):
    totals = plain_totals(raw_events(CPU_TRACE))
    got = {(r.device, r.name): [r.alloc_count, r.alloc_bytes, r.increase_bytes] for r in cpu_view.ops.itertuples()}
    assert got == {k: v for k, v in totals.items() if any(v)}


def test_totals_match_key_averages_where_no_op_nests_in_its_own_name(cpu_view):
    """`cpu_memory_usage` counts an op nested in one of its name once; the plugin's totals count it in each."""
    averages = json.loads(KEY_AVERAGES.read_text())["key_averages"]
    ops = cpu_view.ops.set_index("name")
    checked = 0
    for name, figures in averages.items():
        if name in ops.index and ops.loc[name, "calls"] == figures["count"]:
            assert ops.loc[name, "increase_bytes"] == figures["cpu_memory_usage"], name
            checked += 1
    assert checked >= 15


def plain_pairs(events: list[dict], base: int) -> list[tuple]:
    """The plugin's dict of open allocations, keyed by (device, address)."""
    open_allocs: dict[tuple, dict] = {}
    rows: list[tuple] = []
    for record in plain_records(events):
        args, device = record["args"], device_of(record["args"])
        if device is None or args.get("Addr") is None:
            continue
        key = (device, args["Addr"])
        if args["Bytes"] > 0:
            if key in open_allocs:  # overwritten: never freed within the trace
                rows.append((open_allocs[key], None))
            open_allocs[key] = record
        elif key in open_allocs:
            rows.append((open_allocs.pop(key), record))
        else:
            rows.append((None, record))
    rows += [(alloc, None) for alloc in open_allocs.values()]
    out = []
    for alloc, free in rows:
        first = alloc or free
        owner = plain_owner(events, alloc) if alloc is not None else None
        alloc_ts = None if alloc is None else round(alloc["ts"] - base, 3)
        free_ts = None if free is None else round(free["ts"] - base, 3)
        size = abs(first["args"]["Bytes"])
        out.append((device_of(first["args"]), owner and owner["name"], size, alloc_ts, free_ts))
    return sorted(out, key=repr)


@pytest.mark.parametrize("path", OWNED, ids=lambda p: p.name)
def test_allocation_events_match_the_plugin_s_pairing(path):
    trace = load_trace(path)
    view = memory_view(trace)
    assert list(view.events.columns) == EVENT_COLUMNS
    got = [
        (
            r.device,
            r.op,
            r.bytes,
            None if math.isnan(r.alloc_ts) else round(r.alloc_ts, 3),
            None if math.isnan(r.release_ts) else round(r.release_ts, 3),
        )
        for r in view.events.itertuples()
    ]
    assert sorted(got, key=repr) == plain_pairs(raw_events(path), trace.ts_base_us)
    paired = view.events.dropna(subset=["alloc_ts", "release_ts"])
    assert np.allclose(paired["duration"], paired["release_ts"] - paired["alloc_ts"])
    assert view.events["duration"].isna().sum() == len(view.events) - len(paired)


@pytest.mark.parametrize("path", [CPU_TRACE, *WITH_MEMORY], ids=lambda p: p.name)
def test_peak_is_the_plain_maximum_of_total_allocated(path):
    trace = load_trace(path)
    view = memory_view(trace)
    peaks: dict[str, tuple[float, float]] = {}
    reserved: dict[str, float] = defaultdict(float)
    for record in plain_records(raw_events(path)):
        device, allocated = device_of(record["args"]), record["args"].get("Total Allocated")
        if device is None or allocated is None:
            continue
        if device not in peaks or allocated > peaks[device][0]:
            peaks[device] = (allocated, record["ts"] - trace.ts_base_us)
        reserved[device] = max(reserved[device], record["args"].get("Total Reserved", 0))
    got = {r.device: (r.peak_allocated, r.peak_ts, r.peak_reserved) for r in view.peaks.itertuples()}
    assert got.keys() == peaks.keys()
    for device, (value, ts) in peaks.items():
        assert got[device][0] == value
        assert got[device][1] == pytest.approx(ts, abs=1e-3)
        assert got[device][2] == reserved[device]
    assert len(view.curves) == sum(1 for r in plain_records(raw_events(path)) if device_of(r["args"]))


def synthetic(events: list[dict]):
    return parse_trace(json.dumps({"traceEvents": events}).encode())


def memory_event(ts: float, size: int, addr: int, allocated: int, device_type: int = 1, tid: int = 1) -> dict:
    args = {"Bytes": size, "Addr": addr, "Total Allocated": allocated, "Total Reserved": 4096}
    args |= {"Device Type": device_type, "Device Id": 0}
    return {"name": "[memory]", "ph": "i", "cat": "cpu_instant_event", "pid": 1, "tid": tid, "ts": ts, "args": args}


def test_no_memory_events_no_view():
    trace = synthetic([{"name": "aten::mm", "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0, "dur": 5}])
    assert not has_memory(trace)
    assert memory_view(trace) is None


def test_right_open_ownership_and_pairing_per_device():
    op = {"name": "aten::mm", "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0, "dur": 10}
    inner = {"name": "aten::empty", "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 2, "dur": 3}
    events = [
        op,
        inner,
        memory_event(2, 100, 7, 100),  # starts with `inner`: inner's
        memory_event(5, 50, 8, 150),  # where `inner` ends: op's own (right-open)
        memory_event(6, 30, 7, 30, device_type=0),  # same address on the CPU: not the GPU's block
        memory_event(8, -100, 7, 50),  # frees the GPU allocation at 7
        memory_event(10, -50, 8, 0),  # where `op` ends: in no op
        memory_event(9, -20, 99, 30),  # a free whose allocation is before the trace
    ]
    view = memory_view(synthetic(events))
    ops = {(r.device, r.name): r for r in view.ops.itertuples()}
    assert ops[("GPU0", "aten::empty")].self_alloc_bytes == 100
    assert ops[("GPU0", "aten::mm")].self_alloc_bytes == 50
    assert ops[("GPU0", "aten::mm")].alloc_bytes == 150
    assert ops[("GPU0", "aten::mm")].increase_bytes == 30
    pairs = {(r.device, r.bytes): (r.alloc_ts, r.release_ts, r.duration) for r in view.events.itertuples()}
    assert pairs[("GPU0", 100)] == (2, 8, 6)
    assert pairs[("GPU0", 50)] == (5, 10, 5)
    assert math.isnan(pairs[("CPU", 30)][1]) and math.isnan(pairs[("CPU", 30)][2])
    assert math.isnan(pairs[("GPU0", 20)][0]) and pairs[("GPU0", 20)][1] == 9 and math.isnan(pairs[("GPU0", 20)][2])
    assert ops[("GPU0", "aten::mm")].self_increase_bytes == -70  # the free is the op's: the plugin counts frees too
    assert view.peaks.set_index("device").loc["GPU0", "peak_allocated"] == 150


def test_tables_are_capped_and_keep_the_count():
    events = [memory_event(i, 10 + i, 1000 + i, 10 + i) for i in range(30)]
    view = memory_view(synthetic(events), max_rows=5)
    assert len(view.events) == 5 and view.event_count == 30
    assert view.events["bytes"].tolist() == [39, 38, 37, 36, 35]
    assert view.events["op"].tolist() == [None] * 5  # in no op


def test_addresses_past_float64_s_integers_are_never_paired():
    events = [memory_event(1, 64, 2**60, 64), memory_event(2, -64, 2**60 + 1, 0), memory_event(3, 8, 16, 8)]
    view = memory_view(synthetic(events))
    assert view.events["bytes"].tolist() == [8] and view.event_count == 1
    assert view.peaks["peak_allocated"].tolist() == [64]  # the curve still has them
