"""Each rule on a small hand-written trace: its evidence present (it fires, with the numbers put in the trace)
and absent (it is silent). Rules already covered this way elsewhere are listed in the report, not repeated:
hidden_copy, fp32_upcast, fused_attention, unfused_attention, blocking_sync, launch_bound, communication,
occupancy, and gqa_copy's upload branch (tests/profiling/test_copy_causes.py, test_precision.py,
test_attention_found.py, test_host_stalls.py, test_communication.py, test_occupancy_explained.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from attention import AttentionSpec
from profiling.insights import Evidence
from profiling.insights.attention import (
    backward_memory,
    decode_bound,
    dense_mask_backend,
    mask_rebuilt,
    safe_softmax,
    wrong_alignment,
)
from profiling.insights.copies import gqa_copy, hidden_copy
from profiling.insights.data_quality import impossible_values
from profiling.insights.host import first_call, no_kernels, overhead_bound, profiler_overhead
from profiling.summary import _first_call_keys
from profiling.trace import Trace, parse_trace
from profiling.windows import FORWARD, window_stats

SDPA = "aten::scaled_dot_product_attention"
QKV = [[1, 4, 8, 16]] * 3  # [batch, heads, seq, head_dim]: an attention op the rules recognise


# ---- builders ------------------------------------------------------------------------------------------------------


def op(name: str, ts: float, dur: float, dims: list | None = None, **args: Any) -> dict:
    """A host op on thread 1; `dims` become its Input Dims (float inputs), `args` its other args."""
    event = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": dict(args)}
    if dims is not None:
        event["args"].update({"Input Dims": dims, "Input type": ["float"] * len(dims)})
    return event


def annotation(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def launch(ts: float, corr: int, name: str = "cudaLaunchKernel") -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2} | {
        "args": {"correlation": corr}
    }


def kernel(name: str, ts: float, dur: float, corr: int, **args: Any) -> dict:
    args = {"correlation": corr, "device": 0, "stream": 7, **args}
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


def parsed(events: list[dict], **document: Any) -> Trace:
    return parse_trace(json.dumps({"traceEvents": events, **document}).encode())


def evidence(
    events: list[dict],
    spec: AttentionSpec | None = None,
    numbers: dict[str, Any] | None = None,
    window: str | None = None,
    **document: Any,
) -> Evidence:
    """The evidence a rule reads: over the whole trace (an upload), or over `window` annotations (our runs)."""
    trace = parsed(events, **document)
    device = spec.device if spec is not None else None
    return Evidence(trace, window_stats(trace, window, device), trace.kernels, spec, numbers or {})


def spec(**fields: Any) -> AttentionSpec:
    return AttentionSpec(**{"batch": 1, "heads": 2, "seq_len": 8, "head_dim": 4, "device": "cpu", **fields})


# ---- mask_rebuilt ----------------------------------------------------------------------------------------------------


def mask_ops(ts: float, tril: bool = True) -> list[dict]:
    """A causal mask built in the forward: ones, tril (launching a triu_tril kernel), where."""
    events = [op("aten::ones", ts, 5, [[]]), op("aten::where", ts + 30, 5, [[8, 8], [8, 8], []])]
    if tril:
        events += [
            op("aten::tril", ts + 10, 10, [[8, 8], []]),
            launch(ts + 12, int(ts) + 1),
            kernel("void at::native::triu_tril_kernel<float, int, false, 4, true>()", ts + 100, 5, int(ts) + 1),
        ]
    return events


def test_mask_rebuilt_present_counts_the_mask_ops_per_forward():
    """Two forwards of our run, each building the mask: one of each op and one tril kernel per forward."""
    events = [annotation(FORWARD, 0, 1000), annotation(FORWARD, 2000, 1000)]
    events += [*mask_ops(100), *mask_ops(2100)]
    found = mask_rebuilt(evidence(events, spec(), window=FORWARD))
    assert found is not None
    assert found.evidence["ops_per_forward"] == {"aten::ones": 1, "aten::where": 1, "aten::tril": 1}
    assert found.evidence["kernels_per_forward"] == 1
    assert "3 mask ops per forward" in found.detail


def test_mask_rebuilt_present_in_an_upload_with_attention():
    found = mask_rebuilt(evidence([*mask_ops(100), op(SDPA, 500, 50, QKV)]))
    assert found is not None and found.evidence["kernels_per_forward"] == 1
    assert found.evidence["ops_per_forward"]["aten::tril"] == 1


def test_mask_rebuilt_counts_neither_the_safe_softmax_guard_nor_nested_calls():
    """SDPA math's forward on CPU: the mask's where (which calls where again) and _safe_softmax's own where.
    One where builds the mask; the guard's where is safe_softmax's evidence."""
    inner_where = op("aten::where", 131, 2, [[8, 8], [8, 8], []])  # inside the mask's where (100 + 30, 5 µs)
    guard = [op("aten::_safe_softmax", 400, 50, [[1, 4, 8, 8]]), op("aten::where", 410, 5, [[1, 4, 8, 8]])]
    events = [annotation(FORWARD, 0, 1000), *mask_ops(100), inner_where, *guard]
    found = mask_rebuilt(evidence(events, spec(), window=FORWARD))
    assert found is not None
    assert found.evidence["ops_per_forward"] == {"aten::ones": 1, "aten::where": 1, "aten::tril": 1}


def test_mask_rebuilt_absent_without_tril_triu_or_their_kernel():
    """ones and where alone (a padding mask) are no causal mask rebuilt."""
    assert mask_rebuilt(evidence([*mask_ops(100, tril=False), op(SDPA, 500, 50, QKV)])) is None
    events = [annotation(FORWARD, 0, 1000), *mask_ops(100, tril=False)]
    assert mask_rebuilt(evidence(events, spec(), window=FORWARD)) is None


# ---- safe_softmax ----------------------------------------------------------------------------------------------------


def softmax_ops(name: str) -> list[dict]:
    return [
        op(name, 100, 50, [[1, 4, 8, 8]]),
        op("aten::isneginf", 101, 5, [[1, 4, 8, 8]]),
        op("aten::all", 110, 5, [[1, 4, 8, 8]]),
        op("aten::where", 120, 5, [[1, 4, 8, 1], [], [1, 4, 8, 8]]),
        op(SDPA, 300, 200, QKV),
    ]


def test_safe_softmax_present_counts_its_guard_ops():
    found = safe_softmax(evidence(softmax_ops("aten::_safe_softmax")))
    assert found is not None
    assert found.evidence == {"op": "aten::_safe_softmax", "guard_ops_per_forward": 3}


def test_safe_softmax_counts_only_the_guard_ops_under_it():
    """A mask's aten::where outside the softmax (mask_rebuilt's op) is no part of the softmax's guard."""
    found = safe_softmax(evidence([*softmax_ops("aten::_safe_softmax"), op("aten::where", 600, 5, [[8, 8], [], []])]))
    assert found is not None and found.evidence["guard_ops_per_forward"] == 3


