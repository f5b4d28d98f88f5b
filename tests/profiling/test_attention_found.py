"""Attention found on any trace (issue 18, item 4): the summary keys and the attention rules.

Every number is checked against a plain loop over the raw JSON events (`json.load(gzip.open(path))`):
fused attention by kernel-name substrings, unfused attention by a walk of each thread's ops in time
order that nests them with a stack and takes the launches inside a match's time span. The README's
reference table (tests/data/gpu/README.md) gives the kinds and shares, within its +-3 points.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from functools import reduce
from operator import mul
from typing import Any

import numpy as np
import pytest

from profiling.analysis import analyze
from profiling.attention_found import attention_found, attention_keys, nearest
from profiling.trace import load_trace, parse_trace
from tests.conftest import DATA

GPU = DATA / "gpu"
# file: (attention kind, attention % of kernel time) from the README's reference table.
README = {
    "h100_bert-small_sdpa-flash": ("fused", 12.2),
    "h100_qwen1.5-0.5b_prefill": ("fused", 8.5),
    "b200_vllm_gpt-oss_eager_rank0": ("fused", 4.5),
    "mi300x_qwen1.5-0.5b_prefill": ("fused", 13.2),
    "mi300x_sglang_qwen3-8b_decode": ("fused", 21.8),
    "h100_nn-mha_fp32": ("unfused", None),  # the table gives the softmax alone (3.8); the total is checked by loop
    "h100_owlv2_eager-attn": ("unfused", 89.0),
}
TOLERANCE = 3.0  # the README's, for attention
# The README's fused attention: FlashAttention, fmha, AOTriton attn_fwd, paged attention (not the KV-cache
# writes `reshape_and_cache_flash_kernel` and `create_flashinfer_kv_indices`, nor a quantizer named after fmha).
FUSED_NAMES = ("flash_fwd", "fmhaSm", "fmha_cutlass", "attn_fwd", "paged_attention")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


# --- the plain loop ------------------------------------------------------------------------------


def raw_events(name: str) -> list[dict]:
    with gzip.open(GPU / f"{name}.json.gz") as f:
        return json.load(f)["traceEvents"]


def kernel_us(events: list[dict]) -> float:
    return sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") == "kernel")


def fused_percent(events: list[dict]) -> float:
    fused = sum(
        e["dur"]
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "kernel" and any(n in e["name"] for n in FUSED_NAMES)
    )
    return 100 * fused / kernel_us(events)


# What these traces hold between a match's GEMMs and its softmax (views, a cast, dropout, scaling).
BETWEEN = {"aten::view", "aten::reshape", "aten::_unsafe_view", "aten::to", "aten::dropout", "aten::mul"}
BETWEEN |= {"aten::div", "aten::add", "aten::masked_fill", "aten::transpose", "aten::expand", "aten::contiguous"}
GEMMS = {"aten::bmm", "aten::matmul", "aten::baddbmm", "aten::einsum"}
SOFTMAXES = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::_masked_softmax"}


def _scores_match(scores: list, second: list) -> bool:
    numel = reduce(mul, scores, 1) == reduce(mul, second, 1)
    return scores == second or (scores[-2:] == second[-2:] and numel)


def unfused_reference(events: list[dict]) -> dict[str, Any]:
    """Walk each thread's ops and annotations in time order (Python frames are not ops), nest them with a
    stack, and scan each op's children for GEMM, softmax, GEMM; a match's GPU work is what the launches
    on its thread, inside its time span, caused."""
    lanes: dict[tuple, list[dict]] = defaultdict(list)
    launches: dict[tuple, list[dict]] = defaultdict(list)
    gpu: dict[Any, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") in ("cpu_op", "user_annotation"):
            lanes[(e["pid"], e["tid"])].append(e)
        elif e.get("cat") in ("cuda_runtime", "cuda_driver"):
            launches[(e["pid"], e["tid"])].append(e)
        elif e.get("cat") in GPU_CATEGORIES:
            gpu[e["args"]["correlation"]].append(e)
    matches, kernel, activity, softmax_kernel, softmax_activity, shapes = 0, 0.0, 0.0, 0.0, 0.0, set()
    for lane, ops in lanes.items():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        children: dict[int, list[dict]] = defaultdict(list)
        stack: list[dict] = []
        for op in ops:
            while stack and (op["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]):
                stack.pop()
            children[id(stack[-1]) if stack else 0].append(op)
            stack.append(op)
        for siblings in children.values():
            for i, op in enumerate(siblings):
                if op["name"] not in SOFTMAXES:
                    continue
                j, k = i - 1, i + 1
                while j >= 0 and siblings[j]["name"] in BETWEEN:
                    j -= 1
                while k < len(siblings) and siblings[k]["name"] in BETWEEN:
                    k += 1
                if j < 0 or k == len(siblings) or {siblings[j]["name"], siblings[k]["name"]} - GEMMS:
                    continue
                first, second = siblings[j]["args"]["Input Dims"][0], siblings[k]["args"]["Input Dims"][0]
                scores = op["args"]["Input Dims"][0]
                if len(first) < 3 or not _scores_match(scores, second):
                    continue
                matches += 1
                shapes.add((tuple(first), tuple(scores)))
                for start, end, is_softmax in (
                    (siblings[j]["ts"], siblings[k]["ts"] + siblings[k]["dur"], False),
                    (op["ts"], op["ts"] + op["dur"], True),
                ):
                    ids = {e["args"]["correlation"] for e in launches[lane] if start <= e["ts"] < end}
                    work = [g for c in ids for g in gpu[c]]
                    k_us = sum(g["dur"] for g in work if g["cat"] == "kernel")
                    a_us = sum(g["dur"] for g in work)
                    if is_softmax:
                        softmax_kernel, softmax_activity = softmax_kernel + k_us, softmax_activity + a_us
                    else:
                        kernel, activity = kernel + k_us, activity + a_us
    all_activity = sum(g["dur"] for group in gpu.values() for g in group)
    total_kernel = kernel_us(events)
    return {
        "matches": matches,
        "shapes": shapes,
        "kernel_percent": 100 * kernel / total_kernel,
        "gpu_percent": 100 * activity / all_activity,
        "softmax_kernel_percent": 100 * softmax_kernel / total_kernel,
        "softmax_gpu_percent": 100 * softmax_activity / all_activity,
    }


@pytest.fixture(scope="module")
def analyses() -> dict:
    """Each real trace, read and analysed once, with its raw events and the plain loop's unfused attention."""
    out = {}
    for name in README:
        trace, events = load_trace(GPU / f"{name}.json.gz"), raw_events(name)
        out[name] = (trace, analyze(trace), events, unfused_reference(events))
    return out


