"""Profiler steps and their breakdown, against the TensorBoard plugin's recorded output and a plain loop.

The plain-loop reference here reads the raw JSON and follows the plugin's own algorithms
(event_parser.py `_find_device_steps`/`_update_steps_duration`, overall_parser.py
`create_from_range`) with lists and for loops; the code under test is vectorised numpy.
The other metric tests import `raw_events` and `plain_steps` from here.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from profiling.step_breakdown import adjusted_steps, step_breakdown, steps_span
from profiling.trace import load_trace, parse_trace
from tests.conftest import DATA

RESNET = DATA / "tb_plugin" / "resnet50_num_workers_4.pt.trace.json.gz"
EXPECTED = DATA / "tb_plugin" / "resnet50_num_workers_4.expected.jsonl"
NEW_FORMAT = ("sampled_training_rank0", "triton_driver_launch", "cpu_only", "a100_simple_add")
# 2021 spellings, so this reference does not depend on the reader's own normalisation.
OLD_CATEGORIES = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Runtime": "cuda_runtime"}
OLD_CATEGORIES |= {"Driver": "cuda_driver", "Operator": "cpu_op", "User_annotation": "user_annotation"}
LAUNCH = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")
GPU = ("kernel", "gpu_memcpy", "gpu_memset")
ROLE_ORDER = ["kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec"]


def raw_events(path: Path) -> list[dict]:
    """Complete events of a trace file as plain dicts, categories in today's spelling."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        document = json.load(f)
    events = document["traceEvents"] if isinstance(document, dict) else document
    out = []
    for e in events:
        if (
            e.get("ph") != "X"
            or not isinstance(e.get("ts"), (int, float))
            or not isinstance(e.get("dur"), (int, float))
        ):
            continue
        e = dict(e, cat=OLD_CATEGORIES.get(e.get("cat", ""), e.get("cat", "")), args=e.get("args") or {})
        out.append(e)
    return out


def is_step(e: dict) -> bool:
    return (
        e["cat"] in ("user_annotation", "cpu_op") and re.fullmatch(r"ProfilerStep#[0-9]{1,18}", e["name"]) is not None
    )


def is_python_2021(e: dict) -> bool:
    """torch 1.8-1.9's `Python` category: the plugin's PYTHON type (its lookup ignores case), CPU work;
    today's `python_function` is not."""
    return e["cat"].lower() == "python"


def fallback_host_span(events: list[dict]) -> list[list]:
    """event_parser.py StepParser.parse_steps without a ProfilerStep: one step "0" from the first start to
    the last end of the OPERATOR (`cpu_op`, 2021 `Operator`) and PYTHON events; none without any."""
    host = [e for e in events if e["cat"] == "cpu_op" or is_python_2021(e)]
    if not host:
        return []
    return [["0", min(e["ts"] for e in host), max(e["ts"] + e["dur"] for e in host)]]


