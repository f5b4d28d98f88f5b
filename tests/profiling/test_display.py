"""The page's tables (profiling/display.py) on real tables, against plain readings of the same data.

The truths come by other routes: the GPU op table's order and shares from a plain loop over the
trace's JSON (each kernel's time given to the innermost op around its launch), the steps' times from
the trace's ProfilerStep events, the CPU compute ops from the blog's naive attention.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import pandas as pd
import pytest

from profiling.analysis import analyze_file
from profiling.compare import add_speedups, compare_table
from profiling.display import KINDS, PERCENT, compute_ops, display_table, has_gpu_activity, prepare
from profiling.tables import KERNEL_COLUMNS, OP_COLUMNS, rounded
from tests.conftest import DATA

BERT = DATA / "gpu" / "h100_bert-small_sdpa-flash.json.gz"
MHA = DATA / "gpu" / "h100_nn-mha_fp32.json.gz"
GPU_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCHES = {"cuda_runtime", "cuda_driver"}


def raw_events(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def launched_time_by_op(path) -> dict[str, float]:
    """Per op name, the GPU time of the launches it made: each GPU event's dur, given through its
    correlation id to its launch, and from there to the innermost cpu_op around the launch (same thread)."""
    events = [e for e in raw_events(path) if e.get("ph") == "X"]
    gpu = defaultdict(float)
    for e in events:
        if e.get("cat") in GPU_WORK:
            gpu[e["args"]["correlation"]] += e["dur"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    by_op: dict[str, float] = defaultdict(float)
    seen = set()
    for launch in (e for e in events if e.get("cat") in LAUNCHES):
        correlation = launch.get("args", {}).get("correlation")
        if correlation not in gpu or correlation in seen:
            continue
        seen.add(correlation)
        around = [
            o
            for o in ops
            if (o["pid"], o["tid"]) == (launch["pid"], launch["tid"]) and o["ts"] <= launch["ts"] <= o["ts"] + o["dur"]
        ]
        if around:
            innermost = max(around, key=lambda o: (o["ts"], -o["dur"]))
            by_op[innermost["name"]] += gpu[correlation]
    return dict(by_op)


@pytest.fixture(scope="module")
def bert():
    return analyze_file(str(BERT))


@pytest.fixture(scope="module")
def mha():
    return analyze_file(str(MHA))


@pytest.fixture(scope="module")
def naive_cpu(tmp_path_factory):
    """A real CPU run of the blog's naive attention."""
    from attention import AttentionSpec
    from profiling.pipeline import profile_attention

    return profile_attention(AttentionSpec(variant="naive", device="cpu"), tmp_path_factory.mktemp("naive"))


def numbers(text: pd.Series) -> list[float]:
    return [float(t.replace(",", "")) for t in text]


def test_gpu_op_table_is_sorted_by_device_self_time_with_its_share(bert):
    truth = launched_time_by_op(BERT)
    api = rounded(bert.op_table)
    shown = prepare(api, "ops", gpu=has_gpu_activity(bert.summary), forwards=None)
    text = shown.text
    assert text["name"].iloc[0] == max(truth, key=truth.get) == "aten::addmm"
    # The complaint: aten::empty (much host self time, no device time) ranked high; now it
    # follows every op that launched GPU work.
    assert list(api["name"]).index("aten::empty") < len(truth)
    assert list(text["name"]).index("aten::empty") >= len(truth)
    device = numbers(text["self device (µs)"])
    assert device == sorted(device, reverse=True)
    # The top share against the plain loop's: its time over all GPU time that an op launched.
    share = 100 * truth["aten::addmm"] / sum(truth.values())
    assert text[PERCENT].iloc[0] == f"{share:.1f}"
    assert list(text.columns).index(PERCENT) == list(text.columns).index("self device (µs)") + 1
    # Every op with launched time shows it, in µs with one decimal.
    for name, us in truth.items():
        assert text.loc[text["name"] == name, "self device (µs)"].iloc[0] == f"{round(us, 3):,.1f}"


def test_cpu_op_table_hides_device_columns_and_sorts_by_host_self_time(naive_cpu):
    api = rounded(naive_cpu.op_table)
    assert api["self device (us)"].eq(0).all()  # on CPU the API's device columns read 0
    summary = dict(naive_cpu.summary)
    assert not has_gpu_activity(summary)
    text = display_table(api, "ops", gpu=False, forwards=summary["forwards"])
    assert not [c for c in text.columns if "device" in c]
    ops, annotations = text[text["kind"] == "op"], text[text["kind"] == "annotation"]
    assert list(text.index[: len(ops)]) == list(ops.index)  # ops first, annotations last
    for part in (ops, annotations):
        host = numbers(part["self cpu (µs)"])
        assert host == sorted(host, reverse=True)
    # Shares of all self time (ops and annotations): they partition the profiled time, so they sum to 100.
    assert sum(numbers(text[PERCENT])) == pytest.approx(100, abs=0.05 * len(text))
    assert all(isinstance(v, str) for v in text.to_numpy().ravel())


def test_times_read_in_microseconds_with_separators(naive_cpu):
    api = rounded(naive_cpu.op_table)
    # Scaled so the longest op takes 12,345.6 µs whatever this machine's speed (a fast one runs the bmm in
    # under 1,000 µs): the separator is then there to see.
    times = ["self cpu (us)", "total cpu (us)"]
    api[times] = (api[times] * (12_345.6 / api["self cpu (us)"].max())).round(1)
    text = display_table(api, "ops", gpu=False, forwards=3)
    row = api.sort_values("self cpu (us)", ascending=False).iloc[0]
    shown = text[text["name"] == row["name"]].iloc[0]
    assert shown["self cpu (µs)"] == f"{row['self cpu (us)']:,.1f}" == "12,345.6"
    assert shown["calls"] == f"{row['calls']:,}"
    assert not [c for c in text.columns if "(us)" in c or "(ms)" in c]


