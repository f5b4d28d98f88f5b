"""Each copy blamed on its real cause (issue 18, item 5): the copy table against a plain reading of the raw
events (correlation id -> launch -> enclosing ops on its thread), the `hidden_copy` and `gqa_copy` findings on
the real GPU traces and on small hand-written ones, and the app's own CPU runs."""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import pytest

from profiling import cause_walk, copy_causes
from profiling.insights import Evidence, Insight
from profiling.insights.copies import gqa_copy, gqa_heads, hidden_copy
from profiling.trace import load_trace, parse_trace
from profiling.windows import window_stats
from tests import reference
from tests.conftest import DATA

GPU = DATA / "gpu"
TRACES = (
    "b200_vllm_gpt-oss_eager_rank0",
    "h100_bert-small_sdpa-flash",
    "h100_nn-mha_fp32",
    "h100_owlv2_eager-attn",
    "h100_qwen1.5-0.5b_prefill",
    "mi300x_qwen1.5-0.5b_prefill",
    "mi300x_sglang_qwen3-8b_decode",
)
ITEMSIZE = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "bool": 1, "long int": 8, "long": 8, "int": 4}
# The ordered table, written out here by hand (collectives by name: c10d/nccl prefixes, all_reduce ...).
ORDER = [
    ("masked_fill", {"aten::masked_fill"}),
    ("contiguous", {"aten::contiguous"}),
    ("repeat_interleave", {"aten::repeat_interleave"}),
    ("cat", {"aten::cat", "aten::_cat", "aten::concat", "aten::concatenate"}),
    ("repeat", {"aten::repeat"}),
    ("index", {"aten::index", "aten::index_select", "aten::gather", "aten::index_put", "aten::index_put_"}),
    ("to", {"aten::to", "aten::_to_copy"}),
    ("sync", {"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero"}),
]
COLLECTIVE = re.compile(r"^(c10d::|nccl:)|all_?reduce|all_?gather|reduce_?scatter", re.IGNORECASE)


# --- the plain reading ---------------------------------------------------------------------------------------


class Plain:
    """A trace read the slow, obvious way: ops nested by time per thread (tests.reference.nest), GPU work joined
    to its launch by correlation id, each copy's path of enclosing ops walked up by hand."""

    def __init__(self, path) -> None:
        events = reference.raw_events(path)
        host = [e for e in events if e["cat"] in ("cpu_op", "user_annotation", "python_function", *reference.LAUNCHES)]
        self.parent = reference.nest(host)
        self.by_id = {id(e): e for e in host}
        self.launch = {}
        for e in host:
            if e["cat"] in reference.LAUNCHES and "correlation" in e.get("args", {}):
                self.launch.setdefault(e["args"]["correlation"], e)
        self.gpu = [e for e in events if e["cat"] in reference.GPU]
        self.ops = [e for e in host if e["cat"] == "cpu_op"]

    def path(self, e: dict) -> list[dict]:
        """`e` and every event around it, innermost first."""
        out = [e]
        while self.parent.get(id(out[-1])) is not None:
            out.append(self.by_id[self.parent[id(out[-1])]])
        return out

    def launched_under(self, g: dict) -> list[dict]:
        launch = self.launch.get(g.get("args", {}).get("correlation"))
        return self.path(launch)[1:] if launch else []

    def copies(self) -> list[dict]:
        """Per copy: its event, the path the cause is read from, bytes and GPU µs."""
        is_copy = {"aten::clone", "aten::copy_"}
        roots = {
            id(o): {"event": o, "path": self.path(o), "memcpy_bytes": [], "gpu_us": 0.0}
            for o in self.ops
            if o["name"] in is_copy and not any(a["name"] in is_copy for a in self.path(o)[1:])
        }
        orphans = []
        for g in self.gpu:
            around = self.launched_under(g)
            copies = [a for a in around if a["cat"] == "cpu_op" and a["name"] in is_copy]
            if copies and id(copies[-1]) in roots:
                root = roots[id(copies[-1])]
                root["gpu_us"] += g["dur"]
                if g["name"].startswith("Memcpy"):
                    root["memcpy_bytes"].append(g["args"]["bytes"])
            elif g["name"].startswith("Memcpy"):
                orphans.append({"event": g, "path": around, "bytes": g["args"]["bytes"], "gpu_us": g["dur"]})
        out = []
        for root in roots.values():
            args = root["event"].get("args", {})
            dims = args.get("Input Dims")
            if root["memcpy_bytes"]:
                root["bytes"] = sum(root["memcpy_bytes"])
            elif dims and dims[0] == []:
                continue  # a 0-dim conversion: metadata work
            else:
                size = ITEMSIZE[args["Input type"][0]]
                for d in dims[0]:
                    size *= d
                root["bytes"] = size
            out.append(root)
        return out + orphans