def plain_steps(events: list[dict]) -> list[tuple[str, float, float]]:
    """The plugin's steps, by its two-pointer merge of launches and steps, in plain Python."""
    seen, steps = set(), []
    for e in sorted((e for e in events if is_step(e)), key=lambda e: e["ts"]):
        if (e["name"], e["ts"], e["dur"]) not in seen:  # a step recorded twice: the same name and span
            seen.add((e["name"], e["ts"], e["dur"]))
            steps.append([e["name"], e["ts"], e["ts"] + e["dur"]])
    steps = steps or fallback_host_span(events)
    if not steps:
        return []
    device_of = {}
    for e in events:
        if e["cat"] in GPU:
            device_of.setdefault(e["args"].get("correlation"), []).append(e)
    launches, seen_corr = [], set()
    for e in events:
        corr = e["args"].get("correlation")
        if e["cat"] in LAUNCH and corr is not None and corr not in seen_corr:
            seen_corr.add(corr)
            launches.append(e)
    launches.sort(key=lambda e: e["ts"])
    first, last, count, matched = {}, {}, [0] * len(steps), set()
    i_step = i_rt = 0
    while i_step < len(steps) and i_rt < len(launches):
        rt, (_, s, t) = launches[i_rt], steps[i_step]
        if rt["ts"] < s:
            i_rt += 1
        elif rt["ts"] + rt["dur"] <= t:
            for d in device_of.get(rt["args"]["correlation"], []):
                first[i_step] = min(first.get(i_step, d["ts"]), d["ts"])
                last[i_step] = max(last.get(i_step, d["ts"] + d["dur"]), d["ts"] + d["dur"])
                matched.add(id(d))
                count[i_step] += 1
            i_rt += 1
        elif rt["ts"] < t:
            i_rt += 1
        else:
            i_step += 1
    if not matched:
        return [tuple(s) for s in steps]
    prev = steps[0][1]
    if 0 in first:
        for e in events:
            if e["cat"] in GPU and id(e) not in matched and e["ts"] + e["dur"] < first[0]:
                prev = max(prev, e["ts"] + e["dur"])
    for i, step in enumerate(steps):
        step[1] = max(prev, step[1])
        step[2] = max(step[2], last[i]) if i in last else max(step[2], step[1])
        step[2] = max(step[2], step[1])
        prev = step[2]
    keep = len(steps)
    if len(steps) > 1:
        i = len(steps) - 1
        while i >= 0 and count[i] == 0:
            i -= 1
        if i >= 0:
            keep = i if i > 0 and count[i - 1] * 0.8 > count[i] else i + 1
    return [tuple(s) for s in steps[:keep]]


def external_id(e: dict) -> object:
    return e["args"].get("External id", e["args"].get("external id"))


def role_of(e: dict, nccl_ids: set) -> str | None:
    cat, name = e["cat"], e["name"]
    if cat == "kernel":
        return "communication" if "nccl" in name.lower() or external_id(e) in nccl_ids else "kernel"
    if cat in ("gpu_memcpy", "gpu_memset"):
        return cat[4:]
    if cat in LAUNCH:
        return "runtime"
    python = is_python_2021(e)
    if (cat not in ("cpu_op", "user_annotation") and not python) or is_step(e):
        return None
    loader = (name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__")) or name.startswith(
        "enumerate(DataPipe)#"
    )
    if loader and not python:
        return "dataloader"
    if re.match(r"(nccl|gloo):(broadcast|reduce|all_reduce|all_gather|reduce_scatter)$", name):
        return "communication"
    return "cpu_exec"


def plain_breakdown(events: list[dict], steps: list[tuple[str, float, float]]) -> list[dict[str, float]]:
    """Per step, time of each role, each instant going to the highest-priority active role (a sweep)."""
    comm_ops = {external_id(e) for e in events if role_of(e, set()) == "communication"}
    comm_ops.discard(None)
    points = []
    for e in events:
        role = role_of(e, comm_ops)
        if role is not None and e["dur"] > 0:
            points += [(e["ts"], 1, role), (e["ts"] + e["dur"], -1, role)]
    points.sort(key=lambda p: p[0])
    active = dict.fromkeys(ROLE_ORDER, 0)
    costs = [dict.fromkeys(ROLE_ORDER, 0.0) for _ in steps]
    for (t, delta, role), nxt in zip(points, [*points[1:], (points[-1][0], 0, None)], strict=True):
        active[role] += delta
        top = next((r for r in ROLE_ORDER if active[r] > 0), None)
        if top is None or nxt[0] <= t:
            continue
        for i, (_, s, u) in enumerate(steps):
            costs[i][top] += max(0.0, min(u, nxt[0]) - max(s, t))
    for cost, (_, s, u) in zip(costs, steps, strict=True):
        cost["other"] = (u - s) - sum(cost.values())
    return costs


def expected_overview() -> dict:
    return json.loads(EXPECTED.read_text().splitlines()[0])