def rules(analysis) -> dict:
    return {i.rule: i for i in analysis.insights}


# --- the summary keys on the real traces -----------------------------------------------------------


@pytest.mark.parametrize("name", list(README))
def test_attention_keys_match_the_readme_and_the_loop(analyses, name):
    trace, _, events, unfused = analyses[name]
    kind, percent = README[name]
    keys = attention_keys(trace)
    assert keys["attention_kind"] == kind
    reference = fused_percent(events) if kind == "fused" else unfused["kernel_percent"]
    assert keys["attention_time_percent"] == pytest.approx(reference, abs=0.01)
    assert keys["attention_time_us"] == pytest.approx(reference / 100 * kernel_us(events), rel=1e-6)
    if percent is not None:
        assert abs(keys["attention_time_percent"] - percent) <= TOLERANCE


def test_no_kernels_no_attention_keys():
    trace = load_trace(DATA / "cpu_only.json.gz")
    assert attention_keys(trace) == {"attention_time_us": None, "attention_time_percent": None, "attention_kind": None}


def test_a_gpu_trace_without_attention_says_none():
    trace = load_trace(DATA / "sampled_training_rank0.json.gz")  # a softmax, but no GEMM around it
    assert attention_keys(trace) == {"attention_time_us": 0.0, "attention_time_percent": 0.0, "attention_kind": "none"}


