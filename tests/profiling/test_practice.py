"""Training, GQA, decode and masks on real CPU runs: the numbers against the trace, and the insights they fire."""

import json

import pytest

from attention import AttentionSpec
from profiling.analysis import analyze
from profiling.pipeline import profile_attention
from profiling.trace import parse_trace
from tests import reference

SMALL = dict(batch=1, heads=4, head_dim=32, device="cpu")


def rules(result):
    return {i.rule: i for i in result.insights}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("practice")
    specs = {
        "naive-train": AttentionSpec(variant="naive", seq_len=256, mode="training", **SMALL),
        "flash-train": AttentionSpec(variant="sdpa", backend="flash", seq_len=256, mode="training", **SMALL),
        "naive-gqa": AttentionSpec(variant="naive", seq_len=128, kv_heads=2, **SMALL),
        "math-gqa": AttentionSpec(variant="sdpa", backend="math", seq_len=128, kv_heads=2, **SMALL),
        "flash-gqa": AttentionSpec(variant="sdpa", backend="flash", seq_len=128, kv_heads=2, **SMALL),
        "decode": AttentionSpec(variant="sdpa", seq_len=2048, q_len=1, kv_heads=1, **SMALL),
        "top-left": AttentionSpec(variant="sdpa", seq_len=256, q_len=16, mask="causal_top_left", **SMALL),
        "chunked": AttentionSpec(variant="sdpa", backend="math", seq_len=256, q_len=16, **SMALL),
        "window": AttentionSpec(variant="sdpa", seq_len=256, mask="sliding_window", window=32, **SMALL),
    }
    return {name: profile_attention(spec, out) for name, spec in specs.items()}


def _left_at_end(path, name):
    """Per window, `Total Allocated` at its last memory event less the level before its first: a plain loop."""
    events = reference.raw_events_all(path)
    out = []
    for w in reference.windows(path, name):
        inner = sorted(
            (e for e in events if e.get("name") == "[memory]" and w["ts"] <= e["ts"] <= reference.end(w) + 1e-3),
            key=lambda e: e["ts"],
        )
        base = inner[0]["args"]["Total Allocated"] - inner[0]["args"]["Bytes"]
        out.append(inner[-1]["args"]["Total Allocated"] - base)
    return out


def test_training_profiles_forward_and_backward_windows(runs):
    for name in ("naive-train", "flash-train"):
        result = runs[name]
        summary = result.summary
        backward = reference.windows(result.trace_path, "attn_bwd")
        assert len(backward) == len(reference.windows(result.trace_path, "attn_fwd")) == 3
        assert summary["backward_cpu_ms"] == pytest.approx(sum(w["dur"] for w in backward) / 3 / 1e3, abs=1e-4)
        compute = reference.aten_ops_in(result.trace_path, "attn_bwd")
        assert summary["kernels_per_backward"] > 0 and sum(map(len, compute)) >= summary["kernels_per_backward"] * 3
        assert summary["backward_flops"] == result.spec.flops() * 5 // 2
        assert 0 < summary["max_abs_grad_error"] < 1e-4
        # Timed apart from the forward (which one is faster is this machine's business, noisy under load).
        assert summary["step_unprofiled_ms"] > 0 and summary["step_unprofiled_ms"] != summary["forward_unprofiled_ms"]


def test_saved_for_backward_is_what_attn_fwd_left_allocated(runs):
    for name in ("naive-train", "flash-train"):
        result = runs[name]
        left = _left_at_end(result.trace_path, "attn_fwd")
        assert result.summary["saved_for_backward_bytes"] == int(sum(left) / len(left))


def test_backward_memory_naive_keeps_the_probabilities_flash_does_not(runs):
    scores = 1 * 4 * 256 * 256 * 4
    naive, flash = runs["naive-train"].summary, runs["flash-train"].summary
    assert naive["saved_for_backward_bytes"] >= scores  # the probabilities, and the output
    assert flash["saved_for_backward_bytes"] < scores / 4  # the output and the log-sum-exp only
    assert "keeps the probabilities" in rules(runs["naive-train"])["backward_memory"].text
    assert "no score matrix is kept" in rules(runs["flash-train"])["backward_memory"].text
    assert "backward_memory" not in rules(runs["naive-gqa"])  # inference


def test_backward_memory_takes_the_output_off_before_comparing(tmp_path):
    # At seq_len == head_dim the output is exactly one score matrix's size: flash must still read as
    # keeping none, naive as keeping the probabilities.
    shape = dict(batch=1, heads=2, seq_len=32, head_dim=32, mode="training", device="cpu")
    for variant, backend, says in (("sdpa", "flash", "no score matrix is kept"), ("naive", "auto", "keeps the")):
        result = profile_attention(AttentionSpec(variant=variant, backend=backend, **shape), tmp_path)
        finding = rules(result)["backward_memory"]
        output = 1 * 2 * 32 * 32 * 4
        assert finding.evidence["output_bytes"] == output and says in finding.text
        expected = (result.summary["saved_for_backward_bytes"] - output) / (1 * 2 * 32 * 32 * 4)
        assert finding.evidence["ratio"] == pytest.approx(expected)