def test_cpu_kernel_table_lists_the_compute_ops_the_cards_count(naive_cpu):
    summary = dict(naive_cpu.summary)
    assert naive_cpu.kernel_table.empty  # no GPU: the API's kernel table is empty
    table = compute_ops(rounded(naive_cpu.op_table), summary["per_forward_kernels"])
    text = display_table(table, "compute ops", gpu=False, forwards=summary["forwards"])
    # Naive attention on CPU: 2 bmm, the scale, the clone's copy, the fill and the softmax (the blog's 6).
    assert set(text["name"]) == {"aten::bmm", "aten::mul", "aten::copy_", "aten::masked_fill_", "aten::_softmax"}
    assert sum(numbers(text["per forward"])) == summary["kernels_per_forward"] == 6
    assert text.loc[text["name"] == "aten::bmm", "per forward"].iloc[0] == "2"


def test_per_forward_only_where_there_are_forwards(bert, naive_cpu):
    kernels = rounded(bert.kernel_table)
    assert kernels["per forward"].eq(0).all()  # an upload has no forwards: the API reads 0
    assert "per forward" not in display_table(kernels, "kernels", gpu=True, forwards=None)
    assert "per forward" not in display_table(kernels, "kernels", gpu=True, forwards=0)
    table = compute_ops(rounded(naive_cpu.op_table), naive_cpu.summary["per_forward_kernels"])
    assert "per forward" in display_table(table, "compute ops", gpu=False, forwards=3)
    assert "per forward" not in display_table(table, "compute ops", gpu=False, forwards=None)


def test_columns_that_hold_nothing_are_hidden_and_the_rest_kept(mha):
    api = rounded(mha.kernel_table)
    text = display_table(api, "kernels", gpu=True, forwards=None)
    for column in KERNEL_COLUMNS:
        values = [v for v in api[column].tolist() if v is not None and v == v and v != "" and v != 0]
        shown = column.replace("(us)", "(µs)") in text.columns
        assert shown == bool(values) or column == "per forward", column
    # Sorted by total time, the largest first, with each name's share of the table's time.
    totals = numbers(text["total (µs)"])
    assert totals == sorted(totals, reverse=True)
    plain = defaultdict(float)
    for e in raw_events(MHA):
        if e.get("ph") == "X" and e.get("cat") in GPU_WORK:
            plain[e["name"]] += e["dur"]
    top = max(plain, key=plain.get)
    assert text["name"].iloc[0] == top
    assert text[PERCENT].iloc[0] == f"{100 * plain[top] / sum(plain.values()):.1f}"


def test_steps_and_annotations_in_microseconds(mha):
    steps = display_table(rounded(mha.steps), "steps", gpu=True, forwards=None)
    plain = {e["name"]: e["dur"] for e in raw_events(MHA) if e.get("name", "").startswith("ProfilerStep#")}
    assert "cpu (µs)" in steps and "cpu (ms)" not in steps
    for _, row in steps.iterrows():
        assert row["cpu (µs)"] == f"{plain[row['step']]:,.1f}"
    assert list(steps["step"]) == sorted(plain, key=lambda n: int(n.split("#")[1]))  # time order kept
    annotations = display_table(rounded(mha.annotations), "annotations", gpu=True, forwards=None)
    assert "device (µs)" in annotations and not [c for c in annotations if "(ms)" in c]


def test_compare_keeps_every_run_in_microseconds(naive_cpu):
    rows = [
        dict(naive_cpu.summary),
        {"variant": "sdpa", "backend": "efficient", "device": "cpu", "error": "efficient: only on CUDA"},
        {"variant": "hub_flash", "backend": "auto", "device": "cpu", "error": "hub_flash: only on CUDA"},
    ]
    add_speedups(rows)
    text = display_table(compare_table(rows), "compare", gpu=False, forwards=None)
    assert list(text["run"]) == ["naive", "sdpa-efficient", "hub_flash"]
    assert text["what the trace revealed"].iloc[2] == "unavailable: hub_flash: only on CUDA"
    assert text["forward cpu (µs)"].iloc[0] == f"{naive_cpu.summary['forward_cpu_ms'] * 1000:,.1f}"
    assert text["kernels/forward"].iloc[0] == "6"  # a run's per-forward column stays: runs have forwards
    assert text["forward cpu (µs)"].iloc[2] == ""  # nothing measured: blank, never 0


def test_empty_tables_keep_a_shape_and_bad_kinds_are_refused():
    empty = pd.DataFrame(columns=OP_COLUMNS)
    shown = display_table(empty, "ops", gpu=False, forwards=None)
    assert list(shown.columns) == [c.replace("(us)", "(µs)") for c in OP_COLUMNS] and shown.empty
    assert display_table(pd.DataFrame(columns=KERNEL_COLUMNS), "kernels", gpu=False, forwards=None).empty
    with pytest.raises(ValueError, match="^kind: one of"):
        display_table(empty, "kernel", gpu=False, forwards=None)
    assert "kernels" in KINDS


def test_small_times_keep_their_digits():
    table = pd.DataFrame({"name": ["a", "b", "c"], "calls": [1, 2, 1234], "self cpu (us)": [0.032, 0.0, 38954.001]})
    text = display_table(table, "ops", gpu=False, forwards=None)
    assert list(text["self cpu (µs)"]) == ["38,954.0", "0.032", "0.0"]
    assert list(text["calls"]) == ["1,234", "1", "2"]