def test_safe_softmax_absent_with_a_plain_softmax_or_without_attention():
    assert safe_softmax(evidence(softmax_ops("aten::softmax"))) is None
    without_attention = [e for e in softmax_ops("aten::_safe_softmax") if e["name"] != SDPA]
    assert safe_softmax(evidence(without_attention)) is None


# ---- overhead_bound --------------------------------------------------------------------------------------------------


def two_kernels(gap: float = 200) -> list[dict]:
    """Two 100 µs kernels `gap` µs apart."""
    return [
        launch(0, 1),
        kernel("k0", 10, 100, 1),
        launch(20, 2),
        kernel("k1", 110 + gap, 100, 2),
    ]


def test_overhead_bound_present_gives_the_span_busy_time_and_gap():
    found = overhead_bound(evidence(two_kernels()))
    assert found is not None and found.title == "GPU busy"
    assert found.evidence["span_ms"] == pytest.approx(0.4)  # 10 .. 410 µs
    assert found.evidence["busy_ms"] == pytest.approx(0.2)
    assert found.evidence["gap_ms"] == pytest.approx(0.2)
    assert found.detail.startswith("50% of the time")


def test_overhead_bound_our_run_compares_host_and_device_per_forward():
    """A 1 ms forward whose kernels span 0.3 ms: the host is the bottleneck."""
    events = [annotation(FORWARD, 0, 1000), *two_kernels(gap=100)]
    found = overhead_bound(evidence(events, window=FORWARD))
    assert found is not None and found.title.startswith("Overhead-bound")
    assert found.evidence["cpu_ms"] == pytest.approx(1.0) and found.evidence["device_ms"] == pytest.approx(0.3)
    assert found.evidence["gap_ms"] == pytest.approx(0.1)


