"""Crafted args are data: each value a red team put in a real trace, through the reader, every rule and the CLI.

Every case edits one real trace (tests/data) and must give a result, never an exception or a
traceback; the bad value must not reach a number. What each case expects is computed here by a
plain loop over the crafted JSON, not by the code under test.
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from profiling.analysis import Analysis, analyze
from profiling.insights import Evidence
from profiling.insights.copies import hidden_copy
from profiling.occupancy import DEFAULT_DEVICE
from profiling.trace import parse_trace
from profiling.windows import window_stats
from tests import reference
from tests.conftest import DATA, ROOT
from tests.profiling.test_copy_causes import Plain, plain_cause
from tests.profiling.test_gpu_metrics import plain_occupancy, span_of
from tests.profiling.test_mutants_occupancy import fill_one_block_at_a_time
from tests.timing_slack import TIMING_SLACK

A100 = DATA / "a100_simple_add.json.gz"
TRAINING = DATA / "sampled_training_rank0.json.gz"
CAUSAL = ["", "", "", "", "", "True"]  # SDPA's Concrete Inputs: is_causal is its 6th
LISTED_GPUS = 64  # README: `gpus` lists the 64 GPUs with the most kernel time


@functools.cache
def _text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode()


def document(path: Path) -> dict:
    """A fresh copy of a real trace's JSON, to edit."""
    return json.loads(_text(path))


def plain_events(doc: dict) -> list[dict]:
    """The complete events, as the reference reads them (categories in today's spelling, names cut)."""
    path = Path(_scratch()) / "plain.json"
    path.write_text(json.dumps(doc))
    return reference.raw_events(path)


@functools.cache
def _scratch() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="crafted-args-")


def rules(analysis: Analysis) -> dict[str, Any]:
    return {i.rule: i for i in analysis.insights}


@dataclass
class Case:
    doc: dict
    check: Callable[[Analysis], None]  # on the analysis in this process
    check_summary: Callable[[dict], None]  # on the summary the CLI prints


def _no_check(summary: dict) -> None:
    return None


# --- the crafted cases --------------------------------------------------------------------------


def _ops(doc: dict, name: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e.get("name") == name]


def clone_case(bad_args: dict) -> Case:
    """Two aten::mm ops renamed aten::clone: one 4x4 float (64 bytes), one carrying the bad args. The rule, called
    on the whole trace (its copies are under 1% of GPU time, so find_insights drops its finding), must leave the
    bad clone out with a note and count every other copy's bytes."""
    doc = document(TRAINING)
    good, bad = _ops(doc, "aten::mm")[:2]
    good["name"] = bad["name"] = "aten::clone"
    good["args"].update({"Input Dims": [[4, 4]], "Input type": ["float"]})
    bad["args"].update(bad_args)
    expected = _plain_hidden_copy_bytes(doc, left_out=bad)

    def check(analysis: Analysis) -> None:
        trace = analysis.trace
        found = hidden_copy(Evidence(trace, window_stats(trace, None), trace.kernels))
        assert found is not None and found.evidence["bytes_per_forward"] == expected
        note = found.evidence["note"]
        assert note.startswith("1 copy(ies) left out: ") and "size is not in the trace" in note

    def check_summary(summary: dict) -> None:
        json.dumps(summary, allow_nan=False)
        raws = [text for v in bad_args.values() for text in (json.dumps(v), str(v))]
        for text in summary["insights"]:
            assert "Traceback" not in text
            for raw in raws:  # a bad value may be quoted, cut to 120 characters, never in full beyond that
                assert not any(raw[i : i + 121] in text for i in range(len(raw) - 120)), text[:200]

    return Case(doc, check, check_summary)


# torch's names for the element types in `Input type`: "long" is how older traces spell int64.
ITEMSIZE = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "bool": 1, "long int": 8, "long": 8, "int": 4}
COPY_OPS = ("aten::clone", "aten::copy_")


