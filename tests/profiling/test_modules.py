"""The Module view against a plain reading of the raw events (issue 22, item 2).

The reference walks `Python parent id` chains in a dict and finds each module's GPU work by time
containment of the launches on its thread: a different route from the code's (pointer doubling,
launch owners and nesting).
"""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from profiling.modules import COLUMNS, MODULE_PREFIX, module_calls, module_view
from profiling.trace import Trace, load_trace, parse_trace

DATA = Path(__file__).resolve().parents[1] / "data"
MHA = DATA / "gpu" / "h100_nn-mha_fp32.json.gz"
SEQ = DATA / "cpu_modules" / "seq_linear_with_stack.json.gz"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}


def raw_events(path: Path) -> list[dict[str, Any]]:
    return json.load(gzip.open(path))["traceEvents"]


def reference(events: list[dict[str, Any]]) -> dict[tuple[str, ...], dict[str, float]]:
    """Per module path: calls, host total/self and device total/self, by plain loops."""
    python = [e for e in events if e.get("cat") == "python_function" and e.get("ph") == "X"]
    by_id = {e["args"]["Python id"]: e for e in python}
    modules = [e for e in python if e["name"].startswith(MODULE_PREFIX)]

    def parent_module(e: dict[str, Any]) -> dict[str, Any] | None:
        up = by_id.get(e["args"].get("Python parent id"))
        while up is not None and not up["name"].startswith(MODULE_PREFIX):
            up = by_id.get(up["args"].get("Python parent id"))
        return up

    def path(e: dict[str, Any]) -> tuple[str, ...]:
        up = parent_module(e)
        return (*(path(up) if up else ()), e["name"].removeprefix(MODULE_PREFIX))

    gpu_time: dict[Any, float] = defaultdict(float)
    for e in events:
        if e.get("cat") in GPU_CATS and e.get("ph") == "X":
            gpu_time[e["args"]["correlation"]] += e["dur"]
    launches, seen = [], set()
    for e in events:
        if e.get("cat") in LAUNCH_CATS and e.get("ph") == "X" and e["args"]["correlation"] not in seen:
            seen.add(e["args"]["correlation"])
            launches.append(e)

    def device(m: dict[str, Any]) -> float:
        end = m["ts"] + m["dur"]
        return sum(
            gpu_time[e["args"]["correlation"]]
            for e in launches
            if (e["pid"], e["tid"]) == (m["pid"], m["tid"]) and m["ts"] <= e["ts"] and e["ts"] + e["dur"] <= end
        )

    child_host: dict[int, float] = defaultdict(float)
    child_device: dict[int, float] = defaultdict(float)
    for m in modules:
        up = parent_module(m)
        if up is not None:
            child_host[id(up)] += m["dur"]
            child_device[id(up)] += device(m)
    out: dict[tuple[str, ...], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for m in modules:
        row = out[path(m)]
        row["calls"] += 1
        row["host total (us)"] += m["dur"]
        row["host self (us)"] += m["dur"] - child_host[id(m)]
        row["device total (us)"] += device(m)
        row["device self (us)"] += device(m) - child_device[id(m)]
    return out


@pytest.fixture(scope="module")
def mha() -> Trace:
    return load_trace(MHA)


@pytest.fixture(scope="module")
def seq() -> Trace:
    return load_trace(SEQ)


def check_against_reference(trace: Trace, path: Path, has_gpu: bool) -> None:
    table = module_view(trace).table
    expected = reference(raw_events(path))
    assert len(table) == len(expected)
    for _, row in table.iterrows():
        want = expected[tuple(row["path"].split(" > "))]
        assert row["calls"] == want["calls"]
        assert row["depth"] == len(row["path"].split(" > ")) - 1
        for key in ("host total (us)", "host self (us)"):
            assert row[key] == pytest.approx(want[key], rel=1e-9, abs=1e-6), (row["path"], key)
        for key in ("device total (us)", "device self (us)"):
            if has_gpu:
                assert row[key] == pytest.approx(want[key], rel=1e-9, abs=1e-6), (row["path"], key)
            else:
                assert math.isnan(row[key])


def test_mha_module_events_counted(mha: Trace) -> None:
    raw = [e for e in raw_events(MHA) if e.get("cat") == "python_function" and e["name"].startswith(MODULE_PREFIX)]
    assert len(raw) == 33
    view = module_view(mha)
    assert view.module_events == 33
    assert view.table["calls"].sum() == 33
    assert view.note == ""


def test_mha_matches_plain_loop(mha: Trace) -> None:
    check_against_reference(mha, MHA, has_gpu=True)
    table = module_view(mha).table
    # The GPU work inside the root module is every launch of the forward: some device time, all of it placed.
    root = table[table["depth"] == 0]
    assert len(root) == 1 and root["device total (us)"].iloc[0] > 0
    assert table["device self (us)"].sum() == pytest.approx(root["device total (us)"].iloc[0])


def test_mha_tree_order_puts_children_after_parents(mha: Trace) -> None:
    paths = module_view(mha).table["path"].tolist()
    for at, p in enumerate(paths):
        if " > " in p:
            assert p.rsplit(" > ", 1)[0] in paths[:at]


def test_cpu_trace_matches_plain_loop(seq: Trace) -> None:
    check_against_reference(seq, SEQ, has_gpu=False)
    table = module_view(seq).table
    assert table["path"].tolist() == ["Sequential_0", "Sequential_0 > Linear_0", "Sequential_0 > Linear_1"]
    assert table["calls"].tolist() == [3, 3, 3]


def test_trace_without_modules_is_empty_and_says_why() -> None:
    view = module_view(load_trace(DATA / "cpu_only.json.gz"))
    assert view.table.empty and list(view.table.columns) == COLUMNS
    assert "with_stack=True" in view.note
    events = [py(1, None, "main.py(1): <module>", 0, 10)]
    view = module_view(parse_trace(json.dumps({"traceEvents": events}).encode()))
    assert view.table.empty and "no `nn.Module:`" in view.note


def py(pid_: int, parent: int | None, name: str, ts: float, dur: float, **extra: Any) -> dict[str, Any]:
    args = {"Python id": pid_, "Python parent id": parent, **extra}
    return {"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def test_parent_found_through_plain_python_frames() -> None:
    events = [
        py(1, None, "nn.Module: Outer_0", 0, 100),
        py(2, 1, "model.py(3): forward", 1, 90),
        py(3, 2, "nn.Module: Inner_0", 2, 40),
        py(4, 2, "nn.Module: Inner_0", 50, 30),
    ]
    table = module_view(parse_trace(json.dumps({"traceEvents": events}).encode())).table
    assert table["path"].tolist() == ["Outer_0", "Outer_0 > Inner_0"]
    assert table["calls"].tolist() == [1, 2]
    assert table["host self (us)"].tolist() == [30.0, 70.0]


def test_cyclic_or_non_enclosing_parent_ids_end_as_roots() -> None:
    events = [
        py(1, 2, "nn.Module: A_0", 0, 100),  # names as parent an event it encloses: refused
        py(2, 1, "nn.Module: B_0", 10, 20),
        py(3, 9, "nn.Module: C_0", 200, 5),  # names an id that does not exist
    ]
    calls = module_calls(parse_trace(json.dumps({"traceEvents": events}).encode()))
    assert calls.parent.tolist() == [-1, 0, -1]
    assert calls.depth.tolist() == [0, 1, 0]


def test_without_python_ids_parents_come_from_nesting() -> None:
    events = [py(1, None, "nn.Module: A_0", 0, 100), py(2, None, "nn.Module: B_0", 10, 20)]
    for e in events:
        e["args"] = {}
    view = module_view(parse_trace(json.dumps({"traceEvents": events}).encode()))
    assert view.table["path"].tolist() == ["A_0", "A_0 > B_0"]
    assert "nesting" in view.note


def test_row_cap_keeps_the_longest_with_their_ancestors_and_counts_all() -> None:
    events = [py(1, None, "nn.Module: Root_0", 0, 1000)]
    events += [py(2 + i, 1, f"nn.Module: Leaf_{i}", 1 + 10 * i, 1 + i) for i in range(20)]
    view = module_view(parse_trace(json.dumps({"traceEvents": events}).encode()), max_rows=4)
    assert view.paths == 21 and len(view.table) == 4
    assert view.table["module"].tolist() == ["Root_0", "Leaf_17", "Leaf_18", "Leaf_19"]
    assert "4 of 21" in view.note


def test_device_time_goes_to_the_innermost_module_of_the_launching_op() -> None:
    def x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}

    events = [
        py(1, None, "nn.Module: Outer_0", 0, 100),
        py(2, 1, "nn.Module: Inner_0", 10, 40),
        x("cpu_op", "aten::mm", 12, 20),
        x("cuda_runtime", "cudaLaunchKernel", 14, 2, correlation=7),
        x("cpu_op", "aten::add", 60, 20),
        x("cuda_runtime", "cudaLaunchKernel", 62, 2, correlation=8),
        {**x("kernel", "gemm", 20, 30, correlation=7, stream=7, device=0), "pid": 0, "tid": 7},
        {**x("kernel", "add", 70, 5, correlation=8, stream=7, device=0), "pid": 0, "tid": 7},
    ]
    table = module_view(parse_trace(json.dumps({"traceEvents": events}).encode())).table
    assert table["device total (us)"].tolist() == [35.0, 30.0]
    assert table["device self (us)"].tolist() == [5.0, 30.0]
    assert np.isfinite(table["device self (us)"]).all()


def test_a_cycle_of_ids_on_identical_intervals_is_cut() -> None:
    events = [py(1, 2, "nn.Module: A_0", 0, 50), py(2, 1, "nn.Module: B_0", 0, 50)]
    calls = module_calls(parse_trace(json.dumps({"traceEvents": events}).encode()))
    assert sorted(calls.parent.tolist()) == [-1, 0]
    assert sorted(calls.depth.tolist()) == [0, 1]


def test_launches_sharing_a_correlation_id_count_their_work_once() -> None:
    def x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}

    events = [
        py(1, None, "nn.Module: A_0", 0, 40),
        x("cuda_runtime", "cudaLaunchKernel", 5, 2, correlation=7),
        py(2, None, "nn.Module: B_0", 50, 40),
        x("cuda_runtime", "cudaLaunchKernel", 55, 2, correlation=7),
        {**x("kernel", "gemm", 20, 30, correlation=7, stream=7, device=0), "pid": 0, "tid": 7},
    ]
    table = module_view(parse_trace(json.dumps({"traceEvents": events}).encode())).table
    assert dict(zip(table["module"], table["device total (us)"], strict=True)) == {"A_0": 30.0, "B_0": 0.0}