def test_resnet50_steps_match_the_plugins_recorded_overview():
    """Six steps, their times and breakdowns, and the average: the plugin's numbers, to the µs it showed."""
    result = step_breakdown(load_trace(RESNET))
    overview = expected_overview()
    rows = [[x for x in row if not isinstance(x, str) or not x.startswith("<")] for row in overview["steps"]["rows"]]
    assert [r[0] for r in rows] == [name.split("#")[1] for name in result.per_step["step"]]
    columns = ["kernel", "memcpy", "memset", "runtime", "dataloader", "cpu_exec", "other"]
    for row, (_, ours) in zip(rows, result.per_step.iterrows(), strict=True):
        assert [round(ours[f"{c} (us)"]) for c in columns] == row[1:]
    average = overview["performance"][0]
    assert round(result.average_step_time_us) == average["value"]
    shown = {c["name"]: c["value"] for c in average["children"]}
    labels = dict(
        zip(columns, ["Kernel", "Memcpy", "Memset", "Runtime", "DataLoader", "CPU Exec", "Other"], strict=True)
    )
    assert {c: round(result.breakdown_us[c]) for c in columns} == {c: shown[labels[c]] for c in columns}
    assert "communication" not in result.breakdown_us  # no NCCL in this trace


def test_backward_kernels_count_for_the_step_that_launched_them_from_another_thread():
    """The autograd thread launches the backward pass; its kernels belong to the step all the same."""
    events = raw_events(RESNET)
    threads = {e["tid"] for e in events if e["cat"] == "cuda_runtime" and e["name"] == "cudaLaunchKernel"}
    assert len(threads) == 2  # main thread and autograd thread
    per_step = step_breakdown(load_trace(RESNET)).per_step
    assert per_step["kernel (us)"].min() > 98_000  # not the ~34k µs of the main thread's launches alone


@pytest.mark.parametrize("name", ["resnet", *NEW_FORMAT])
def test_steps_and_breakdown_match_a_plain_loop(name):
    path = RESNET if name == "resnet" else DATA / f"{name}.json.gz"
    events = raw_events(path)
    trace = load_trace(path)
    expected = plain_steps(events)
    ours = adjusted_steps(trace)
    assert list(ours["step"]) == [s[0] for s in expected]
    assert list(ours["start"]) == pytest.approx([s[1] for s in expected], abs=1e-3)
    assert list(ours["end"]) == pytest.approx([s[2] for s in expected], abs=1e-3)
    result = step_breakdown(trace)
    if not expected:
        assert result.average_step_time_us is None and result.breakdown_us == {}
        return
    costs = plain_breakdown(events, expected)
    for role in result.breakdown_us:
        assert list(result.per_step[f"{role} (us)"]) == pytest.approx([c[role] for c in costs], abs=1e-3), role
    assert result.average_step_time_us == pytest.approx(sum(s[2] - s[1] for s in expected) / len(expected))


def test_triton_driver_launch_extends_the_step_to_its_kernel():
    """cuLaunchKernel (cuda_driver) is a launch: the step holds its kernel even though the plugin predates it."""
    steps = adjusted_steps(load_trace(DATA / "triton_driver_launch.json.gz"))
    assert list(steps["gpu_activities"]) == [1]


def test_without_steps_the_span_is_the_plugins_step_zero():
    """No ProfilerStep: the plugin's step "0" from the first op's start to the last op's end, extended to
    the end of the GPU work the ops launched (event_parser.py parse_steps, _update_steps_duration)."""
    path = DATA / "a100_simple_add.json.gz"
    events = raw_events(path)
    assert not any(is_step(e) for e in events)
    ops = [e for e in events if e["cat"] == "cpu_op"]
    first, last = min(e["ts"] for e in ops), max(e["ts"] + e["dur"] for e in ops)
    launched = {
        e["args"]["correlation"]
        for e in events
        if e["cat"] in LAUNCH and first <= e["ts"] <= e["ts"] + e["dur"] <= last
    }
    gpu_end = max(e["ts"] + e["dur"] for e in events if e["cat"] in GPU and e["args"].get("correlation") in launched)
    span = steps_span(load_trace(path))
    assert span == (first, max(last, gpu_end))
    whole = (min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events))
    assert span != whole  # the trace holds more than its ops' span: the test tells the two rules apart