def _plain_hidden_copy_bytes(doc: dict, left_out: dict) -> int:
    """Bytes of every copy but the syncs' and `left_out`'s, read by hand: the outermost clone/copy_ of each nest,
    with the bytes of the memcpys it launched or else of its first input (a 0-dim one is no copy), and each
    memcpy no copy op launched (`Plain` gives the op tree and each GPU event's launch)."""
    path = Path(_scratch()) / "plain.json"
    path.write_text(json.dumps(doc))
    plain = Plain(path)
    roots = {
        id(o): {"op": o, "memcpy_bytes": []}
        for o in plain.ops
        if o["name"] in COPY_OPS and not any(a["name"] in COPY_OPS for a in plain.path(o)[1:])
    }
    sizes: list[tuple[list[dict], int]] = []  # (the path the cause is read from, bytes)
    for g in plain.gpu:
        around = plain.launched_under(g)
        copy_ops = [a for a in around if a["cat"] == "cpu_op" and a["name"] in COPY_OPS]
        if copy_ops and g["name"].startswith("Memcpy"):
            roots[id(copy_ops[-1])]["memcpy_bytes"].append(g["args"]["bytes"])
        elif g["name"].startswith("Memcpy"):
            sizes.append((around, g["args"]["bytes"]))
    mine = [r for r in roots.values() if all(r["op"][k] == left_out[k] for k in ("ts", "pid", "tid", "name"))]
    assert len(mine) == 1 and not mine[0]["memcpy_bytes"]  # the bad clone is a copy of its own, sized by its args
    for root in roots.values():
        op = root["op"]
        if root is mine[0]:
            continue
        if root["memcpy_bytes"]:
            sizes.append((plain.path(op), sum(root["memcpy_bytes"])))
        elif op["args"]["Input Dims"][0]:
            sizes.append((plain.path(op), _first_input_bytes(op["args"])))
    return sum(size for around, size in sizes if plain_cause(around) != "sync")


def _first_input_bytes(args: dict) -> int:
    size = ITEMSIZE[args["Input type"][0]]
    for d in args["Input Dims"][0]:
        size *= d
    return size


def sdpa_case(bad_dims: list) -> Case:
    """A causal SDPA call with the bad Input Dims, then a good one: 16 queries against 256 keys."""
    doc = document(TRAINING)
    bad, good = _ops(doc, "aten::mm")[:2]
    bad["name"] = good["name"] = "aten::scaled_dot_product_attention"
    bad["args"].update({"Input Dims": bad_dims, "Concrete Inputs": CAUSAL})
    good["args"].update({"Input Dims": [[1, 8, 16, 64], [1, 8, 256, 64], [1, 8, 256, 64]], "Concrete Inputs": CAUSAL})
    assert doc["traceEvents"].index(bad) < doc["traceEvents"].index(good)

    def check(analysis: Analysis) -> None:
        found = rules(analysis)["wrong_alignment"]
        assert (found.evidence["q_len"], found.evidence["kv_len"]) == (16, 256)
        assert found.evidence["note"].startswith("1 causal SDPA call(s) left out")

    def check_summary(summary: dict) -> None:
        assert any(
            text.startswith("Wrong causal alignment") and "16 queries and 256 keys" in text
            for text in summary["insights"]
        )

    return Case(doc, check, check_summary)


