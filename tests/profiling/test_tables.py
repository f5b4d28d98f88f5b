"""The op and kernel tables against plain-loop references over the raw JSON, and against torch itself."""

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from attention import AttentionSpec, prepare
from profiling.tables import ANNOTATION, OP, kernel_table, op_table_from_trace
from profiling.trace import load_trace
from profiling.windows import annotation_windows, per_window, window_stats
from tests import reference
from tests.conftest import DATA

GPU_TRACES_WITH_OPS = ("sampled_training_rank0", "a100_simple_add")
MEASURED_FORWARD = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"


def _rows(table):
    return {r["name"]: r for r in table.to_dict(orient="records")}


def _assert_op_table_matches(path, table):
    expected = reference.op_table(path)
    rows = _rows(table[table["kind"] == OP])
    assert set(rows) == set(expected)
    for name, want in expected.items():
        got = rows[name]
        assert got["calls"] == want["calls"], name
        assert got["self cpu (us)"] == pytest.approx(want["self_cpu"], abs=1e-6), name
        assert got["total cpu (us)"] == pytest.approx(want["total_cpu"], abs=1e-6), name
        assert got["self device (us)"] == pytest.approx(want["self_device"], abs=1e-6), name
        assert got["total device (us)"] == pytest.approx(want["total_device"], abs=1e-6), name
        assert got["avg cpu (us)"] == pytest.approx(want["total_cpu"] / want["calls"]), name


@pytest.mark.parametrize("name", GPU_TRACES_WITH_OPS)
def test_op_table_on_real_gpu_traces_matches_a_plain_loop(name):
    path = DATA / f"{name}.json.gz"
    table = op_table_from_trace(load_trace(path))
    _assert_op_table_matches(path, table)
    # The traces exercise what a bug would break: nesting, and device time below the op that launched it.
    assert (table["total device (us)"] > table["self device (us)"] + 1).any()
    assert (table["total cpu (us)"] > table["self cpu (us)"] + 1).any()


def test_op_table_on_our_cpu_run_matches_a_plain_loop(cpu_runs):
    result = cpu_runs["math"]
    _assert_op_table_matches(result.trace_path, result.op_table)
    # aten::mul calls aten::mul for the scalar: merged into one call, as key_averages counts it.
    mul = _rows(result.op_table)["aten::mul"]
    raw_muls = [e for e in reference.raw_events(result.trace_path) if e["name"] == "aten::mul"]
    assert mul["calls"] == len(raw_muls) / 2


def test_profile_op_table_lists_annotations_last_and_never_as_ops(cpu_runs):
    table = cpu_runs["naive"].op_table
    kinds = list(table["kind"])
    assert kinds == sorted(kinds, key=lambda k: k == ANNOTATION)  # ops first
    annotations = set(table.loc[table["kind"] == ANNOTATION, "name"])
    assert "attn_fwd" in annotations and {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"} <= annotations
    assert not any(n.startswith("ProfilerStep") or n == "attn_fwd" for n in table.loc[table["kind"] == OP, "name"])


def test_analyze_op_table_has_no_annotations():
    table = op_table_from_trace(load_trace(DATA / "sampled_training_rank0.json.gz"))
    assert set(table["kind"]) == {OP}
    assert not table["name"].str.startswith("ProfilerStep").any()


@pytest.fixture(scope="module")
def math_profile(tmp_path_factory):
    """A real profile of SDPA math on the CPU, with torch's own key_averages beside its trace."""
    forward = prepare(AttentionSpec(variant="sdpa", backend="math", seq_len=64, device="cpu"))
    with torch.no_grad():
        for _ in range(2):
            forward()
        with profile(
            activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3), record_shapes=True
        ) as prof:
            for _ in range(5):
                with record_function("attn_fwd"):
                    forward()
                prof.step()
    path = tmp_path_factory.mktemp("ka") / "math.json"
    prof.export_chrome_trace(str(path))
    return prof.key_averages(), path


def test_trace_op_table_agrees_with_key_averages_column_by_column(math_profile):
    averages, path = math_profile
    table = op_table_from_trace(load_trace(path), with_annotations=True)
    rows = _rows(table)
    steps = table[table["name"].str.startswith("ProfilerStep#")]
    for e in averages:
        if e.key == "ProfilerStep*":  # torch names the steps as one; the trace keeps each
            assert steps["calls"].sum() == e.count
            assert steps["self cpu (us)"].sum() == pytest.approx(e.self_cpu_time_total, abs=0.01)
            continue
        got = rows[e.key]
        assert got["calls"] == e.count, e.key
        assert got["self cpu (us)"] == pytest.approx(e.self_cpu_time_total, abs=0.01), e.key
        assert got["total cpu (us)"] == pytest.approx(e.cpu_time_total, abs=0.01), e.key
    assert rows["aten::mul"]["calls"] == 2 * 3  # two multiplies per forward, each with its same-name child merged