# --- unfused_attention on the real traces ----------------------------------------------------------


@pytest.mark.parametrize("name", ["h100_owlv2_eager-attn", "h100_nn-mha_fp32"])
def test_unfused_attention_fires_with_its_evidence(analyses, name):
    _, analysis, _, reference = analyses[name]
    finding = rules(analysis)["unfused_attention"]
    assert finding.evidence["matches"] == reference["matches"]
    assert finding.gpu_time_percent == pytest.approx(reference["gpu_percent"], abs=0.01)
    assert finding.evidence["softmax_gpu_time_percent"] == pytest.approx(reference["softmax_gpu_percent"], abs=0.01)
    shapes = {(tuple(s["first_gemm_input"]), tuple(s["scores"])) for s in finding.evidence["shapes"]}
    assert shapes == reference["shapes"]
    assert finding.evidence["step"].startswith("ProfilerStep#") and finding.evidence["ts_us"] > 0
    json.dumps(finding.record(), allow_nan=False)


def test_owlv2_softmax_and_gemms_are_the_readmes_shares(analyses):
    reference = analyses["h100_owlv2_eager-attn"][3]
    assert abs(reference["softmax_kernel_percent"] - 47.6) <= 0.1  # the README's "softmax alone"
    finding = rules(analyses["h100_owlv2_eager-attn"][1])["unfused_attention"]
    assert finding.evidence["shapes"][0] == {"first_gemm_input": [16, 5185, 64], "scores": [16, 5185, 5185]}
    assert finding.evidence["need_weights"] is False
    assert "scaled_dot_product_attention" in finding.detail


def test_nn_mha_need_weights_is_the_fix(analyses):
    _, analysis, events, reference = analyses["h100_nn-mha_fp32"]
    mha = [e for e in events if e.get("name") == "aten::_native_multi_head_attention"]
    assert mha and all(e["args"]["Concrete Inputs"][10] == "True" for e in mha)
    finding = rules(analysis)["unfused_attention"]
    assert finding.evidence["need_weights"] is True and "need_weights=False" in finding.detail
    assert abs(reference["softmax_kernel_percent"] - 3.8) <= 0.05  # the README's softmax alone


@pytest.mark.parametrize("name", ["h100_bert-small_sdpa-flash", "h100_qwen1.5-0.5b_prefill"])
def test_fused_traces_have_no_unfused_attention(analyses, name):
    assert "unfused_attention" not in rules(analyses[name][1])
    assert analyses[name][3]["matches"] == 0


# --- fused_attention on the real traces ------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n, (kind, _) in README.items() if kind == "fused"])
def test_fused_attention_names_its_family_and_share(analyses, name):
    _, analysis, events, _ = analyses[name]
    finding = rules(analysis)["fused_attention"]
    activity = sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES)
    fused = fused_percent(events) * kernel_us(events) / activity
    assert finding.gpu_time_percent == pytest.approx(fused, abs=0.01)
    assert finding.evidence["family"] and finding.evidence["meaning"]
    assert any(n in finding.evidence["kernel"] for n in FUSED_NAMES)
    has_steps = any(str(e.get("name", "")).startswith("ProfilerStep#") for e in events)
    # The step table's name for the launch's step: a ProfilerStep, or the plugin's step "0" without one.
    assert finding.evidence["step"].startswith("ProfilerStep#") if has_steps else finding.evidence["step"] == "0"


@pytest.mark.parametrize("name", ["h100_owlv2_eager-attn", "h100_nn-mha_fp32"])
def test_unfused_traces_have_no_fused_attention(analyses, name):
    assert "fused_attention" not in rules(analyses[name][1])


# --- synthetic traces ------------------------------------------------------------------------------


def _op(name: str, ts: float, dur: float, dims: list, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": 1,
        "tid": tid,
        "args": {"Input Dims": dims},
    }