def plain_cause(path: list[dict]) -> str:
    names = [e["name"] for e in path if e["cat"] in ("cpu_op", "user_annotation")]
    for cause, ops in ORDER:
        if ops & set(names):
            return cause
    if any(COLLECTIVE.search(n) for n in names):
        return "collective"
    ops = [e["name"] for e in path if e["cat"] == "cpu_op"]
    return f"other ({ops[-1]})" if ops else "other"


@pytest.fixture(scope="module")
def real():
    """Per trace: the trace, its copy table, its plain reading, and the two findings on the whole trace."""
    out = {}
    for name in TRACES:
        path = GPU / f"{name}.json.gz"
        trace = load_trace(path)
        ev = Evidence(trace, window_stats(trace, None), trace.kernels)
        out[name] = {
            "trace": trace,
            "table": copy_causes.copy_table(trace),
            "plain": Plain(path),
            "hidden": hidden_copy(ev),
            "gqa": gqa_copy(ev),
            "ev": ev,
        }
    return out


# --- the real traces -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TRACES)
def test_every_copy_cause_and_byte_matches_the_plain_reading(real, name):
    table, plain = real[name]["table"], real[name]["plain"].copies()
    expected = Counter(plain_cause(c["path"]) for c in plain)
    assert Counter(table["cause"]) == expected
    assert len(table) == len(plain)
    assert table["bytes"].sum() == pytest.approx(sum(c["bytes"] for c in plain))
    assert table["gpu_us"].sum() == pytest.approx(sum(c["gpu_us"] for c in plain))
    groups = copy_causes.group_by_cause(table)
    for cause, count in expected.items():  # the grouping's sums are plain sums of its copies
        mine = [c for c in plain if plain_cause(c["path"]) == cause]
        assert groups.loc[cause, "count"] == count
        assert groups.loc[cause, "bytes"] == pytest.approx(sum(c["bytes"] for c in mine))


def test_b200_all_reduce_copies_are_collective_never_masked_fill(real):
    plain = real["b200_vllm_gpt-oss_eager_rank0"]["plain"]
    dtod = [g for g in plain.gpu if g["name"].startswith("Memcpy DtoD")]
    under = [g for g in dtod if "vllm::all_reduce" in {a["name"] for a in plain.launched_under(g)}]
    assert len(under) == len(dtod) == 146
    launchers = {plain.launched_under(g)[0]["name"] for g in under}
    assert launchers == {"aten::copy_"}
    table = real["b200_vllm_gpt-oss_eager_rank0"]["table"]
    mine = table[table["copy"].str.startswith("Memcpy DtoD")]
    assert set(mine["cause"]) == {"collective"} and set(mine["launching_op"]) == {"aten::copy_"}
    assert len(mine) == 146 and mine["bytes"].sum() == sum(g["args"]["bytes"] for g in under)
    assert 735 * 2**20 < mine["bytes"].sum() < 737 * 2**20  # the README's ~736 MiB

    hidden = real["b200_vllm_gpt-oss_eager_rank0"]["hidden"]
    collective = hidden.evidence["causes"]["collective"]
    assert collective["count"] == 146 and collective["cause_op"] == "vllm::all_reduce"
    assert collective["gpu_us"] == pytest.approx(sum(g["dur"] for g in under))
    assert "masked_fill" not in hidden.detail and "masked_fill" not in hidden.evidence["causes"]
    assert hidden.detail.startswith("Memcpy DtoD (Device -> Device) 146x in the trace")


def test_hidden_copy_share_is_the_copies_gpu_time(real):
    for name in ("b200_vllm_gpt-oss_eager_rank0", "h100_qwen1.5-0.5b_prefill", "h100_owlv2_eager-attn"):
        plain = real[name]["plain"]
        copies = [c for c in plain.copies() if plain_cause(c["path"]) != "sync"]
        total = sum(g["dur"] for g in plain.gpu)
        share = 100 * sum(c["gpu_us"] for c in copies) / total
        assert real[name]["hidden"].gpu_time_percent == pytest.approx(share)
        assert real[name]["hidden"].evidence["bytes_per_forward"] == pytest.approx(sum(c["bytes"] for c in copies))