def test_overhead_bound_absent_without_gpu_activity():
    assert overhead_bound(evidence([op("aten::mm", 0, 100, [[4, 4], [4, 4]])])) is None
    # Launches whose kernels the trace lost: still no GPU activity to measure.
    assert overhead_bound(evidence([launch(0, 1), launch(10, 2)])) is None


# ---- no_kernels ------------------------------------------------------------------------------------------------------


def test_no_kernels_present_counts_the_launch_calls():
    found = no_kernels(evidence([launch(0, 1), launch(10, 2), launch(20, 3, "cudaMemcpyAsync")]))
    assert found is not None and found.evidence == {"launch_calls": 3, "kernel_events": 0}
    # deviceProperties alone say a GPU was profiled.
    props = [{"id": 0, "name": "NVIDIA H100", "numSms": 132}]
    found = no_kernels(evidence([op("aten::mm", 0, 10)], deviceProperties=props))
    assert found is not None and found.evidence["launch_calls"] == 0


def test_no_kernels_absent_with_one_kernel_or_on_a_cpu_only_trace():
    assert no_kernels(evidence([launch(0, 1), kernel("k", 5, 3, 1), launch(10, 2)])) is None
    assert no_kernels(evidence([op("aten::mm", 0, 10, [[4, 4], [4, 4]])])) is None


# ---- profiler_overhead -----------------------------------------------------------------------------------------------


def cpu_forward(dur: float) -> list[dict]:
    return [annotation(FORWARD, 0, dur), op("aten::mm", 10, dur - 20, [[4, 4], [4, 4]])]


def test_profiler_overhead_present_just_over_the_threshold():
    """A 1.16 ms profiled forward against 1 ms unprofiled: x1.16, over the 1.15 notice."""
    found = profiler_overhead(evidence(cpu_forward(1160), numbers={"forward_unprofiled_ms": 1.0}, window=FORWARD))
    assert found is not None
    assert found.evidence["profiled_ms"] == pytest.approx(1.16) and found.evidence["unprofiled_ms"] == 1.0
    assert found.evidence["ratio"] == pytest.approx(1.16)


@pytest.mark.parametrize(
    ("events", "numbers"),
    [
        (cpu_forward(1140), {"forward_unprofiled_ms": 1.0}),  # x1.14: under the notice
        (cpu_forward(5000), {}),  # no unprofiled time (an upload)
        (cpu_forward(5000), {"forward_unprofiled_ms": 0.0}),  # no time to divide by
        ([*cpu_forward(5000), launch(20, 1), kernel("k", 30, 10, 1)], {"forward_unprofiled_ms": 1.0}),  # a GPU run
    ],
)
def test_profiler_overhead_absent(events, numbers):
    assert profiler_overhead(evidence(events, numbers=numbers, window=FORWARD)) is None


# ---- backward_memory -------------------------------------------------------------------------------------------------

# spec(): 1 x 2 heads x 8 queries x 8 keys x 4 bytes = 512 B of scores; an output of 1 x 2 x 8 x 4 x 4 = 256 B.
SCORES, OUTPUT = 512, 256


def test_backward_memory_present_compares_what_is_kept_with_one_score_matrix():
    found = backward_memory(evidence([], spec(mode="training"), {"saved_for_backward_bytes": OUTPUT + SCORES}))
    assert found is not None
    assert found.evidence == {
        "saved_for_backward_bytes": OUTPUT + SCORES,
        "output_bytes": OUTPUT,
        "score_matrix_bytes": SCORES,
        "ratio": 1.0,
    }
    assert "keeps the probabilities" in found.detail