def test_without_steps_or_host_ops_the_span_is_the_whole_trace():
    """No host op either: the plugin's step would run from +inf to -inf; the span stays the whole trace."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 10, "dur": 5, "pid": 0, "tid": 7, "args": {"stream": 7}},
        {"ph": "X", "cat": "user_annotation", "name": "a", "ts": 2, "dur": 30, "pid": 1, "tid": 1},
    ]
    trace = parse_trace(json.dumps(events).encode())
    assert steps_span(trace) == (2, 32) and step_breakdown(trace).average_step_time_us is None


def test_trailing_partial_step_is_dropped():
    """A last step that launched under 80% of the previous step's GPU work is cut, as the plugin cuts it."""
    events = []
    for i, n_kernels in enumerate([10, 10, 7]):
        t0 = i * 1000
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": t0, "dur": 900, "pid": 1, "tid": 1}
        )
        for k in range(n_kernels):
            corr = i * 100 + k
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "ts": t0 + 10 * k + 1,
                    "dur": 5,
                    "pid": 1,
                    "tid": 2,
                    "args": {"correlation": corr},
                }
            )
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "k",
                    "ts": t0 + 50 * k + 20,
                    "dur": 30,
                    "pid": 0,
                    "tid": 7,
                    "args": {"correlation": corr, "device": 0, "stream": 7},
                }
            )
    from profiling.trace import parse_trace

    steps = adjusted_steps(parse_trace(json.dumps(events).encode()))
    assert list(steps["step"]) == ["ProfilerStep#0", "ProfilerStep#1"]
    assert list(steps["gpu_activities"]) == [10, 10]


def test_overlapping_kernels_on_one_stream_break_down_like_a_plain_loop():
    """Kernels that overlap on one stream count once in `kernel`; nothing in a step's breakdown goes negative."""
    from profiling.trace import parse_trace

    events = []
    for i in range(3):
        t0 = 1000.0 * i
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": t0, "dur": 800, "pid": 1, "tid": 1}
        )
        for k, (start, dur) in enumerate([(20, 500), (60, 50), (100, 480), (700, 30)]):  # the middle two overlap
            corr = 10 * i + k
            events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 2 + k, "dur": 1}
                | {"pid": 1, "tid": 1, "args": {"correlation": corr}}
            )
            events.append(
                {"ph": "X", "cat": "kernel", "name": "k", "ts": t0 + start, "dur": dur, "pid": 0, "tid": 7}
                | {"args": {"correlation": corr, "stream": 7, "device": 0}}
            )
    for e in events:
        e.setdefault("args", {})
    result = step_breakdown(parse_trace(json.dumps(events).encode()))
    expected = plain_steps(events)
    costs = plain_breakdown(events, expected)
    assert len(result.per_step) == len(expected) == 3
    for role in result.breakdown_us:
        assert list(result.per_step[f"{role} (us)"]) == pytest.approx([c[role] for c in costs], abs=1e-3), role
    numbers = result.per_step.drop(columns=["position", "step"])
    assert (numbers.to_numpy() >= 0).all()
    assert list(result.per_step["kernel (us)"]) == pytest.approx([560 + 30] * 3)  # [20, 580) and [700, 730)


@pytest.mark.parametrize(("name", "cpu_exec"), [("kineto_2021", 15 + 10), ("kineto_2024", 10 + 10)])
def test_2021_python_events_are_cpu_work(name, cpu_exec):
    """2021's `Python` is the plugin's PYTHON type, CPU work; today's `python_function` is not. In
    ProfilerStep#5 [100, 300], `nn.Module: Linear_0` [105, 165] holds aten::mm [110, 160], less a launch
    [120, 130] and the kernel [140, 170]: the plugin's CpuOp is 25 on the 2021 file, 20 on today's."""
    path = DATA / "vintages" / f"{name}.json"
    events = raw_events(path)
    result = step_breakdown(load_trace(path))
    assert list(result.per_step["cpu_exec (us)"]) == [cpu_exec]
    assert [c["cpu_exec"] for c in plain_breakdown(events, plain_steps(events))] == [cpu_exec]