@pytest.mark.parametrize("name", ["h100_qwen1.5-0.5b_prefill", "mi300x_qwen1.5-0.5b_prefill"])
def test_qwen_clones_are_contiguous_inside_sdpa_attention_forward(real, name):
    plain = real[name]["plain"]
    clones = [o for o in plain.ops if o["name"] == "aten::clone"]
    inside = [
        o
        for o in clones
        if plain.path(o)[1]["name"] == "aten::contiguous"
        and any("sdpa_attention_forward" in a["name"] for a in plain.path(o))
    ]
    assert len(inside) == len(clones) == 96
    assert {o["args"]["Input type"][0] for o in inside} == {"c10::BFloat16"}
    size = sum(2 * math.prod(o["args"]["Input Dims"][0]) for o in inside)
    assert 1.6 * 2**30 < size < 1.7 * 2**30  # the README's ~1.6 GiB
    table = real[name]["table"]
    contiguous = table[table["cause"] == "contiguous"]
    assert len(contiguous) == 96 and set(contiguous["copy"]) == {"aten::clone"}
    assert contiguous["bytes"].sum() == size
    hidden = real[name]["hidden"]
    assert hidden.evidence["causes"]["contiguous"]["count"] == 96
    assert "masked_fill" not in hidden.detail and "masked_fill" not in set(table["cause"])


@pytest.mark.parametrize("name", ["h100_qwen1.5-0.5b_prefill", "mi300x_qwen1.5-0.5b_prefill"])
def test_the_one_byte_copy_is_an_item_sync_not_a_hidden_copy(real, name):
    plain = real[name]["plain"]
    (memcpy,) = [g for g in plain.gpu if g["name"].startswith("Memcpy")]
    assert memcpy["args"]["bytes"] == 1
    assert "aten::item" in {a["name"] for a in plain.launched_under(memcpy)}
    table = real[name]["table"]
    (row,) = table[table["kind"] == "memcpy"].itertuples()
    assert (row.cause, row.bytes, row.launching_op) == ("sync", 1, "aten::_local_scalar_dense")
    hidden = real[name]["hidden"]
    assert "sync" not in hidden.evidence["causes"] and hidden.evidence["syncs_not_counted"] == 1
    assert all(group["bytes"] > 1 for group in hidden.evidence["causes"].values())


def test_nn_mha_copies_are_contiguous_with_no_masked_fill_advice(real):
    plain = real["h100_nn-mha_fp32"]["plain"]
    clones = [o for o in plain.ops if o["name"] == "aten::clone"]
    assert {plain.path(o)[1]["name"] for o in clones} == {"aten::contiguous"}
    hidden = real["h100_nn-mha_fp32"]["hidden"]
    assert set(hidden.evidence["causes"]) == {"contiguous"}
    assert hidden.evidence["causes"]["contiguous"]["count"] == len(clones) == 3
    assert "masked_fill" not in hidden.detail


def test_owlv2_masked_fill_is_the_real_out_of_place_masked_fill(real):
    plain = real["h100_owlv2_eager-attn"]["plain"]
    dtod = [g for g in plain.gpu if g["name"].startswith("Memcpy DtoD")]
    assert all("aten::masked_fill" in {a["name"] for a in plain.launched_under(g)} for g in dtod)
    assert len(dtod) == 5 and sum(g["args"]["bytes"] for g in dtod) == 250
    hidden = real["h100_owlv2_eager-attn"]["hidden"]
    masked = hidden.evidence["causes"]["masked_fill"]
    assert (masked["count"], masked["bytes"], masked["copy"]) == (5, 250, "Memcpy DtoD (Device -> Device)")
    pageable = [g for g in plain.gpu if "Pageable" in g["name"]]
    assert hidden.evidence["causes"]["to"]["pageable"] == len(pageable) == 80
    assert "pin_memory()" in hidden.detail and "non_blocking=True" in hidden.detail


