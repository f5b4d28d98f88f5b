"""The two-trace diff (issue 22, item 5), checked against a plain loop over both raw JSONs.

Pairs: tests/data/cpu_pair (one CPU job before and after `masked_fill` -> `masked_fill_`, ten ProfilerSteps
each) and the shared GPU traces of one model on two vendors (h100 vs mi300x Qwen1.5-0.5B prefill).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy.stats import mannwhitneyu

from profiling import trace_diff, trace_diff_text
from profiling.admission import AdmissionError, AnalysisGate, analysis_cost, analysis_need_bytes
from profiling.trace import TraceError, load_trace
from profiling.trace_diff import Side, diff_files, diff_sides, diff_uploads, name_rows
from profiling.trace_diff_text import diff_text
from profiling.worker import Worker

DATA = Path(__file__).resolve().parents[1] / "data"
CPU_BEFORE, CPU_AFTER = DATA / "cpu_pair" / "before.json.gz", DATA / "cpu_pair" / "after.json.gz"
GPU_BEFORE = DATA / "gpu" / "h100_qwen1.5-0.5b_prefill.json.gz"
GPU_AFTER = DATA / "gpu" / "mi300x_qwen1.5-0.5b_prefill.json.gz"
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def raw_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path) as raw:
        return json.load(raw)["traceEvents"]


def plain_ops(path: Path) -> tuple[dict[str, dict[str, float]], set[str]]:
    """Per cpu_op name: calls, total and self host time (dur less the direct children's, found with a stack
    per thread), and the names with an event directly inside one of the same name (which the op table
    merges, as key_averages does): left out of the comparisons."""
    lanes: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in raw_events(path):
        if e.get("ph") == "X" and e.get("cat") not in GPU_CATEGORIES and "dur" in e:
            lanes[(e.get("pid"), e.get("tid"))].append(e)
    ops: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "total": 0.0, "self": 0.0})
    nested: set[str] = set()
    for events in lanes.values():
        events.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[list[Any]] = []  # [event, children's time]
        finished: list[list[Any]] = []
        for e in events:
            while stack and float(e["ts"]) >= float(stack[-1][0]["ts"]) + float(stack[-1][0]["dur"]):
                finished.append(stack.pop())
            if stack:
                stack[-1][1] += float(e["dur"])
                if stack[-1][0]["name"] == e["name"] and e.get("cat") == "cpu_op":
                    nested.add(e["name"])
            stack.append([e, 0.0])
        finished += stack
        for e, children in finished:
            if e.get("cat") == "cpu_op":
                row = ops[e["name"]]
                row["calls"] += 1
                row["total"] += float(e["dur"])
                row["self"] += max(0.0, float(e["dur"]) - children)
    return dict(ops), nested


def plain_kernels(path: Path) -> dict[str, dict[str, float]]:
    """Per GPU activity name (kernels, memcpy, memset): calls and total device time."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "total": 0.0})
    for e in raw_events(path):
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES:
            out[e["name"]]["calls"] += 1
            out[e["name"]]["total"] += float(e["dur"])
    return dict(out)


def plain_step_times(path: Path) -> list[float]:
    return [float(e["dur"]) for e in raw_events(path) if str(e.get("name", "")).startswith("ProfilerStep#")]


@pytest.fixture(scope="module")
def cpu_diff() -> dict[str, Any]:
    return diff_files(str(CPU_BEFORE), str(CPU_AFTER))


@pytest.fixture(scope="module")
def gpu_diff() -> dict[str, Any]:
    return diff_files(str(GPU_BEFORE), str(GPU_AFTER))


def _by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in rows}


def check_op_rows(diff: dict[str, Any], before: Path, after: Path, with_self: bool) -> int:
    """Every op row's status, Δ calls, Δ total (and Δ self) host time against the plain loop; returns how
    many names were checked."""
    (ops_a, nested_a), (ops_b, nested_b) = plain_ops(before), plain_ops(after)
    rows = _by_name(diff["ops"])
    assert {n for n, r in rows.items() if r["status"] == "added"} == set(ops_b) - set(ops_a)
    assert {n for n, r in rows.items() if r["status"] == "removed"} == set(ops_a) - set(ops_b)
    empty = {"calls": 0, "total": 0.0, "self": 0.0}
    checked = 0
    for name in (set(ops_a) | set(ops_b)) - nested_a - nested_b:
        a, b = ops_a.get(name, empty), ops_b.get(name, empty)
        if a == b:
            assert name not in rows
            continue
        row = rows[name]
        assert row["Δ calls"] == b["calls"] - a["calls"], name
        assert row["Δ total host (us)"] == pytest.approx(b["total"] - a["total"], abs=0.01), name
        if a["total"]:
            assert row["Δ% total host (us)"] == pytest.approx((b["total"] - a["total"]) / a["total"] * 100, abs=0.01)
        if with_self:
            assert row["Δ self host (us)"] == pytest.approx(b["self"] - a["self"], abs=0.05), name
        checked += 1
    return checked