def test_kernel_table_per_forward_and_totals_match_a_plain_loop():
    path = DATA / "a100_simple_add.json.gz"
    trace = load_trace(path)
    stats = window_stats(trace, MEASURED_FORWARD)
    table = kernel_table(trace, stats)
    launched = reference.launched_in(path, MEASURED_FORWARD)
    per_name: dict[str, int] = {}
    for window in launched:
        for e in window:
            per_name[e["name"]] = per_name.get(e["name"], 0) + 1
    rows = _rows(table)
    for name, count in per_name.items():
        assert rows[name]["per forward"] == pytest.approx(count / len(launched)), name
    everything = [e for e in reference.raw_events(path) if e["cat"] in reference.GPU]
    for name, row in rows.items():
        durations = [e["dur"] for e in everything if e["name"] == name]
        assert row["count"] == len(durations)
        assert row["total (us)"] == pytest.approx(sum(durations))
        assert row["avg (us)"] == pytest.approx(sum(durations) / len(durations))
        assert row["per forward"] == pytest.approx(per_name.get(name, 0) / len(launched))


def test_per_window_counts_and_times_match_a_plain_loop():
    path = DATA / "sampled_training_rank0.json.gz"
    trace = load_trace(path)
    names = sorted({e["name"] for e in reference.raw_events(path) if e["name"].startswith("ProfilerStep#")})
    for name in names:
        rows = per_window(trace, annotation_windows(trace, name))
        gpu = reference.launched_in(path, name)
        ops = reference.aten_ops_in(path, name)
        spans = reference.windows(path, name)
        assert list(rows["ops"]) == [len(o) for o in ops]
        assert list(rows["gpu"]) == [len(g) for g in gpu]
        kernel_us = [sum(e["dur"] for e in g if e["cat"] == "kernel") for g in gpu]
        assert list(rows["kernel_us"]) == pytest.approx(kernel_us)
        assert list(rows["cpu_ms"]) == pytest.approx([w["dur"] / 1e3 for w in spans])
        device = [(max(map(reference.end, g)) - min(e["ts"] for e in g)) / 1e3 for g in gpu]
        assert list(rows["device_ms"]) == pytest.approx(device)


def test_forward_memory_peak_matches_a_plain_loop(cpu_runs):
    for name in ("naive", "inplace", "flash"):
        result = cpu_runs[name]
        assert result.summary["peak_memory_bytes"] == reference.memory_peak(result.trace_path, "attn_fwd")


def test_forward_window_counts_match_a_plain_loop(cpu_runs):
    for name in ("naive", "math", "flash"):
        result = cpu_runs[name]
        ops = reference.aten_ops_in(result.trace_path, "attn_fwd")
        assert result.summary["forwards"] == len(ops) == 3
        assert result.summary["ops_per_forward"] == sum(map(len, ops)) / 3
        spans = reference.windows(result.trace_path, "attn_fwd")
        assert result.summary["forward_cpu_ms"] == pytest.approx(sum(w["dur"] for w in spans) / 3 / 1e3, abs=1e-4)
        counted = {}
        for window in ops:
            for e in window:
                counted[e["name"]] = counted.get(e["name"], 0) + 1
        assert result.summary["per_forward_ops"] == {k: round(v / 3, 3) for k, v in counted.items()}


def test_self_cpu_total_is_the_trace_total(cpu_runs):
    result = cpu_runs["naive"]
    raw = json.loads(result.trace_path.read_text())["traceEvents"]
    table = reference.op_table(result.trace_path, kinds=("cpu_op", "user_annotation"))
    expected = sum(r["self_cpu"] for r in table.values()) / 1e3
    assert result.summary["self_cpu_total_ms"] == pytest.approx(expected, abs=1e-3)
    assert any(e.get("name") == "attn_fwd" for e in raw)


def test_display_tables_cut_a_trace_name_at_4_kb():
    import pandas as pd

    from profiling.tables import NAME_IN_TABLE, rounded

    long_name, cutlass = "k" * 100_000, "cutlass_80_tensorop_" + "x" * 1500  # a real CUTLASS name passes 1 kB
    table = pd.DataFrame({"name": [long_name, cutlass], "count": [1, 2], "avg (us)": [1.23456, 2.0]})
    shown = rounded(table)
    assert shown["name"].tolist() == [long_name[: NAME_IN_TABLE - 1] + "…", cutlass]
    assert len(shown["name"][0]) == NAME_IN_TABLE and shown["avg (us)"][0] == 1.235
    assert table["name"][0] == long_name  # the analysis keeps the whole name; only the display is cut