def _plain_heads(plain: Plain) -> set[tuple[int, int]]:
    """(Q heads, K heads) of every SDPA op, from Input Dims ([batch, heads, seq, head_dim])."""
    return {
        (o["args"]["Input Dims"][0][-3], o["args"]["Input Dims"][1][-3])
        for o in plain.ops
        if o["name"] == "aten::scaled_dot_product_attention"
    }


def test_no_gqa_finding_where_the_trace_shows_no_fewer_kv_heads_or_no_layout_copy(real):
    for name in TRACES:
        assert real[name]["gqa"] is None, name
    for name in ("h100_qwen1.5-0.5b_prefill", "mi300x_qwen1.5-0.5b_prefill", "h100_bert-small_sdpa-flash"):
        assert _plain_heads(real[name]["plain"]) in ({(16, 16)}, {(8, 8)})  # Qwen1.5-0.5B: no GQA
        assert gqa_heads(real[name]["ev"]) is None
    # vLLM's attention op shows 8 query heads and 1 K/V head on this rank, and reads the shared head in place.
    b200 = real["b200_vllm_gpt-oss_eager_rank0"]
    ops = [o for o in b200["plain"].ops if o["name"] == "vllm::unified_attention_with_output"]
    assert {(o["args"]["Input Dims"][0][-2], o["args"]["Input Dims"][1][-2]) for o in ops} == {(8, 1)}
    assert gqa_heads(b200["ev"]) == {"source": "vllm::unified_attention_with_output", "heads": 8, "kv_heads": 1}
    assert not set(copy_causes.LAYOUT_CAUSES) & set(b200["table"]["cause"])


def test_worst_copy_is_findable_in_perfetto(real):
    qwen = real["h100_qwen1.5-0.5b_prefill"]
    plain = qwen["plain"]
    worst = max((c for c in plain.copies() if plain_cause(c["path"]) != "sync"), key=lambda c: c["gpu_us"])
    hidden = qwen["hidden"]
    first_gpu = min(
        g["ts"] for g in plain.gpu if worst["event"] in plain.launched_under(g) or g is worst["event"]
    )  # its GPU work's start, as the file writes it (absolute µs)
    assert hidden.evidence["ts_us"] == pytest.approx(first_gpu, abs=1e-3)
    step = [a["name"] for a in plain.path(worst["event"]) if a["name"].startswith("ProfilerStep#")]
    assert hidden.evidence["step"] == step[0]
    json.dumps(hidden.evidence, allow_nan=False)


# --- hand-written traces: each cause present and absent ------------------------------------------------------


def op(name: str, ts: float, dur: float, dims: list | None = None, types: list | None = None, **args) -> dict:
    event = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": dict(args)}
    if dims is not None:
        event["args"].update({"Input Dims": dims, "Input type": types or ["float"] * len(dims)})
    return event


def copy_under(*outer: str, memcpy: str | None = None, size: int = 64, with_copy: bool = True) -> list[dict]:
    """Ops nested in the order given (outermost first), then a clone -> copy_ (unless `with_copy` is False); with
    `memcpy`, the innermost op launches that memcpy of `size` bytes."""
    events, ts, dur = [], 0.0, 1000.0
    for name in outer:
        events.append(op(name, ts, dur, [[4, 4]]))
        ts, dur = ts + 1, dur - 2
    if with_copy:
        events += [op("aten::clone", ts, dur, [[4, 4]]), op("aten::copy_", ts + 1, dur - 2, [[4, 4], [4, 4]])]
        ts, dur = ts + 2, dur - 4
    if memcpy:
        launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": ts + 1}
        events.append(launch | {"dur": 1, "args": {"correlation": 5}})
        args = {"correlation": 5, "bytes": size, "device": 0, "stream": 7}
        events.append(
            {"ph": "X", "cat": "gpu_memcpy", "name": memcpy, "pid": 0, "tid": 7, "ts": 200, "dur": 3, "args": args}
        )
    return events


def table_of(events: list[dict]):
    return copy_causes.copy_table(parse_trace(json.dumps({"traceEvents": events}).encode()))


def evidence_of(events: list[dict], spec=None) -> Evidence:
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    return Evidence(trace, window_stats(trace, None), trace.kernels, spec)