def test_cpu_pair_ops_match_a_plain_loop(cpu_diff: dict[str, Any]) -> None:
    assert check_op_rows(cpu_diff, CPU_BEFORE, CPU_AFTER, with_self=True) >= 15


def test_cpu_pair_shows_the_removed_copy(cpu_diff: dict[str, Any]) -> None:
    """The change itself: masked_fill's clone and its copy are gone, ten per trace (one a step)."""
    rows = _by_name(cpu_diff["ops"])
    for name in ("aten::masked_fill", "aten::clone", "aten::empty_like"):
        assert rows[name]["status"] == "removed" and rows[name]["Δ calls"] == -10
    assert rows["aten::copy_"]["Δ calls"] == -10
    assert cpu_diff["kernels"] == [] and cpu_diff["gpu_metrics"] == []  # host-only traces


def test_cpu_pair_step_time_follows_the_noise_rule(cpu_diff: dict[str, Any]) -> None:
    """Ten steps a side: the medians compared by Mann–Whitney (scipy's, on the raw ProfilerStep durations),
    "changed" only at p < 0.01 and >= 5%."""
    step = cpu_diff["steps"][0]
    a, b = plain_step_times(CPU_BEFORE), plain_step_times(CPU_AFTER)
    assert step["steps_before"] == len(a) == 10 and step["steps_after"] == len(b) == 10
    assert step["median_before"] == pytest.approx(np.median(a), rel=1e-6)
    assert step["median_after"] == pytest.approx(np.median(b), rel=1e-6)
    p = mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").pvalue
    assert step["p_value"] == pytest.approx(p, rel=1e-2)
    expected = "changed" if p < 0.01 and abs(np.median(b) - np.median(a)) >= 0.05 * np.median(a) else "within noise"
    assert step["status"] == expected
    assert step["before"] == pytest.approx(np.mean(a), rel=1e-3)  # the mean step time
    assert step["Δ%"] == pytest.approx((np.mean(b) - np.mean(a)) / np.mean(a) * 100, abs=0.1)


def test_gpu_pair_op_rows_match_a_plain_loop(gpu_diff: dict[str, Any]) -> None:
    assert check_op_rows(gpu_diff, GPU_BEFORE, GPU_AFTER, with_self=True) >= 40


def test_gpu_pair_kernel_rows_match_a_plain_loop(gpu_diff: dict[str, Any]) -> None:
    ka, kb = plain_kernels(GPU_BEFORE), plain_kernels(GPU_AFTER)
    rows = _by_name(gpu_diff["kernels"])
    assert {n for n, r in rows.items() if r["status"] == "added"} == set(kb) - set(ka)
    assert {n for n, r in rows.items() if r["status"] == "removed"} == set(ka) - set(kb)
    assert gpu_diff["counts"]["kernels"]["added"] == len(set(kb) - set(ka)) > 0
    for name in set(ka) | set(kb):
        a, b = ka.get(name, {"calls": 0, "total": 0.0}), kb.get(name, {"calls": 0, "total": 0.0})
        if a == b:
            continue
        assert rows[name]["Δ calls"] == b["calls"] - a["calls"], name
        assert rows[name]["Δ total device (us)"] == pytest.approx(b["total"] - a["total"], abs=0.01), name
    # README table: kernel time 45,433 µs (H100) and 43,062 µs (MI300X), one step each: Δ only, no noise test.
    metrics = _by_name(gpu_diff["gpu_metrics"])
    assert metrics["kernel_time_us"]["before"] == pytest.approx(45_433, abs=1)
    assert metrics["kernel_time_us"]["after"] == pytest.approx(43_062, abs=1)
    assert metrics["tensor_core_time_percent"]["Δ"] == pytest.approx(52.4 - 36.6, abs=0.15)
    assert gpu_diff["steps"][0]["status"] == "single measurement" and gpu_diff["steps"][0]["p_value"] is None


def test_gpu_pair_top_regressions_are_the_largest_growths(gpu_diff: dict[str, Any]) -> None:
    ka, kb = plain_kernels(GPU_BEFORE), plain_kernels(GPU_AFTER)
    growth = {n: kb.get(n, {"total": 0.0})["total"] - ka.get(n, {"total": 0.0})["total"] for n in set(ka) | set(kb)}
    expected = sorted((g for g in growth.values() if g > 0), reverse=True)[: trace_diff.TOP_REGRESSIONS]
    got = [r["Δ"] for r in gpu_diff["regressions"] if r["kind"] == "kernel"]
    assert got == pytest.approx(expected, abs=0.01)


def test_text_fits_120_columns(gpu_diff: dict[str, Any], cpu_diff: dict[str, Any]) -> None:
    for diff in (gpu_diff, cpu_diff):
        lines = diff_text(diff)
        assert max(len(line) for line in lines) <= trace_diff_text.TEXT_WIDTH


def _side(step_times: list[float], **summary: Any) -> Side:
    ops = pd.DataFrame(columns=["name"])
    mean = float(np.mean(step_times)) if step_times else None
    return Side(
        ops=ops, kernels=ops, per_step_us={"step time": step_times}, summary={"average_step_time_us": mean, **summary}
    )