def _kernels(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


def block_case(bad_block: list) -> Case:
    """Every launch of one kernel (not one the occupancy note names) given an impossible block."""
    doc = document(A100)
    names = sorted({k["name"] for k in _kernels(doc) if "registers per thread" in k["args"]}, key=len)
    target = next(n for n in names if "scudnn" not in n and "xmma" not in n)
    for k in _kernels(doc):
        if k["name"] == target:
            k["args"]["block"] = bad_block

    def check(analysis: Analysis) -> None:
        found = rules(analysis)["occupancy"]
        rows = found.evidence["kernels"]
        assert target not in {r["kernel"] for r in rows}
        assert any(note.startswith(target[:40]) and "block" in note for note in found.evidence["skipped"])
        assert all(0 <= r["theoretical_percent"] <= 100 for r in rows)
        shown = analysis.kernel_table.set_index("name").loc[target]
        assert shown["count"] == sum(1 for k in _kernels(doc) if k["name"] == target)

    return Case(doc, check, _no_check)


def device_case(field: str, value: Any) -> Case:
    """Every `deviceProperties` entry given an unusable value for one SM limit: the default stands in."""
    doc = document(A100)
    for entry in doc["deviceProperties"]:
        entry[field] = value
    used = {**doc["deviceProperties"][0], field: DEFAULT_DEVICE[field]}
    first_launch: dict[str, dict] = {}
    for k in _kernels(doc):
        first_launch.setdefault(_cut(k["name"]), k)  # the rule reads each name's first launch

    def check(analysis: Analysis) -> None:
        found = rules(analysis)["occupancy"]
        assert any(note.startswith(f"deviceProperties {field} is ") for note in found.evidence["device_notes"])
        for row in found.evidence["kernels"]:
            args = first_launch[row["kernel"]]["args"]
            threads = args["block"][0] * args["block"][1] * args["block"][2]
            blocks, _ = fill_one_block_at_a_time(args["registers per thread"], threads, args["shared memory"], used)
            warps = -(-threads // used["warpSize"])
            slots = used["maxThreadsPerMultiprocessor"] // used["warpSize"]
            assert row["blocks_per_sm"] == blocks
            assert row["theoretical_percent"] == pytest.approx(100 * blocks * warps / slots)

    return Case(doc, check, _no_check)


def _cut(name: str) -> str:
    chars = reference.NAME_CHARS
    return name if len(name) <= chars else name[: chars - 1] + "…"


def occupancy_case() -> Case:
    """Every other kernel event claims 1,000,000% achieved occupancy."""
    doc = document(A100)
    crafted = _kernels(doc)[::2]
    for k in crafted:
        k["args"]["est. achieved occupancy %"] = 1e6
    events = plain_events(doc)
    kernels = [e for e in events if e["cat"] == "kernel"]
    expected = plain_occupancy(kernels, *span_of(events))
    per_name: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for k in kernels:
        occ = k["args"].get("est. achieved occupancy %")
        per_name[k["name"]].append((occ if occ is not None and 0 <= occ <= 100 else 0.0, k["dur"]))

    def check(analysis: Analysis) -> None:
        assert analysis.summary["achieved_occupancy_percent"] == pytest.approx(expected)
        table = analysis.kernel_table.set_index("name")
        for name, values in per_name.items():
            weight = sum(d for _, d in values)
            mean = sum(o * d for o, d in values) / weight if weight else 0.0
            assert table.loc[name, "achieved occupancy (%)"] == pytest.approx(mean), name
        for row in rules(analysis)["occupancy"].evidence["kernels"]:
            assert row["achieved_percent"] is None or 0 <= row["achieved_percent"] <= 100
        assert rules(analysis)["impossible_values"].evidence["occupancy_out_of_range"] == len(crafted)

    def check_summary(summary: dict) -> None:
        assert summary["achieved_occupancy_percent"] == pytest.approx(expected)
        assert any(text.startswith("Impossible values left out") for text in summary["insights"])

    return Case(doc, check, check_summary)


def shared_correlation_case(launches: int = 50) -> Case:
    """50 runtime launches share the correlation id of one kernel: its time must count once."""
    doc = document(TRAINING)
    kernel = next(k for k in _kernels(doc) if k["dur"] >= 100)
    shared = kernel["args"]["correlation"]
    others = [
        e
        for e in doc["traceEvents"]
        if e.get("cat") == "cuda_runtime"
        and e.get("name") == "cudaLaunchKernel"
        and e["args"].get("correlation") != shared
    ]
    for e in others[: launches - 1]:
        e["args"]["correlation"] = shared
    expected = _first_launch_device_time(plain_events(doc))
    gpu_total = sum(e["dur"] for e in plain_events(doc) if e["cat"] in reference.GPU)

    def check(analysis: Analysis) -> None:
        ops = analysis.op_table.set_index("name")
        for name, row in ops.iterrows():
            assert row["self device (us)"] == pytest.approx(expected.get(name, 0.0), abs=1e-6), name
        assert ops["self device (us)"].sum() <= gpu_total + 1e-6
        found = rules(analysis)["impossible_values"]
        assert found.evidence["launches_sharing_correlation"] == launches - 1

    def check_summary(summary: dict) -> None:
        assert any(f"{launches - 1} launch event(s) reuse" in text for text in summary["insights"])

    return Case(doc, check, check_summary)


def _first_launch_device_time(events: list[dict]) -> dict[str, float]:
    """Self device time per op name, each GPU event given once: to the first launch (in the file) of its id."""
    parent = reference.nest(events)
    by_id = {id(e): e for e in events}
    device: dict[Any, float] = defaultdict(float)
    for e in events:
        if e["cat"] in reference.GPU:
            device[e["args"].get("correlation")] += e["dur"]
    seen: set = set()
    out: dict[str, float] = defaultdict(float)
    for e in events:
        correlation = e.get("args", {}).get("correlation")
        if e["cat"] not in reference.LAUNCHES or correlation is None or correlation in seen:
            continue
        seen.add(correlation)
        owner = parent[id(e)]
        if owner is not None and by_id[owner]["cat"] == "cpu_op":
            out[by_id[owner]["name"]] += device.get(correlation, 0.0)
    return out


def duplicate_id_case() -> Case:
    """Two `deviceProperties` entries with id 0: the first one describes GPU 0."""
    doc = document(A100)
    doc["deviceProperties"].insert(1, {**doc["deviceProperties"][0], "name": "the second entry with id 0"})
    doc["deviceProperties"][0]["name"] = "the first entry with id 0"

    def check_summary(summary: dict) -> None:
        assert summary["gpu_name"] == "the first entry with id 0"
        assert summary["gpus"][0]["gpu_name"] == "the first entry with id 0"

    return Case(doc, lambda analysis: check_summary(dict(analysis.summary)), check_summary)


CASES: dict[str, Callable[[], Case]] = {
    "input_type_list": lambda: clone_case({"Input Dims": [[4, 4]], "Input type": [["float"]]}),
    "input_dims_1e300": lambda: clone_case({"Input Dims": [[1e300, 1e300]], "Input type": ["float"]}),
    "input_dims_text": lambda: clone_case({"Input Dims": [["a", 2]], "Input type": ["float"]}),
    "sdpa_dims_1d": lambda: sdpa_case([[8], [8]]),
    "sdpa_dims_text": lambda: sdpa_case([["a", "b"], ["c", "d"]]),
    "block_1e200": lambda: block_case([1e200, 1e200, 1e200]),
    "block_text": lambda: block_case(["a", "b", "c"]),
    "warp_size_0": lambda: device_case("warpSize", 0),
    "warp_size_text": lambda: device_case("warpSize", "x"),
    "registers_list": lambda: device_case("regsPerMultiprocessor", [1]),
    "max_threads_null": lambda: device_case("maxThreadsPerMultiprocessor", None),
    "occupancy_1e6": occupancy_case,
    "shared_correlation": shared_correlation_case,
    "duplicate_device_id": duplicate_id_case,
}


def _bounded(summary: dict) -> None:
    """What holds for every summary: percentages within 0..100."""
    for gpu in [summary, *summary["gpus"]]:
        for key in ("achieved_occupancy_percent", "sm_efficiency_percent", "gpu_utilization_percent"):
            assert gpu[key] is None or 0 <= gpu[key] <= 100, key


@pytest.mark.parametrize("name", list(CASES))
def test_crafted_args_are_analyzed_by_every_rule(name):
    case = CASES[name]()
    analysis = analyze(parse_trace(json.dumps(case.doc).encode()))
    _bounded(dict(analysis.summary))
    case.check(analysis)


@pytest.mark.parametrize("name", list(CASES))
def test_crafted_args_through_the_cli(name, tmp_path):
    case = CASES[name]()
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(case.doc))
    out = subprocess.run(
        [sys.executable, "-m", "profiling", "analyze", str(path), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout
    summary = json.loads(out.stdout)
    _bounded(summary)
    case.check_summary(summary)


# --- deviceProperties at scale ------------------------------------------------------------------


def many_devices(devices: int, entries: int) -> bytes:
    """A real trace plus one kernel on each of `devices` GPUs, and `entries` small deviceProperties."""
    doc = document(A100)
    real = _kernels(doc)
    doc["deviceProperties"] = [{"id": i, "name": f"gpu {i}"} for i in range(entries)]
    for i in range(devices):
        kernel = copy.deepcopy(real[i % len(real)])
        kernel["args"]["device"] = kernel["pid"] = i
        kernel["dur"] = 1 + i % 97  # kernel time differs per device, so the 64 listed are a real choice
        doc["traceEvents"].append(kernel)
    return json.dumps(doc).encode()


def test_two_thousand_devices_and_200_000_properties_list_the_busiest_64():
    data = many_devices(2000, 200_000)
    summary = analyze(parse_trace(data)).summary
    busy: dict[int, float] = defaultdict(float)
    for e in json.loads(data)["traceEvents"]:
        if e.get("cat") == "kernel":
            busy[e["args"]["device"]] += e["dur"]
    assert summary["gpu_count"] == len(busy) == 2000
    listed = [g["device"] for g in summary["gpus"]]
    assert listed == sorted(listed) and len(listed) == LISTED_GPUS
    assert min(busy[d] for d in listed) >= max(busy[d] for d in busy if d not in listed)
    assert all(g["gpu_name"] == f"gpu {g['device']}" for g in summary["gpus"])  # each found by its id


def _best_seconds(data: bytes, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        trace = parse_trace(data)  # fresh: an analysis keeps what it derived on the trace
        start = time.perf_counter()
        analyze(trace)
        best = min(best, time.perf_counter() - start)
    return best


def test_device_lookup_is_not_quadratic():
    """Ten times the devices and entries: a scan per device would take a hundred times as long."""
    small, large = many_devices(2000, 2000), many_devices(20_000, 20_000)
    ratio = _best_seconds(large) / _best_seconds(small)
    assert ratio < 20 * TIMING_SLACK, f"10x the devices and entries took {ratio:.1f}x the time"  # quadratic: 100x