@pytest.mark.parametrize(
    ("outer", "cause"),
    [
        (["aten::masked_fill"], "masked_fill"),
        (["aten::contiguous"], "contiguous"),
        (["aten::repeat_interleave"], "repeat_interleave"),
        (["aten::cat"], "cat"),
        (["aten::repeat"], "repeat"),
        (["aten::index_select"], "index"),
        (["aten::to", "aten::_to_copy"], "to"),
        (["vllm::all_reduce"], "collective"),
        (["c10d::allreduce_"], "collective"),
        (["nccl:all_gather"], "collective"),
        # Order: the first cause of the table wins wherever it sits on the path.
        (["aten::masked_fill", "aten::contiguous"], "masked_fill"),
        (["aten::index", "aten::to", "aten::_to_copy"], "index"),
        (["aten::linear"], "other (aten::linear)"),  # absent: no cause on the path
        (["aten::masked_fill_"], "other (aten::masked_fill_)"),  # in place: no clone of its own
        ([], "other (aten::clone)"),
    ],
)
def test_each_cause_present_and_absent(outer, cause):
    table = table_of(copy_under(*outer))
    assert list(table["cause"]) == [cause] and list(table["bytes"]) == [64]


def test_a_memcpy_its_copy_op_launched_is_one_copy_with_the_memcpy_bytes():
    table = table_of(copy_under("aten::to", "aten::_to_copy", memcpy="Memcpy HtoD (Pageable -> Device)", size=96))
    assert len(table) == 1
    (row,) = table.itertuples()
    assert (row.cause, row.bytes, row.gpu_us, row.copy) == ("to", 96, 3, "Memcpy HtoD (Pageable -> Device)")
    assert row.pageable and row.launching_op == "aten::copy_"
    finding = hidden_copy(evidence_of(copy_under("aten::to", memcpy="Memcpy HtoD (Pageable -> Device)")))
    assert "pin_memory()" in finding.detail and finding.gpu_time_percent == 100
    pinned = hidden_copy(evidence_of(copy_under("aten::to", memcpy="Memcpy HtoD (Pinned -> Device)")))
    assert "pin_memory" not in pinned.detail


def test_a_sync_memcpy_with_no_copy_op_is_a_sync_and_no_hidden_copy():
    events = copy_under("aten::item", "aten::_local_scalar_dense", memcpy="Memcpy DtoH (Device -> Pinned)", size=1)
    events = [e for e in events if e["name"] not in ("aten::clone", "aten::copy_")]
    table = table_of(events)
    assert list(table["cause"]) == ["sync"] and list(table["kind"]) == ["memcpy"]
    assert hidden_copy(evidence_of(events)) is None


def test_a_memcpy_no_op_launched_is_other():
    table = table_of(copy_under(memcpy="Memcpy DtoD (Device -> Device)", with_copy=False))
    assert list(table["cause"]) == ["other (no launching op)"]


def test_a_scalar_conversion_is_no_copy_unless_it_moved_through_a_memcpy():
    events = [op("aten::to", 0, 10, [[]]), op("aten::_to_copy", 1, 8, [[]]), op("aten::copy_", 2, 6, [[], []])]
    assert table_of(events).empty
    assert hidden_copy(evidence_of(events)) is None


def test_a_size_the_trace_does_not_give_is_unknown_never_zero():
    bad = [op("aten::masked_fill", 0, 100, [[4, 4]]), op("aten::clone", 1, 98, [["a", 2]])]
    good = [op("aten::masked_fill", 200, 100, [[4, 4]]), op("aten::clone", 201, 98, [[4, 4]])]
    finding = hidden_copy(evidence_of(bad + good))
    assert finding.evidence["bytes_per_forward"] == 64 and finding.evidence["note"].startswith("1 copy(ies) left out")
    assert "64 B (and 1 of unknown size)" in finding.detail
    shapeless = [{k: v for k, v in e.items() if k != "args"} for e in bad]  # recorded without record_shapes
    finding = hidden_copy(evidence_of(shapeless))
    assert (
        "of a size the trace does not give" in finding.detail
        and finding.evidence["causes"]["masked_fill"]["bytes"] != 0
    )
    json.dumps(Insight("hidden_copy", finding.title, finding.detail, finding.evidence).record(), allow_nan=False)