def test_backward_memory_under_half_a_score_matrix_says_none_is_kept():
    """Just under KEPT_SCORES (0.5): the log-sum-exp only, as a fused kernel keeps."""
    found = backward_memory(evidence([], spec(mode="training"), {"saved_for_backward_bytes": OUTPUT + 255}))
    assert found is not None and found.evidence["ratio"] == pytest.approx(255 / SCORES)
    assert "no score matrix is kept" in found.detail
    kept = backward_memory(evidence([], spec(mode="training"), {"saved_for_backward_bytes": OUTPUT + 256}))
    assert "keeps the probabilities" in kept.detail


@pytest.mark.parametrize(
    ("run", "numbers"),
    [
        (spec(), {"saved_for_backward_bytes": OUTPUT + SCORES}),  # inference
        (spec(mode="training"), {}),  # nothing measured
        (None, {"saved_for_backward_bytes": OUTPUT + SCORES}),  # an upload
    ],
)
def test_backward_memory_absent(run, numbers):
    assert backward_memory(evidence([], run, numbers)) is None


# ---- gqa_copy (our run's spec) ---------------------------------------------------------------------------------------


def layout_copy(ts: float = 0) -> list[dict]:
    """repeat_interleave -> clone -> copy_ of a [4, 4] float tensor: 64 bytes."""
    return [
        op("aten::repeat_interleave", ts, 100, [[4, 4], []]),
        op("aten::clone", ts + 1, 98, [[4, 4]]),
        op("aten::copy_", ts + 2, 96, [[4, 4], [4, 4]]),
    ]


def test_gqa_copy_present_from_the_spec():
    """No attention op in the trace: the spec (4 query heads, 2 K/V heads) is the evidence of GQA."""
    found = gqa_copy(evidence(layout_copy(), spec(heads=4, kv_heads=2)))
    assert found is not None
    assert (found.evidence["heads"], found.evidence["kv_heads"], found.evidence["heads_from"]) == (4, 2, "spec")
    assert found.evidence["copies_per_forward"] == 1 and found.evidence["bytes_per_forward"] == 64
    assert found.evidence["callers"] == ["aten::repeat_interleave"]
    assert "CPU flash kernel does" in found.detail
    math = gqa_copy(evidence(layout_copy(), spec(heads=4, kv_heads=2), {"backend_used": "math"}))
    assert "math backend still repeats" in math.detail


def test_gqa_copy_absent_from_the_spec():
    assert gqa_copy(evidence(layout_copy(), spec(heads=4))) is None  # equal heads: hidden_copy tells it
    assert hidden_copy(evidence(layout_copy(), spec(heads=4))).evidence["causes"]["repeat_interleave"]["count"] == 1
    other = [op("aten::linear", 0, 100, [[4, 4]]), *layout_copy(0)[1:]]  # a copy, but not a layout copy
    assert gqa_copy(evidence(other, spec(heads=4, kv_heads=2))) is None


# ---- decode_bound ----------------------------------------------------------------------------------------------------

ROOFLINE = {
    "achieved_gbps": 12.5,
    "peak_gbps": 50.0,
    "arithmetic_intensity": 0.9,
    "ridge_point": 20.0,
    "roofline_bound": "memory",
    "bytes_moved": 4096,
    "bandwidth_source": "measured copy",
}


def test_decode_bound_present_at_16_queries():
    found = decode_bound(evidence(cpu_forward(100), spec(seq_len=64, q_len=16), ROOFLINE, window=FORWARD))
    assert found is not None and found.evidence == {"achieved_gbps": 12.5, "peak_gbps": 50.0}
    assert "16 queries against 64 keys" in found.detail and "25% of 50 GB/s" in found.detail
    one = decode_bound(evidence(cpu_forward(100), spec(seq_len=64, q_len=1), ROOFLINE, window=FORWARD))
    assert "1 query against 64 keys" in one.detail


