"""profiling.grouping on real traces, each number checked against a plain reading of the raw JSON."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from profiling import grouping
from profiling.kernels import decode
from profiling.tables import op_table_from_trace
from profiling.trace import load_trace, parse_trace

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = [
    DATA / "gpu" / "h100_nn-mha_fp32.json.gz",  # with_stack: python_function events around the ops
    DATA / "gpu" / "h100_bert-small_sdpa-flash.json.gz",
    DATA / "sampled_training_rank0.json.gz",
]
LAUNCHES = {"cuda_runtime", "cuda_driver"}
END_SLACK = 1e-3  # µs a child may overhang its parent (structure.END_SLACK_US)


class Plain:
    """A plain reading of one trace: nesting by a stack per thread, launches to kernels by correlation id."""

    def __init__(self, path: Path) -> None:
        with gzip.open(path) as file:
            raw = json.load(file)["traceEvents"]
        self.events = [e for e in raw if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
        for i, e in enumerate(self.events):
            e["_i"], e["_end"] = i, e["ts"] + e.get("dur", 0)
        self.parent: dict[int, int] = {}
        lanes: dict[tuple[Any, Any], list[dict]] = defaultdict(list)
        for e in self.events:
            if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
                lanes[(e.get("pid"), e.get("tid"))].append(e)
        for lane in lanes.values():
            stack: list[dict] = []
            for e in sorted(lane, key=lambda e: (e["ts"], -e.get("dur", 0), e["_i"])):
                # torch's rule (`_populate_cpu_children`): a child starts before its parent ends.
                while stack and not (e["ts"] < stack[-1]["_end"] and e["_end"] <= stack[-1]["_end"] + END_SLACK):
                    stack.pop()
                if stack:
                    self.parent[e["_i"]] = stack[-1]["_i"]
                stack.append(e)
        self.kernels = [e for e in self.events if e.get("cat") == "kernel"]
        # Device µs (kernels, memcpys, memsets) per launch (the first of each correlation id), and its owner.
        kernel_us: dict[Any, float] = defaultdict(float)
        for k in self.events:
            if k.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                kernel_us[k["args"].get("correlation")] += k["dur"]
        self.owner_of_correlation: dict[Any, int] = {}
        for e in self.events:
            corr = e.get("args", {}).get("correlation")
            if e.get("cat") in LAUNCHES and corr is not None and corr not in self.owner_of_correlation:
                self.owner_of_correlation[corr] = self.parent.get(e["_i"], -1)
        self.gpu_us = {c: kernel_us[c] for c in self.owner_of_correlation}

    def ops(self) -> list[dict]:
        """Per cpu_op call as torch counts them: same-name only children merged into their parent."""
        children: dict[int, list[int]] = defaultdict(list)
        for child, parent in self.parent.items():
            children[parent].append(child)
        self_dev: dict[int, float] = defaultdict(float)
        for corr, owner in self.owner_of_correlation.items():
            self_dev[owner] += self._all_gpu_us(corr)
        by_row = {e["_i"]: e for e in self.events}

        def top(i: int) -> int:
            p = self.parent.get(i, -1)
            while p >= 0 and by_row[p]["name"] == by_row[i]["name"] and len(children[p]) == 1:
                i, p = p, self.parent.get(p, -1)
            return i

        def total_dev(i: int) -> float:
            return self_dev[i] + sum(total_dev(c) for c in children[i])

        rows: dict[int, dict] = {}
        for e in self.events:
            if e.get("cat") != "cpu_op":
                continue
            own = e["dur"] - sum(by_row[c]["dur"] for c in children[e["_i"]])
            row = rows.setdefault(top(e["_i"]), {"self_cpu": 0.0, "self_dev": 0.0})
            row["self_cpu"] += max(own, 0.0)
            row["self_dev"] += self_dev[e["_i"]]
        out = []
        for i, row in rows.items():
            e = by_row[i]
            stack, p = [], self.parent.get(i, -1)
            while p >= 0:
                if by_row[p].get("cat") == "python_function":
                    stack.append(by_row[p]["name"])
                p = self.parent.get(p, -1)
            dims = e.get("args", {}).get("Input Dims")
            out.append(
                {
                    "name": e["name"],
                    "input dims": str(dims) if isinstance(dims, list) else "",
                    "call stack": _stack(stack),
                    "calls": 1,
                    "self cpu (us)": row["self_cpu"],
                    "total cpu (us)": e["dur"],
                    "self device (us)": row["self_dev"],
                    "total device (us)": total_dev(i),
                }
            )
        return out

    def _all_gpu_us(self, corr: Any) -> float:
        return self.gpu_us.get(corr, 0.0)

    def launching_op(self, kernel: dict) -> str:
        owner = self.owner_of_correlation.get(kernel["args"].get("correlation"), -1)
        return self.events[owner]["name"] if owner >= 0 else ""


def _stack(frames: list[str]) -> str:
    more = [grouping.STACK_MORE] if len(frames) > grouping.MAX_STACK_FRAMES else []
    kept = [*frames[: grouping.MAX_STACK_FRAMES], *more]
    return grouping.STACK_SEPARATOR.join(kept)


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name.split(".")[0])
def loaded(request: pytest.FixtureRequest) -> tuple[Any, Plain]:
    return load_trace(request.param), Plain(request.param)


def _expected(plain: Plain, key: str) -> pd.DataFrame:
    values = ["calls", "self cpu (us)", "total cpu (us)", "self device (us)", "total device (us)"]
    return pd.DataFrame(plain.ops()).groupby(["name", key])[values].sum()


def _check(got: pd.DataFrame, expected: pd.DataFrame, key: str) -> None:
    got = got.set_index(["name", key]).sort_index()
    expected = expected.sort_index()
    assert list(got.index) == list(expected.index)
    for column in expected.columns:
        np.testing.assert_allclose(got[column].to_numpy(float), expected[column].to_numpy(float), rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(got["avg cpu (us)"], got["total cpu (us)"] / got["calls"])


def test_ops_by_input_shape_match_plain_reading(loaded: tuple[Any, Plain]) -> None:
    trace, plain = loaded
    _check(grouping.ops_by_input_shape(trace), _expected(plain, "input dims"), "input dims")


def test_groups_add_up_to_the_op_table(loaded: tuple[Any, Plain]) -> None:
    """Each name's groups sum to its row of the op table (`tables.op_table_from_trace`), whichever the key."""
    trace, _ = loaded
    table = op_table_from_trace(trace).set_index("name")
    values = ["calls", "self cpu (us)", "total cpu (us)", "self device (us)", "total device (us)"]
    for grouped in (grouping.ops_by_input_shape(trace), grouping.ops_by_call_stack(trace)):
        sums = grouped.groupby("name")[values].sum().sort_index()
        np.testing.assert_allclose(sums.to_numpy(float), table.loc[sums.index, values].to_numpy(float), rtol=1e-9)