def _launched(kernel: str, op: dict, correlation: int, dur: float) -> list[dict]:
    """A launch inside `op` and the kernel it caused."""
    at = op["ts"] + 1
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": at, "dur": 1, "pid": 1}
    launch.update(tid=op["tid"], args={"correlation": correlation})
    work = {"ph": "X", "cat": "kernel", "name": kernel, "ts": 1000 + 200 * correlation, "dur": dur, "pid": 0}
    work.update(tid=7, args={"correlation": correlation, "device": 0, "stream": 7})
    return [launch, work]


def attention_events(
    second_dims: list | None = None, between: str = "aten::mul", softmax_tid: int = 1, own_parent: bool = False
) -> list[dict]:
    """bmm, an op between, softmax, bmm (one kernel each: 100, 10, 50, 100 us) inside a step, then a linear
    (40 us): attention is 260 of 300 us. The knobs break one condition of a match each."""
    q, scores = [8, 128, 64], [8, 128, 128]
    ops = [
        _op("aten::bmm", 10, 10, [q, [8, 64, 128]]),
        _op(between, 25, 5, [scores, []]),
        _op("aten::softmax", 40, 10, [scores, [], []], tid=softmax_tid),
        _op("aten::bmm", 60, 10, [second_dims or scores, [8, 128, 64]]),
        _op("aten::linear", 80, 10, [[8, 128, 64], [64, 64]]),
    ]
    kernels = ("gemm_kernel", "mul_kernel", "softmax_warp_forward", "gemm_kernel", "gemm_kernel")
    events = [_op("ProfilerStep#1", 0, 100, [], cat="user_annotation")]
    if softmax_tid != 1:
        events.append(_op("ProfilerStep#1", 0, 100, [], tid=softmax_tid, cat="user_annotation"))
    if own_parent:  # the first GEMM inside an op of its own: no longer the softmax's sibling
        events.append(_op("aten::my_block", 9, 12, []))
    # A Python frame around the softmax is no parent: the match holds through it.
    events.append(_op("torch/nn/functional.py(1): softmax", 39, 12, [], tid=softmax_tid, cat="python_function"))
    for correlation, (op, kernel, dur) in enumerate(zip(ops, kernels, (100, 10, 50, 100, 40), strict=True), 1):
        events += [op, *_launched(kernel, op, correlation, dur)]
    return events


def analysed(events: list[dict]):
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    return trace, analyze(trace)


def test_synthetic_match_is_found_with_every_kernel_of_its_ops():
    trace, analysis = analysed(attention_events())
    assert attention_keys(trace) == {
        "attention_time_us": 260.0,
        "attention_time_percent": pytest.approx(100 * 260 / 300),
        "attention_kind": "unfused",
    }
    finding = rules(analysis)["unfused_attention"]
    assert finding.gpu_time_percent == pytest.approx(100 * 260 / 300)
    assert finding.evidence["softmax_us"] == 50 and finding.evidence["step"] == "ProfilerStep#1"
    assert finding.evidence["ops"] == ["aten::bmm", "aten::softmax", "aten::bmm"]


@pytest.mark.parametrize(
    "broken",
    [
        {"second_dims": [8, 128, 64]},  # the second GEMM does not read the scores
        {"between": "aten::layer_norm"},  # not elementwise
        {"softmax_tid": 2},  # the softmax on another thread
        {"own_parent": True},  # the first GEMM under another parent
    ],
)
def test_synthetic_match_is_absent_when_one_condition_breaks(broken):
    trace, analysis = analysed(attention_events(**broken))
    assert attention_keys(trace)["attention_kind"] == "none"
    assert "unfused_attention" not in rules(analysis)


def test_a_view_of_the_scores_is_their_shape():
    """nn.MultiheadAttention's second bmm reads the [batch, heads, q, k] probabilities as [batch * heads, q, k]."""
    events = attention_events(second_dims=[2, 4, 128, 128])
    for e in events:
        if e["name"] == "aten::softmax":
            e["args"]["Input Dims"][0] = [2, 4, 128, 128]
    assert attention_keys(analysed(events)[0])["attention_kind"] == "unfused"