@pytest.mark.parametrize(
    ("run", "numbers"),
    [
        (spec(seq_len=64, q_len=17), ROOFLINE),  # 17 queries: just over DECODE_Q_LEN, prefill-like
        (spec(seq_len=16, q_len=16), ROOFLINE),  # as many queries as keys
        (spec(seq_len=64, q_len=1), {}),  # nothing measured
        (None, ROOFLINE),  # an upload
    ],
)
def test_decode_bound_absent(run, numbers):
    assert decode_bound(evidence(cpu_forward(100), run, numbers, window=FORWARD)) is None


# ---- wrong_alignment -------------------------------------------------------------------------------------------------


def causal_sdpa(q_len: int, kv_len: int, is_causal: str = "True") -> dict:
    dims = [[1, 4, q_len, 16], [1, 4, kv_len, 16], [1, 4, kv_len, 16], [], [], []]
    concrete = ["", "", "", "", "0.", is_causal, "", ""]
    return op(SDPA, 0, 100, dims, **{"Concrete Inputs": concrete})


def test_wrong_alignment_present_in_an_upload():
    found = wrong_alignment(evidence([causal_sdpa(3, 10)]))
    assert found is not None
    assert found.evidence == {"q_len": 3, "kv_len": 10, "keys_missed_by_last_query": 7}
    assert "causal_lower_right(3, 10)" in found.detail
    # One query fewer than keys is enough.
    assert wrong_alignment(evidence([causal_sdpa(9, 10)])).evidence["keys_missed_by_last_query"] == 1


def test_wrong_alignment_present_from_the_spec():
    found = wrong_alignment(evidence([], spec(seq_len=16, q_len=4, mask="causal_top_left")))
    assert found is not None
    assert found.evidence == {"q_len": 4, "kv_len": 16, "keys_missed_by_last_query": 12}


def test_wrong_alignment_fires_on_a_later_call_with_fewer_queries():
    """A chunked prefill: the first causal call sees 10 queries and 10 keys (right), the next 4 queries
    against 14 keys (wrong). The docs: it fires on "an SDPA call's" lengths, not only the first call's."""
    later = {**causal_sdpa(4, 14), "ts": 200}
    found = wrong_alignment(evidence([causal_sdpa(10, 10), later]))
    assert found is not None
    assert found.evidence == {"q_len": 4, "kv_len": 14, "keys_missed_by_last_query": 10}


@pytest.mark.parametrize(
    "events",
    [
        [causal_sdpa(10, 10)],  # as many queries as keys
        [causal_sdpa(3, 10, "False")],  # not causal
        [{**causal_sdpa(3, 10), "args": {"Input Dims": [[1, 4, 3, 16], [1, 4, 10, 16]]}}],  # is_causal not recorded
    ],
)
def test_wrong_alignment_absent_in_an_upload(events):
    assert wrong_alignment(evidence(events)) is None


@pytest.mark.parametrize(
    "run",
    [
        spec(seq_len=16, q_len=16, mask="causal_top_left"),  # as many queries as keys
        spec(seq_len=16, q_len=4, mask="causal"),  # bottom-right: right for decode
    ],
)
def test_wrong_alignment_absent_from_the_spec(run):
    assert wrong_alignment(evidence([], run)) is None


# ---- dense_mask_backend ----------------------------------------------------------------------------------------------

FLASH_REFUSED = {"flash": "attn_mask is not supported by the flash kernel"}


def test_dense_mask_backend_present_on_cuda_names_the_refusal():
    run = spec(variant="sdpa", mask="sliding_window", window=4, device="cuda")
    found = dense_mask_backend(evidence([], run, {"backend_used": "efficient", "backend_reasons": FLASH_REFUSED}))
    assert found is not None and found.title == "Dense mask forced a slower backend"
    assert found.evidence == {"backend_used": "efficient", "refused": FLASH_REFUSED}


def test_dense_mask_backend_present_on_cpu_and_for_decode_causal():
    """A causal mask with fewer queries than keys reaches SDPA as a dense mask too."""
    run = spec(variant="sdpa", seq_len=16, q_len=4, mask="causal")
    found = dense_mask_backend(evidence([], run, {"backend_used": "flash"}))
    assert found is not None and found.evidence == {"backend_used": "flash"}
    assert "the causal mask reaches SDPA as a dense attn_mask" in found.detail