def _table(rows: list[tuple[str, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["name", "calls", "total cpu (us)"])


@pytest.mark.parametrize(
    ("after_times", "status"),
    [
        ([120.0, 121.0, 119.0, 122.0, 120.5, 121.5], "changed"),  # +20%, every after step slower
        ([101.0, 99.5, 100.5, 102.0, 99.0, 100.0], "within noise"),  # ~ +0.5%
        ([103.0, 104.0, 102.5, 103.5, 104.5, 103.0], "within noise"),  # significant but under 5%
        ([120.0, 121.0, 119.0], "single measurement"),  # three steps: too few to test
    ],
)
def test_step_noise_rule_on_synthetic_sides(after_times: list[float], status: str) -> None:
    before = _side([100.0, 101.0, 99.0, 100.5, 99.5, 100.0])
    step = diff_sides(before, _side(after_times))["steps"][0]
    assert step["status"] == status
    assert step["Δ"] == pytest.approx(np.mean(after_times) - 100.0, abs=1e-3)


def test_rows_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A crafted trace with many distinct names: all are counted, the MAX_NAMES rows with the largest |Δ| kept."""
    monkeypatch.setattr(trace_diff, "MAX_NAMES", 5)
    before, after = _side([]), _side([])
    before = Side(_table([(f"op{i}", 1, float(i)) for i in range(50)]), before.kernels, {}, before.summary)
    after = Side(_table([(f"op{i}", 1, 2.0 * i) for i in range(50)]), after.kernels, {}, after.summary)
    diff = diff_sides(before, after)
    assert [row["name"] for row in diff["ops"]] == ["op49", "op48", "op47", "op46", "op45"]
    assert [row["Δ% total host (us)"] for row in diff["ops"]] == [100.0] * 5
    assert diff["counts"]["ops"]["changed"] == 49 and diff["left_off"]["ops"] == 44  # op0 did not change


def test_added_and_removed_on_synthetic_tables() -> None:
    before = _table([("a", 2, 10.0), ("b", 1, 5.0), ("same", 1, 1.0)])
    after = _table([("a", 3, 16.0), ("c", 4, 8.0), ("same", 1, 1.0)])
    rows = _by_name(
        name_rows("op", before, after, (("calls", "calls"), ("total host (us)", "total cpu (us)"))).to_dict("records")
    )
    assert set(rows) == {"a", "b", "c"}  # "same" changed nothing
    assert (rows["a"]["status"], rows["a"]["Δ calls"], rows["a"]["Δ% total host (us)"]) == ("changed", 1, 60.0)
    assert (rows["b"]["status"], rows["c"]["status"], rows["c"]["Δ% total host (us)"]) == ("removed", "added", None)


def test_uploads_refused_together_before_either_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each trace fits a small budget alone, both do not: refused naming `after`, before any analysis."""
    cost_a, cost_b = analysis_cost(CPU_BEFORE), analysis_cost(CPU_AFTER)
    started: list[str] = []
    monkeypatch.setattr(trace_diff, "diff_files", lambda *a, **k: started.append("ran"))
    gate = AnalysisGate(max(cost_a.peak_bytes, cost_b.peak_bytes) + 1)
    with pytest.raises(AdmissionError, match=r"^after: analysing both traces"):
        diff_uploads(CPU_BEFORE, CPU_AFTER, gate=gate, worker=Worker(enabled=False))
    with pytest.raises(AdmissionError, match=r"^before: "):
        diff_uploads(CPU_BEFORE, CPU_AFTER, gate=AnalysisGate(cost_a.peak_bytes - 1), worker=Worker(enabled=False))
    assert started == [] and gate.in_use_bytes == 0


def test_uploads_admitted_together_give_the_files_diff(cpu_diff: dict[str, Any]) -> None:
    # Each trace's charge before its read, grown to what its events need once read: no more fits.
    traces = (CPU_BEFORE, CPU_AFTER)
    needs = [max(analysis_cost(p).peak_bytes, analysis_need_bytes(load_trace(p))) for p in traces]
    gate = AnalysisGate(sum(needs))
    diff = diff_uploads(CPU_BEFORE, CPU_AFTER, time_limit_s=120, gate=gate, worker=Worker(enabled=False))
    assert diff["ops"] == cpu_diff["ops"] and diff["counts"] == cpu_diff["counts"]
    assert gate.in_use_bytes == 0  # given back


def test_uploads_in_the_analysis_process_are_json_native(cpu_diff: dict[str, Any]) -> None:
    """The default path: both analyses in one forked analysis process; the result is plain JSON (no NaN)."""
    diff = diff_uploads(CPU_BEFORE, CPU_AFTER, time_limit_s=120, progress=lambda fraction, message: None)
    assert json.loads(json.dumps(diff, allow_nan=False)) == json.loads(json.dumps(cpu_diff, allow_nan=False))


def test_uploads_name_the_bad_file(tmp_path: Path) -> None:
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(TraceError, match=r"^after: "):
        diff_uploads(CPU_BEFORE, tmp_path / "bad.json.gz", worker=Worker(enabled=False))
