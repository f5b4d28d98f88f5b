"""`analyze` on real traces: what the TensorBoard plugin recorded, any vintage, no contradiction."""

import gzip
import json

import pandas as pd
import pytest

from profiling.analysis import MAX_STEPS, analyze, analyze_file
from profiling.tables import OP
from profiling.trace import parse_trace
from tests import reference
from tests.conftest import DATA

TB = DATA / "tb_plugin"
RESNET = TB / "resnet50_num_workers_4.pt.trace.json.gz"
# Today's spellings of the 2021 categories, as a trace written by torch >= 1.10 has them.
NEW_SPELLING = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Runtime": "cuda_runtime"}
TORCH_RANGES = ("ProfilerStep#", "Optimizer.", "enumerate(DataLoader)#")


def _recorded(view: int) -> dict:
    return json.loads((TB / "resnet50_num_workers_4.expected.jsonl").read_text().splitlines()[view])


@pytest.fixture(scope="module")
def resnet():
    return analyze_file(RESNET)


def test_op_table_is_the_plugins_operator_table(resnet):
    """Calls, host and device self/total µs of every op, as the plugin showed them (whole µs)."""
    recorded = {row["name"]: row for row in _recorded(2)["data"]}
    ours = {row["name"]: row for row in resnet.op_table.to_dict(orient="records")}
    assert set(ours) == set(recorded)  # no ProfilerStep, Optimizer or DataLoader range among the ops
    for name, want in recorded.items():
        got = ours[name]
        assert got["calls"] == want["calls"], name
        assert got["self cpu (us)"] == pytest.approx(want["host_self_duration"], abs=1), name
        assert got["total cpu (us)"] == pytest.approx(want["host_total_duration"], abs=1), name
        assert got["self device (us)"] == pytest.approx(want["device_self_duration"], abs=1), name
        assert got["total device (us)"] == pytest.approx(want["device_total_duration"], abs=1), name


def test_gpu_card_is_what_the_plugin_showed(resnet):
    shown = {row["title"]: row["value"] for row in _recorded(0)["gpu_metrics"]["data"]}
    summary = resnet.summary
    assert summary["gpu_name"] == shown["Name"]
    assert f"{summary['gpu_utilization_percent']:.2f} %" == shown["GPU Utilization"]
    assert f"{summary['sm_efficiency_percent']:.2f} %" == shown["Est. SM Efficiency"]
    assert f"{summary['achieved_occupancy_percent']:.2f} %" == shown["Est. Achieved Occupancy"]
    assert f"{summary['tensor_core_time_percent']:.1f} %" == shown["Kernel Time using Tensor Cores"]
    assert f"{summary['gpu_memory_bytes'] / 1024**3:.2f} GB" == shown["Memory"]


def test_steps_table_is_the_plugins_steps(resnet):
    recorded = _recorded(0)["steps"]
    names = [c["name"] for c in recorded["columns"] if c.get("type") == "number"]
    columns = {"Kernel": "kernel (us)", "Memcpy": "memcpy (us)", "Runtime": "runtime (us)", "Other": "other (us)"}
    for row, ours in zip(recorded["rows"], resnet.steps.to_dict(orient="records"), strict=True):
        values = dict(zip(names, row[1::2], strict=True))
        assert ours["step"] == f"ProfilerStep#{row[0]}"
        for plugin, column in columns.items():
            assert ours[column] == pytest.approx(values[plugin]), (ours["step"], plugin)


def test_steps_count_gpu_work_launched_from_any_thread(resnet):
    """The backward pass launches from autograd's thread: its kernels still belong to the step."""
    for row in resnet.steps.to_dict(orient="records"):
        launched = reference.launched_in(RESNET, row["step"])
        assert row["gpu activities"] == len(launched[0])
        assert row["kernel time (us)"] == pytest.approx(sum(e["dur"] for e in launched[0] if e["cat"] == "kernel"))
    assert resnet.steps["kernel time (us)"].min() > 90_000  # about 99k µs per step, not the 34k of one thread


def _respelled(path, tmp_path):
    """The same trace as a torch >= 1.10 profiler writes it: today's categories, torch's ranges as annotations."""
    document = json.loads(gzip.decompress(path.read_bytes()))
    for e in document["traceEvents"]:
        cat, name = e.get("cat"), str(e.get("name", ""))
        if cat == "Operator":
            e["cat"] = "user_annotation" if name.startswith(TORCH_RANGES) else "cpu_op"
        elif cat in NEW_SPELLING:
            e["cat"] = NEW_SPELLING[cat]
    out = tmp_path / "resnet_new_spelling.json"
    out.write_text(json.dumps(document))
    return out