def test_unfused_on_a_cpu_upload_has_no_gpu_share():
    events = [e for e in attention_events() if e["cat"] not in ("kernel", "cuda_runtime")]
    trace, analysis = analysed(events)
    assert attention_keys(trace)["attention_kind"] is None
    finding = rules(analysis)["unfused_attention"]
    assert finding.gpu_time_percent is None and finding.evidence["matches"] == 1


def test_synthetic_fused_kernel_present_and_absent():
    events = attention_events(between="aten::layer_norm")  # no match
    for e in events:
        if e["name"] == "softmax_warp_forward":
            e["name"] = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>(Flash_fwd_params)"
    trace, analysis = analysed(events)
    assert attention_keys(trace)["attention_kind"] == "fused"
    finding = rules(analysis)["fused_attention"]
    assert finding.evidence["family"] == "flash-attention" and finding.gpu_time_percent == pytest.approx(50 / 3)
    _, plain = analysed(attention_events(between="aten::layer_norm"))
    assert "fused_attention" not in rules(plain)


def test_fused_and_unfused_together_are_mixed_and_counted_once():
    """A fused kernel launched by an op of the match counts once, as fused."""
    events = attention_events()
    for e in events:
        if e["name"] == "mul_kernel":
            e["name"] = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>(Flash_fwd_params)"
    trace, _ = analysed(events)
    found = attention_found(trace)
    assert (found.fused_us, found.unfused_us) == (10.0, 250.0)
    assert attention_keys(trace)["attention_kind"] == "mixed"
    assert attention_keys(trace)["attention_time_us"] == 260.0


# --- the other attention rules stay silent without attention ---------------------------------------


def _causal_mask_ops(tid: int = 1) -> list[dict]:
    tril = _op("aten::tril", 200, 5, [[128, 128], []], tid=tid)
    return [tril, *_launched("void triu_tril_kernel<float>()", tril, 90, 5)]


def test_mask_rebuilt_needs_attention_synthetic():
    events = [_op("ProfilerStep#1", 0, 300, [], cat="user_annotation"), *_causal_mask_ops()]
    assert "mask_rebuilt" not in rules(analysed(events)[1])
    sdpa = _op("aten::scaled_dot_product_attention", 220, 5, [[1, 4, 128, 64]] * 3)
    assert "mask_rebuilt" in rules(analysed([*events, sdpa])[1])


def test_mask_rebuilt_needs_attention_on_a_real_trace():
    """A real trace with no attention, given a causal mask's ops: still no attention, so no mask finding."""
    with gzip.open(DATA / "a100_simple_add.json.gz") as f:
        document = json.load(f)
    events = document["traceEvents"]
    op = next(e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X")
    tril = {**op, "name": "aten::tril", "args": {"Input Dims": [[128, 128], []]}}
    document["traceEvents"] = [*events, tril]
    found = rules(analyze(parse_trace(json.dumps(document).encode())))
    assert "mask_rebuilt" not in found and "fused_attention" not in found and "unfused_attention" not in found
    sdpa = {**op, "name": "aten::scaled_dot_product_attention", "args": {"Input Dims": [[1, 4, 128, 64]] * 3}}
    document["traceEvents"] = [*events, tril, sdpa]
    assert "mask_rebuilt" in rules(analyze(parse_trace(json.dumps(document).encode())))  # the same, with attention


# --- the tree walk -------------------------------------------------------------------------------


def test_nearest_matches_a_walk_up_the_tree():
    rng = np.random.default_rng(0)
    parent = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, 500)])
    stop = rng.random(500) < 0.2
    for include_self in (False, True):
        expected = []
        for row in range(500):
            at = row if include_self else parent[row]
            while at >= 0 and not stop[at]:
                at = parent[at]
            expected.append(at)
        assert nearest(parent, stop, include_self).tolist() == expected


def test_found_once_per_trace(analyses):
    trace = analyses["h100_nn-mha_fp32"][0]
    assert attention_found(trace) is attention_found(trace)