def test_ops_by_call_stack_match_plain_reading(loaded: tuple[Any, Plain]) -> None:
    trace, plain = loaded
    got = grouping.ops_by_call_stack(trace)
    _check(got, _expected(plain, "call stack"), "call stack")
    has_python = any(e.get("cat") == "python_function" for e in plain.events)
    assert got["call stack"].ne("").any() == has_python


def test_kernels_by_properties_match_plain_reading(loaded: tuple[Any, Plain]) -> None:
    trace, plain = loaded
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for k in plain.kernels:
        a = k["args"]
        key = (k["name"], plain.launching_op(k), str(a.get("grid", "")), str(a.get("block", "")))
        groups[(*key, a.get("registers per thread"), a.get("shared memory"))].append(k)
    got = grouping.kernels_by_properties(trace)
    assert len(got) == len(groups)
    assert got["calls"].sum() == len(plain.kernels)
    for row in got.itertuples(index=False):
        key = (row[0], row[1], row[2], row[3], row[4], row[5])
        mine = groups[key]
        durs = [k["dur"] for k in mine]
        assert row.calls == len(mine)
        assert row[7] == pytest.approx(sum(durs)) and row[9] == max(durs) and row[10] == min(durs)
        blocks = [k["args"].get("blocks per SM", 0) * k["dur"] for k in mine]
        occupancy = [_valid(k["args"].get("est. achieved occupancy %", 0)) * k["dur"] for k in mine]
        total = sum(durs)
        assert row[11] == pytest.approx(sum(blocks) / total if total else 0.0)
        assert row[12] == pytest.approx(sum(occupancy) / total if total else 0.0)
        assert row[13] == {"tensor": "yes", "simt": "no"}.get(decode(row[0]).engine, "unknown")
        assert row[14] == (row[1] in grouping.TC_ELIGIBLE_OPS)