def test_old_and_new_spellings_give_the_same_analysis(resnet, tmp_path):
    new = analyze_file(_respelled(RESNET, tmp_path))
    old_summary, new_summary = dict(resnet.summary), dict(new.summary)
    assert old_summary.pop("source") != new_summary.pop("source")
    assert old_summary == new_summary
    for table in ("op_table", "kernel_table", "steps", "annotations"):
        pd.testing.assert_frame_equal(getattr(resnet, table), getattr(new, table), check_dtype=False)


def test_no_insight_contradicts_the_trace(resnet):
    rules = {i.rule: i for i in resnet.insights}
    assert "no_kernels" not in rules  # 8,868 kernels are there
    busy = rules["overhead_bound"].evidence
    assert 0 < busy["busy_ms"] <= busy["span_ms"]  # merged intervals: never above 100%
    assert resnet.summary["idle_time_us"] >= 0 and resnet.summary["gpu_utilization_percent"] <= 100


def test_huge_step_numbers_are_annotations_not_a_crash():
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#" + "9" * 5000,
            "ts": 0,
            "dur": 5,
            "pid": 1,
            "tid": 1,
        },
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": 10, "dur": 5, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#10", "ts": 20, "dur": 5, "pid": 1, "tid": 1},
    ]
    analysis = analyze(parse_trace(json.dumps({"traceEvents": events}).encode()))
    assert list(analysis.steps["step"]) == ["ProfilerStep#2", "ProfilerStep#10"]  # by number, not by text
    assert analysis.summary["profiler_steps"] == 2 and analysis.summary["annotations"] == 3


def test_steps_table_is_capped_and_the_summary_counts_every_step():
    events = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": 10 * i, "dur": 5, "pid": 1, "tid": 1}
        for i in range(MAX_STEPS + 7)
    ]
    analysis = analyze(parse_trace(json.dumps({"traceEvents": events}).encode()))
    assert len(analysis.steps) == MAX_STEPS and analysis.summary["profiler_steps"] == MAX_STEPS + 7


def test_uploads_op_table_counts_only_ops(resnet):
    assert set(resnet.op_table["kind"]) == {OP}
    assert set(resnet.annotations["annotation"]) == {
        "Optimizer.step#SGD.step",
        "Optimizer.zero_grad#SGD.zero_grad",
        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
    }


@pytest.mark.parametrize(
    ("name", "source"),
    [("a100_simple_add", "fallback"), ("cpu_only", "profiler_steps"), ("sampled_training_rank0", "profiler_steps")],
)
def test_the_steps_table_summary_and_breakdown_agree(name, source):
    """One set of steps everywhere: the ProfilerSteps, or without them the plugin's step "0" over the
    host's ops (its CPU span from the first op's start to the last op's end, by a plain loop)."""
    path = DATA / f"{name}.json.gz"
    analysis = analyze_file(path)
    events = reference.raw_events(path)
    steps = [e for e in events if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    summary, table, per_step = analysis.summary, analysis.steps, analysis.steps.dropna(subset=["step time (us)"])
    assert summary["steps_source"] == source and summary["profiler_steps"] == len(table) == len(steps or [0])
    assert summary["average_step_time_us"] == pytest.approx(per_step["step time (us)"].mean())
    if source == "fallback":
        ops = [e for e in events if e["cat"] == "cpu_op"]
        span_us = max(reference.end(e) for e in ops) - min(e["ts"] for e in ops)
        assert list(table["step"]) == ["0"] and table["cpu (ms)"].iloc[0] == pytest.approx(span_us / 1e3)


def test_without_host_ops_there_is_no_step():
    """No ProfilerStep and no host op: the plugin's step would run from +inf to -inf; the app shows none."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 10, "dur": 5, "pid": 0, "tid": 7, "args": {"stream": 7}},
        {"ph": "X", "cat": "user_annotation", "name": "a", "ts": 2, "dur": 30, "pid": 1, "tid": 1},
    ]
    analysis = analyze(parse_trace(json.dumps({"traceEvents": events}).encode()))
    assert analysis.steps.empty and analysis.summary["steps_source"] is None
    assert analysis.summary["profiler_steps"] == 0 and analysis.summary["average_step_time_us"] is None