def test_gqa_copy_bytes_and_who_avoids_it(runs):
    kv_bytes = 2 * 1 * 4 * 128 * 32 * 4  # K and V, each laid out for all 4 query heads
    naive = rules(runs["naive-gqa"])["gqa_copy"]
    assert naive.evidence["bytes_per_forward"] == kv_bytes and naive.evidence["callers"] == ["aten::reshape"]
    math = rules(runs["math-gqa"])["gqa_copy"]
    assert math.evidence["callers"] == ["aten::repeat_interleave"] and "math backend still repeats" in math.text
    assert "gqa_copy" not in rules(runs["flash-gqa"])  # the CPU flash kernel reads shared heads in place
    assert runs["flash-gqa"].summary["backend_used"] == "flash"
    assert (
        "hidden_copy" not in rules(runs["naive-gqa"]) or "masked_fill" in rules(runs["naive-gqa"])["hidden_copy"].text
    )


def test_decode_is_memory_bound_with_the_bytes_it_must_move(runs):
    summary = runs["decode"].summary
    itemsize, b, h, kv, s, d = 4, 1, 4, 1, 2048, 32
    assert summary["bytes_moved"] == (2 * b * h * 1 * d + 2 * b * kv * s * d) * itemsize
    assert summary["flops_per_forward"] == 4 * d * h * s  # one query sees every key
    assert summary["roofline_bound"] == "memory"
    assert summary["achieved_gbps"] == pytest.approx(
        summary["bytes_moved"] / summary["forward_unprofiled_ms"] / 1e6, rel=0.01
    )
    assert "memory-bound" in rules(runs["decode"])["decode_bound"].text


def test_wrong_alignment_only_where_queries_miss_keys(runs):
    found = rules(runs["top-left"])["wrong_alignment"]
    assert found.evidence == {"q_len": 16, "kv_len": 256, "keys_missed_by_last_query": 240}
    assert "causal_lower_right(16, 256)" in found.text
    assert "wrong_alignment" not in rules(runs["chunked"])  # bottom-right aligned: right


def test_chunked_prefill_rebuilds_its_mask_per_call(runs):
    found = rules(runs["chunked"])
    assert "mask_rebuilt" in found
    assert runs["chunked"].summary["score_matrix_bytes"] == 2 * 1 * 4 * 16 * 256 * 4  # q_len x seq_len


def test_a_dense_mask_on_cpu_says_flash_takes_it(runs):
    found = rules(runs["window"])["dense_mask_backend"]
    assert (
        runs["window"].summary["backend_used"] == "flash" and "on the CPU torch's flash kernel takes it" in found.text
    )


def test_backend_used_is_read_from_the_trace(runs):
    trace_ops = {e["name"] for e in reference.raw_events(runs["math-gqa"].trace_path)}
    assert "aten::_scaled_dot_product_attention_math" in trace_ops
    assert runs["math-gqa"].summary["backend_used"] == "math"
    assert runs["naive-gqa"].summary["backend_used"] is None  # not SDPA
    assert set(runs["decode"].summary["backend_reasons"]) == {"efficient", "cudnn"}  # CUDA only


def test_first_call_cause_on_a_compiled_run(tmp_path):
    result = profile_attention(AttentionSpec(variant="naive", seq_len=32, compile=True, **SMALL), tmp_path)
    summary = result.summary
    assert summary["first_call_fresh"] is True
    assert summary["first_call_ms"] > 3 * summary["forward_unprofiled_ms"]
    assert summary["first_call_cause"].startswith("torch.compile")
    assert rules(result)["first_call"].evidence["cause"] == summary["first_call_cause"]


def test_wrong_alignment_on_an_uploaded_trace():
    """An SDPA call with is_causal=True and 16 queries against 256 keys, as torch records it."""
    event = {
        "ph": "X", "cat": "cpu_op", "name": "aten::scaled_dot_product_attention", "ts": 0, "dur": 10, "pid": 1,
        "tid": 1, "args": {
            "Input Dims": [[1, 4, 16, 64], [1, 4, 256, 64], [1, 4, 256, 64], [], [], [], [], []],
            "Concrete Inputs": ["", "", "", "", "0.", "True", "", "False"],
        },
    }  # fmt: skip
    found = {i.rule: i for i in analyze(parse_trace(json.dumps([event]).encode())).insights}
    assert found["wrong_alignment"].evidence["keys_missed_by_last_query"] == 240
    event["args"]["Concrete Inputs"][5] = "False"
    assert "wrong_alignment" not in {i.rule for i in analyze(parse_trace(json.dumps([event]).encode())).insights}


def test_diff_covers_the_backward(runs):
    from profiling.diff import diff_summaries

    naive, flash = runs["naive-train"].summary, runs["flash-train"].summary
    diff = diff_summaries(naive, flash)
    backward = diff[diff["kind"] == "backward compute op"]
    for name in set(naive["per_backward_kernels"]) | set(flash["per_backward_kernels"]):
        a, b = naive["per_backward_kernels"].get(name, 0.0), flash["per_backward_kernels"].get(name, 0.0)
        rows = backward[backward["name"] == name]
        assert (len(rows) == 0) if a == b else (rows.iloc[0]["change"] == pytest.approx(b - a, abs=1e-3))
    totals = diff[diff["kind"] == "total"].set_index("name")["change"]
    saved = flash["saved_for_backward_bytes"] - naive["saved_for_backward_bytes"]
    assert totals["saved for backward (bytes)"] == saved < 0  # flash keeps no probabilities
    assert totals["kernels per backward"] == flash["kernels_per_backward"] - naive["kernels_per_backward"]
    inference = diff_summaries(runs["naive-gqa"].summary, runs["flash-gqa"].summary)
    assert not inference["kind"].str.startswith("backward").any() and "kernels per backward" not in set(
        inference["name"]
    )