@pytest.mark.parametrize(
    ("run", "numbers"),
    [
        (spec(variant="sdpa", mask="causal"), {"backend_used": "flash"}),  # is_causal, no dense mask
        (spec(variant="sdpa", mask="none"), {"backend_used": "flash"}),
        (spec(variant="naive", mask="sliding_window", window=4), {"backend_used": None}),  # not SDPA
        (
            spec(variant="sdpa", mask="sliding_window", window=4, device="cuda"),
            {"backend_used": "flash", "backend_reasons": FLASH_REFUSED},  # flash ran after all
        ),
        (
            spec(variant="sdpa", mask="padding", valid_len="5", device="cuda"),
            {"backend_used": "efficient", "backend_reasons": {}},  # no refusal recorded
        ),
        (None, {"backend_used": "efficient", "backend_reasons": FLASH_REFUSED}),  # an upload
    ],
)
def test_dense_mask_backend_absent(run, numbers):
    assert dense_mask_backend(evidence([], run, numbers)) is None


# ---- first_call ------------------------------------------------------------------------------------------------------


def test_first_call_present_gives_both_times_and_the_cause():
    numbers = {
        "first_call_cause": "torch.compile traced the graph",
        "first_call_ms": 30.0,
        "forward_unprofiled_ms": 2.0,
    }
    found = first_call(evidence([], spec(), numbers))
    assert found is not None
    assert found.evidence == {"first_call_ms": 30.0, "steady_ms": 2.0, "cause": "torch.compile traced the graph"}
    assert "(x15.0)" in found.detail


@pytest.mark.parametrize(("first_ms", "fires"), [(6.01, True), (6.0, False)])
def test_first_call_fires_just_over_three_steady_forwards(first_ms, fires):
    """The cause (what the rule reads) is set by the summary only over FIRST_CALL_NOTICE (3) steady forwards."""
    run = SimpleNamespace(spec=spec(), first_call_ms=first_ms, unprofiled_ms=2.0, first_call_fresh=True)
    numbers = {**_first_call_keys(run), "forward_unprofiled_ms": 2.0}
    found = first_call(evidence([], spec(), numbers))
    assert (found is not None) == fires
    if fires:
        assert found.evidence["first_call_ms"] == first_ms and found.evidence["steady_ms"] == 2.0
        assert found.evidence["cause"].startswith("allocation")  # a CPU run without compile


@pytest.mark.parametrize("cause", [None, ""])
def test_first_call_absent_without_a_cause(cause):
    """The pipeline names a cause only for a first call over 3 steady forwards; without one, silence."""
    numbers = {"first_call_cause": cause, "first_call_ms": 30.0, "forward_unprofiled_ms": 2.0}
    assert first_call(evidence([], spec(), numbers)) is None
    assert first_call(evidence([], spec(), {})) is None


# ---- impossible_values -----------------------------------------------------------------------------------------------


def shaped(ts: float, corr: int, occupancy: float, blocks: float) -> dict:
    return kernel("k", ts, 10, corr, **{"est. achieved occupancy %": occupancy, "blocks per SM": blocks})


def test_impossible_values_present_counts_each_kind():
    events = [
        launch(0, 1),
        shaped(10, 1, 100.5, 2.0),  # occupancy just over 100%
        launch(20, 2),
        shaped(30, 2, -0.5, -1.0),  # under 0%, and negative blocks per SM
        launch(40, 2),  # a second launch with correlation id 2
    ]
    found = impossible_values(evidence(events))
    assert found is not None
    assert found.evidence == {
        "launches_sharing_correlation": 1,
        "occupancy_out_of_range": 2,
        "blocks_per_sm_out_of_range": 1,
    }


def test_impossible_values_absent_at_the_edges_of_the_range():
    events = [launch(0, 1), shaped(10, 1, 100.0, 0.0), launch(20, 2), shaped(30, 2, 0.0, 1.5)]
    assert impossible_values(evidence(events)) is None