def test_expand_then_reshape_needs_the_broadcast():
    def events(expanded: list[int]) -> list[dict]:
        return [
            op("aten::expand", 0, 5, [expanded, [], []]),
            op("aten::reshape", 10, 50, [[1, 2, 3, 8, 4], []]),
            op("aten::clone", 11, 40, [[1, 2, 3, 8, 4], []]),
            op("aten::copy_", 12, 30, [[1, 2, 3, 8, 4], [1, 2, 3, 8, 4], []]),
        ]

    assert list(table_of(events([1, 2, 1, 8, 4]))["cause"]) == ["expand_reshape"]  # GQA's repeat_kv
    assert list(table_of(events([1, 2, 3, 8, 4]))["cause"]) == ["other (aten::reshape)"]  # no broadcast
    assert list(table_of(events([2, 1, 8, 4]))["cause"]) == ["other (aten::reshape)"]  # another tensor
    assert list(table_of(events([1, 2, 1, 8, 4])[1:])["cause"]) == ["other (aten::reshape)"]  # no expand


def test_a_cause_beyond_the_walk_is_not_seen_and_costs_no_more():
    deep = copy_under("aten::masked_fill", *(["aten::linear"] * (cause_walk.MAX_WALK + 5)))
    assert list(table_of(deep)["cause"]) == ["other (aten::linear)"]


def _sdpa(q_heads: int, kv_heads: int) -> dict:
    dims = [[1, q_heads, 8, 4], [1, kv_heads, 8, 4], [1, kv_heads, 8, 4], []]
    return op("aten::scaled_dot_product_attention", 3000, 50, dims)


def test_gqa_copy_needs_fewer_kv_heads_and_a_layout_copy():
    layout = copy_under("aten::repeat_interleave", memcpy="Memcpy DtoD (Device -> Device)")
    found = gqa_copy(evidence_of([*layout, _sdpa(4, 2)]))
    assert found.evidence["callers"] == ["aten::repeat_interleave"] and found.evidence["kv_heads"] == 2
    assert "CPU flash" not in found.detail and found.gpu_time_percent == 100  # a GPU trace: no CPU advice
    assert gqa_copy(evidence_of([*layout, _sdpa(4, 4)])) is None  # no fewer heads
    assert gqa_copy(evidence_of(layout)) is None  # no attention op at all
    assert gqa_copy(evidence_of([*copy_under("aten::linear"), _sdpa(4, 2)])) is None  # no layout copy
    # Where gqa_copy tells the layout copies, hidden_copy does not tell them again.
    assert hidden_copy(evidence_of([*layout, _sdpa(4, 2)])) is None
    assert hidden_copy(evidence_of(layout)).evidence["causes"]["repeat_interleave"]["count"] == 1


# --- the app's own CPU runs ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from attention import AttentionSpec
    from profiling.pipeline import profile_attention

    out = tmp_path_factory.mktemp("copies")
    small = dict(batch=1, heads=4, head_dim=32, seq_len=64, device="cpu")
    specs = {
        "naive": AttentionSpec(variant="naive", **small),
        "inplace": AttentionSpec(variant="inplace", **small),
        "naive-gqa": AttentionSpec(variant="naive", kv_heads=2, **small),
        "flash-gqa": AttentionSpec(variant="sdpa", backend="flash", kv_heads=2, **small),
    }
    return {name: profile_attention(spec, out) for name, spec in specs.items()}


def rules(result) -> dict:
    return {i.rule: i for i in result.insights}


def test_cpu_runs_keep_their_lessons(runs):
    naive = rules(runs["naive"])["hidden_copy"]
    assert naive.detail.startswith("aten::clone 1x per forward copies 64.0 KiB, caused by aten::masked_fill")
    assert naive.evidence["bytes_per_forward"] == 1 * 4 * 64 * 64 * 4 and naive.gpu_time_percent is None
    assert "masked_fill_" in naive.detail
    assert "hidden_copy" not in rules(runs["inplace"])
    gqa = rules(runs["naive-gqa"])
    assert gqa["gqa_copy"].evidence["bytes_per_forward"] == 2 * 1 * 4 * 64 * 32 * 4  # K and V for 4 heads
    assert gqa["gqa_copy"].evidence["callers"] == ["aten::reshape"] and "CPU flash kernel" in gqa["gqa_copy"].detail
    assert set(gqa["hidden_copy"].evidence["causes"]) == {"masked_fill"}  # the K/V copies are told once
    assert "gqa_copy" not in rules(runs["flash-gqa"]) and "hidden_copy" not in rules(runs["flash-gqa"])