def test_tensor_core_ops_match_plain_reading(loaded: tuple[Any, Plain]) -> None:
    trace, plain = loaded
    total: dict[str, float] = defaultdict(float)
    tensor: dict[str, float] = defaultdict(float)
    for k in plain.kernels:
        owner = plain.owner_of_correlation.get(k["args"].get("correlation"), -1)
        if owner >= 0 and plain.events[owner].get("cat") == "cpu_op":
            name = plain.events[owner]["name"]
            total[name] += k["dur"]
            tensor[name] += k["dur"] if decode(k["name"]).engine == "tensor" else 0.0
    got = grouping.tensor_core_ops(trace).set_index("name")
    op_names = {e["name"] for e in plain.events if e.get("cat") == "cpu_op"}
    assert set(got.index) == op_names
    for name in op_names:
        assert got.loc[name, "self kernel (us)"] == pytest.approx(total.get(name, 0.0))
        assert got.loc[name, "tc self kernel (us)"] == pytest.approx(tensor.get(name, 0.0))
        expected = 100 * tensor[name] / total[name] if total.get(name) else None
        assert got.loc[name, "tc self %"] == (None if expected is None else pytest.approx(expected))
        assert got.loc[name, "tc eligible"] == (name in grouping.TC_ELIGIBLE_OPS)


def test_mha_fp32_gemms_are_eligible_and_on_tensor_cores() -> None:
    """The README: TF32 tensor-core GEMMs from addmm/mm/bmm; their ops are on the plugin's allow-list."""
    got = grouping.tensor_core_ops(load_trace(TRACES[0])).set_index("name")
    for name in ("aten::addmm", "aten::mm", "aten::bmm"):
        assert got.loc[name, "tc eligible"] and got.loc[name, "tc self %"] == pytest.approx(100.0)
    assert not got.loc["aten::add", "tc eligible"]


def _valid(occupancy: float) -> float:
    """The plugin leaves out an occupancy outside 0..100 (counted as 0 in the weighted mean)."""
    return occupancy if 0 <= occupancy <= 100 else 0.0


def _synthetic(events: list[dict]) -> Any:
    return parse_trace(json.dumps({"traceEvents": events}).encode())


def test_call_stack_innermost_first_and_bounded() -> None:
    depth = grouping.MAX_STACK_FRAMES + 4
    frames = [
        {"name": f"f{i}", "cat": "python_function", "ph": "X", "ts": i, "dur": 1000 - 2 * i, "pid": 1, "tid": 1}
        for i in range(depth)
    ]
    op = {"name": "aten::mm", "cat": "cpu_op", "ph": "X", "ts": 100, "dur": 10, "pid": 1, "tid": 1}
    other = {**op, "tid": 2}  # another thread: no stack encloses it
    got = grouping.ops_by_call_stack(_synthetic([*frames, op, other])).set_index("call stack")
    inner = [f"f{i}" for i in range(depth - 1, depth - 1 - grouping.MAX_STACK_FRAMES, -1)]
    assert set(got.index) == {grouping.STACK_SEPARATOR.join([*inner, grouping.STACK_MORE]), ""}
    assert (got["calls"] == 1).all()


def test_stacks_that_differ_only_past_the_kept_frames_are_one_group() -> None:
    """Two ops under MAX_STACK_FRAMES + 1 frames that differ only in the outermost, dropped, frame read as one
    stack ("… <- more"), so they are one group, as their text says."""
    depth = grouping.MAX_STACK_FRAMES + 1
    events = []
    for tid, outer in ((1, "outer_a"), (2, "outer_b")):
        names = [outer, *(f"f{i}" for i in range(1, depth))]
        events += [
            {"name": n, "cat": "python_function", "ph": "X", "ts": i, "dur": 1000 - 2 * i, "pid": 1, "tid": tid}
            for i, n in enumerate(names)
        ]
        events.append({"name": "aten::mm", "cat": "cpu_op", "ph": "X", "ts": 100, "dur": 10, "pid": 1, "tid": tid})
    got = grouping.ops_by_call_stack(_synthetic(events))
    assert len(got) == 1 and got["calls"].tolist() == [2] and got["call stack"][0].endswith(grouping.STACK_MORE)


def test_the_first_groups_alone_get_texts_and_all_are_counted(loaded: tuple[Any, Plain]) -> None:
    trace, _ = loaded
    every = grouping.ops_by_call_stack(trace)
    first = grouping.ops_by_call_stack(trace, top=3)
    assert len(every) > 3 and first.attrs["groups"] == every.attrs["groups"] == len(every)
    pd.testing.assert_frame_equal(first, every.head(3))
    assert first.attrs["stacks"] == bool(every["call stack"].astype(bool).any())


def test_no_ops_or_kernels_keep_the_schema() -> None:
    trace = _synthetic([{"name": "x", "cat": "user_annotation", "ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 1}])
    assert list(grouping.ops_by_input_shape(trace).columns) == grouping.SHAPE_COLUMNS
    assert list(grouping.ops_by_call_stack(trace).columns) == grouping.STACK_COLUMNS
    assert list(grouping.kernels_by_properties(trace).columns) == grouping.KERNEL_GROUP_COLUMNS
    assert list(grouping.tensor_core_ops(trace).columns) == grouping.TC_COLUMNS
