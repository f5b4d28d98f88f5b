"""Which op made each launch: the plugin's External-id rule on 2021 traces, torch's nesting on today's.

References are plain loops over the raw JSON: for 2021 traces, the first op by start with the
launch's `external id` (event_parser.py, `NodeParserMixin.parse_nodes`); for today's, the innermost
event around the launch on its thread (torch's `EventList._populate_cpu_children`).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from profiling.launches import launch_owners
from profiling.trace import load_trace, parse_trace
from tests.conftest import DATA

RESNET = next(
    p / "resnet50_num_workers_4.pt.trace.json.gz"
    for p in (DATA / "tb_plugin", Path("/work/shared/traces/tb_plugin"))
    if (p / "resnet50_num_workers_4.pt.trace.json.gz").exists()
)
LAUNCHES = ("Runtime", "cuda_runtime", "cuda_driver")


def _complete(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    document = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    events = document["traceEvents"] if isinstance(document, dict) else document
    return [e for e in events if e.get("ph") == "X"]


def _external_id(e: dict[str, Any]) -> Any:
    args = e.get("args", {})
    return args.get("external id", args.get("External id"))


def _ours(path: Path) -> list[tuple[str, float] | None]:
    """(name, start) of the owner of each launch, in file order."""
    trace = load_trace(path)
    ev, owner = trace.events, launch_owners(trace)
    launches = np.flatnonzero(ev["cat"].isin(("cuda_runtime", "cuda_driver")).to_numpy())
    names, ts = ev["name"].to_numpy(), ev["ts"].to_numpy()
    return [(names[owner[r]], ts[owner[r]]) if owner[r] >= 0 else None for r in launches]


def _by_external_id(path: Path) -> list[tuple[str, float] | None]:
    events = _complete(path)
    first: dict[Any, dict[str, Any]] = {}
    for e in sorted((e for e in events if e.get("cat") in ("Operator", "cpu_op", "Python")), key=lambda e: e["ts"]):
        first.setdefault(_external_id(e), e)
    owners = []
    for e in events:
        if e.get("cat") in LAUNCHES:
            op = first.get(_external_id(e)) if _external_id(e) not in (0, None) else None
            owners.append((op["name"], float(op["ts"])) if op else None)
    return owners


def _end(e: dict[str, Any]) -> float:
    return e["ts"] + e["dur"]


def _by_nesting(path: Path) -> list[tuple[str, float] | None]:
    events = _complete(path)
    lanes: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        lanes[(str(e["pid"]), str(e["tid"]))].append(e)
    parent: dict[int, dict[str, Any] | None] = {}
    for lane in lanes.values():
        stack: list[dict[str, Any]] = []
        for e in sorted(lane, key=lambda e: (e["ts"], -(e["ts"] + e["dur"]))):
            end = e["ts"] + e["dur"]
            while stack and (
                e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] or end > stack[-1]["ts"] + stack[-1]["dur"] + 1e-3
            ):
                stack.pop()
            parent[id(e)] = stack[-1] if stack else None
            stack.append(e)
    owners = []
    for e in events:
        if e.get("cat") in LAUNCHES:
            p = parent[id(e)]
            owners.append((p["name"], float(p["ts"])) if p else None)
    return owners


def test_the_plugins_external_id_case():
    # test_external_id: 0 µs launches at the instants aten::mm starts and ends, each carrying its op's id.
    path = DATA / "plugin_cases" / "external_id.json"
    owners = _ours(path)
    assert owners == _by_external_id(path)
    assert [name for name, _ in owners] == ["aten::mm", "aten::mat_mul", "aten::mm", "aten::mat_mul"]
    assert owners != _by_nesting(path)  # time alone gets these wrong


def test_a_real_2021_trace_by_external_id():
    assert _ours(RESNET) == _by_external_id(RESNET)


@pytest.mark.parametrize("name", ["a100_simple_add", "sampled_training_rank0", "triton_driver_launch"])
def test_todays_traces_by_nesting(name):
    # Their External id is the launch's correlation id: it names no op.
    path = DATA / f"{name}.json.gz"
    owners = _ours(path)
    assert owners == _by_nesting(path) and any(owners)


def _x(cat: str, name: str, tid: int, ts: float, dur: float, **args: int) -> dict[str, Any]:
    args = {k.replace("_", " "): v for k, v in args.items()}
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_id_0_and_unknown_ids_go_to_no_op_and_other_events_have_no_owner():
    events = [
        _x("Operator", "aten::mm", 1, 0, 100, External_id=0),
        _x("Runtime", "cudaLaunchKernel", 1, 10, 5, external_id=0, correlation=1),
        _x("Runtime", "cudaLaunchKernel", 1, 20, 5, external_id=9, correlation=2),
        _x("Kernel", "k", 7, 30, 5, external_id=0, correlation=1),
    ]
    trace = parse_trace(json.dumps(events).encode())
    assert trace.kineto_2021
    assert launch_owners(trace).tolist() == [-1, -1, -1, -1]
    assert launch_owners(trace) is launch_owners(trace)  # computed once per trace


def test_the_first_thread_to_run_an_op_with_the_id_wins():
    # parse_nodes walks threads in order of their first op, each by start; the first op with the id
    # takes every runtime carrying it, on any thread.
    events = [
        _x("Operator", "late_thread_op", 2, 50, 10, External_id=5),
        _x("Operator", "early_thread_op", 1, 40, 10, External_id=7),
        _x("Operator", "same_id_later", 1, 60, 10, External_id=5),
        _x("Runtime", "cudaLaunchKernel", 3, 90, 1, external_id=5, correlation=1),
    ]
    trace = parse_trace(json.dumps(events).encode())
    assert trace.events["name"][launch_owners(trace)[3]] == "same_id_later"


def test_a_runtime_may_belong_to_the_step_or_a_2021_python_event():
    # test_runtime_called_by_profilerstep: the step's own id; and a `Python` node's, as parse_nodes
    # attaches runtimes to PYTHON nodes too.
    assert [name for name, _ in _ours(DATA / "plugin_cases" / "runtime_called_by_profilerstep.json")] == [
        "ProfilerStep#1"
    ]
    events = [
        _x("Python", "train_step", 1, 0, 100, External_id=3),
        _x("Runtime", "cudaLaunchKernel", 1, 10, 5, external_id=3, correlation=1),
    ]
    trace = parse_trace(json.dumps(events).encode())
    assert launch_owners(trace).tolist() == [-1, 0]


def test_only_duration_events_own_launches_by_external_id():
    # parse_nodes builds its nodes from duration ("X") events: an instant op carrying the same id, on a thread
    # that ran first, owns nothing.
    instant = {"ph": "i", "s": "t", "cat": "Operator", "name": "instant_op", "pid": 1, "tid": 1, "ts": 0}
    events = [
        instant | {"args": {"External id": 5}},
        _x("Operator", "the_op", 2, 10, 50, External_id=5),
        _x("Runtime", "cudaLaunchKernel", 2, 20, 1, external_id=5, correlation=1),
    ]
    trace = parse_trace(json.dumps(events).encode())
    assert trace.kineto_2021
    assert trace.events["name"].tolist() == ["instant_op", "the_op", "cudaLaunchKernel"]
    assert launch_owners(trace).tolist() == [-1, -1, 1]
