"""Attention: fused or not, the causal mask, the safe softmax, decode, alignment, dense masks, backward memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from profiling import intervals as iv
from profiling.attention_found import (
    SDPA_MATH_OP,
    AttentionFound,
    attention_found,
    need_weights,
    step_of_launch,
)
from profiling.insights.base import (
    MAX_TENSOR_BYTES,
    NAME_IN_PROSE,
    Evidence,
    Finding,
    Rule,
    fmt_bytes,
    gpu_share,
    left_out,
    short,
)
from profiling.kernels import decode
from profiling.occupancy import whole_number
from profiling.step_breakdown import step_at

MASK_OPS = ("aten::ones", "aten::tril", "aten::triu", "aten::where", "aten::logical_not", "aten::masked_fill")
SAFE_SOFTMAX_GUARDS = ("aten::isneginf", "aten::all", "aten::where")
FUSED_OP_HINTS = ("flash", "efficient", "cudnn", "flex_attention", "_fused_")
DECODE_Q_LEN = 16  # queries per forward at or below which a run is decode-like
KEPT_SCORES = 0.5  # beyond the output, this share of one score matrix means the probabilities were kept
MAX_SHAPES_IN_PROSE = 3


def has_attention(ev: Evidence) -> bool:
    """Our runs always run attention; an upload shows it by fused kernels, an unfused match, or an
    attention op (SDPA, nn.MultiheadAttention, a serving stack's). The other attention rules say
    nothing on a trace without it: a causal mask in a recommender is no attention's mask."""
    return ev.spec is not None or attention_found(ev.trace).present


def fused(ev: Evidence) -> Finding | None:
    """Fused attention kernels, by the decoder's families (GPU); one compute op per forward (CPU)."""
    scope = ev.scope
    if scope.on_gpu:
        found = attention_found(ev.trace)
        if len(found.fused):
            return _fused_kernels(ev, found)
        if ev.whole_trace or not (len(scope.gpu) == scope.count > 0):
            return None
        # Our run: one kernel per forward that the decoder does not name is still the whole attention.
        name = scope.gpu["name"].iloc[0]
        meaning = decode(name).summary
        return Finding(
            "Fused",
            f"one kernel does the whole attention: {short(name)} ({meaning}).",
            {"kernel": name, "meaning": meaning},
            gpu_share(ev, float(scope.gpu["dur"].sum())),
        )
    compute = scope.compute_ops
    if ev.whole_trace or scope.count == 0 or len(compute) != scope.count:
        return None
    name = compute["name"].iloc[0]
    if not any(h in name for h in FUSED_OP_HINTS):
        return None
    detail = f"one op does the whole attention: {short(name)}, with no score matrix in memory."
    return Finding("Fused", detail, {"op": name})


def _fused_kernels(ev: Evidence, found: AttentionFound) -> Finding:
    """The fused kernels' family and backend (the decoder's meaning of the one with the most time) and
    their share; the longest launch of that kernel is the instance to look at."""
    top = found.fused.index[0]
    family, meaning = found.fused["family"].iloc[0], decode(top).summary
    kernels = ev.trace.kernels
    launches = kernels[kernels["name"] == top]
    worst = launches.iloc[int(np.argmax(np.nan_to_num(launches["dur"].to_numpy(), nan=-1.0)))]
    families = found.fused.groupby("family", sort=False)["total_us"].sum()
    share = gpu_share(ev, found.fused_us)
    others = f", and {len(found.fused) - 1} other fused kernel name(s)" if len(found.fused) > 1 else ""
    return Finding(
        "Fused attention",
        f"attention runs in fused {family} kernels: {short(top)} ({meaning}), "
        f"{int(found.fused['count'].iloc[0])} launch(es){others}; "
        f"{found.fused_us:,.1f} us{f', {share:.1f}% of GPU time' if share is not None else ''}.",
        {
            "kernel": top,
            "family": family,
            "meaning": meaning,
            "families_us": families.to_dict(),
            "kernels": found.fused.index.tolist(),
            "launches": int(found.fused["count"].sum()),
            "total_us": found.fused_us,
            "ts_us": float(worst["ts"]) + ev.trace.ts_base_us,
            "step": step_of_launch(ev.trace, worst["correlation"]),
        },
        share,
    )


def unfused(ev: Evidence) -> Finding | None:
    """Matmul, softmax, matmul as separate ops (`attention_found`): the score matrix goes through memory."""
    matches = attention_found(ev.trace).matches
    if not len(matches):
        return None
    trace, worst = ev.trace, matches.iloc[0]  # the match with the most GPU time
    names = trace.events["name"]
    ops = [str(names.iloc[int(worst[k])]) for k in ("first", "softmax", "second")]
    parent = int(worst["parent"])
    parent_name = str(names.iloc[parent]) if parent >= 0 else None
    shapes = list(dict.fromkeys(zip(matches["first_shape"], matches["scores_shape"], strict=True)))
    gpu_us, softmax_us = float(matches["gpu_us"].sum()), float(matches["softmax_us"].sum())
    share = gpu_share(ev, gpu_us) if gpu_us > 0 else None
    softmax_share = gpu_share(ev, softmax_us) if softmax_us > 0 else None
    weights = need_weights(trace, parent)
    said = ", ".join(f"scores {list(b)} from a {list(a)} input" for a, b in shapes[:MAX_SHAPES_IN_PROSE])
    time = (
        f"; they take {share:.1f}% of GPU time ({gpu_us:,.1f} us), the softmax alone {softmax_share or 0:.1f}%"
        if share is not None
        else ""
    )
    return Finding(
        "Unfused attention",
        f"{len(matches)} {' -> '.join(ops)} sequence(s) in the trace compute attention as separate ops, writing "
        f"each score matrix to memory and reading it back ({said}){time}. " + _unfused_fix(parent_name, weights),
        {
            "matches": len(matches),
            "ops": ops,
            "parent": parent_name,
            "shapes": [{"first_gemm_input": list(a), "scores": list(b)} for a, b in shapes],
            "gpu_us": gpu_us,
            "softmax_us": softmax_us,
            "softmax_gpu_time_percent": softmax_share,
            "need_weights": weights,
            "ts_us": float(worst["start"]) + trace.ts_base_us,
            "step": step_at(trace, float(worst["start"])),
        },
        share,
    )


def _unfused_fix(parent: str | None, weights: bool) -> str:
    if weights:
        return (
            "nn.MultiheadAttention was called with need_weights=True (its Concrete Inputs), which forces this "
            "unfused path to return the weights: pass need_weights=False to take its fused SDPA path."
        )
    if parent == SDPA_MATH_OP:
        return (
            "This is SDPA's math backend: no fused backend (flash, efficient, cuDNN) took these inputs, or it "
            "was disabled; see which refused and why (torch.nn.attention.sdpa_kernel)."
        )
    return (
        "torch.nn.functional.scaled_dot_product_attention fuses them into one kernel that never stores the "
        'scores (in transformers: attn_implementation="sdpa").'
    )


def mask_rebuilt(ev: Evidence) -> Finding | None:
    """SDPA math (or any forward) building a causal mask on every call."""
    if not has_attention(ev):
        return None
    gpu = ev.scope.gpu
    tril_kernels = gpu[gpu["name"].str.contains("triu_tril", regex=False)] if len(gpu) else gpu
    if not (ev.has_op("aten::tril") or ev.has_op("aten::triu") or len(tril_kernels)):
        return None
    ops = ev.ops_named(*MASK_OPS)
    # A mask op's own calls (a `where` inside a `where`) and the safe softmax's guard are not the mask.
    ops = ops[~ops["parent"].isin((*MASK_OPS, "aten::_safe_softmax"))]
    counts = (ops["name"].value_counts() / ev.per).round(2).to_dict()
    return Finding(
        "Mask rebuilt per call",
        f"{len(ops) / ev.per:g} mask ops {ev.unit} ({', '.join(counts)}) build the causal mask inside the forward. "
        "is_causal did not remove the work, it moved it.",
        {"ops_per_forward": counts, "kernels_per_forward": len(tril_kernels) / ev.per},
    )


def safe_softmax(ev: Evidence) -> Finding | None:
    if not (ev.has_op("aten::_safe_softmax") and has_attention(ev)):
        return None
    guards = ev.ops_named(*SAFE_SOFTMAX_GUARDS)
    guards = guards[guards["parent"] == "aten::_safe_softmax"]  # the mask's own `where` is not the guard
    return Finding(
        "Safe softmax",
        "aten::_safe_softmax checks each row for all -inf (isneginf, all, where) so that a fully masked row gives 0 "
        f"instead of NaN; that guard costs {len(guards) / ev.per:g} extra ops {ev.unit}.",
        {"op": "aten::_safe_softmax", "guard_ops_per_forward": len(guards) / ev.per},
    )


def backward_memory(ev: Evidence) -> Finding | None:
    """Training: what the forward kept for the backward beyond its output, against one score matrix.
    The output is kept by every variant (it is returned), so it is taken off before comparing:
    otherwise at head_dim == seq_len the output alone would look like a score matrix."""
    saved = ev.numbers.get("saved_for_backward_bytes")
    if ev.spec is None or not ev.spec.training or saved is None:
        return None
    spec = ev.spec
    scores = spec.score_bytes()
    output = spec.batch * spec.heads * spec.q_len * spec.head_dim * spec.itemsize
    beyond = max(saved - output, 0)
    ratio = beyond / scores if scores else 0.0
    kept = (
        f"{ratio:.1f}x one score matrix ({fmt_bytes(scores)}): it keeps the probabilities, "
        "q_len x seq_len per head, for the backward; a fused kernel (flash) keeps only the output and "
        "the log-sum-exp and recomputes the rest"
        if ratio >= KEPT_SCORES
        else f"{ratio:.2f}x one score matrix ({fmt_bytes(scores)}): no score matrix is kept, only the "
        "log-sum-exp (the backward recomputes the scores); math, naive and in-place keep the probabilities"
    )
    return Finding(
        "Backward memory",
        f"the forward left {fmt_bytes(saved)} allocated for the backward, {fmt_bytes(output)} of it the "
        f"output; the rest is {kept}.",
        {"saved_for_backward_bytes": saved, "output_bytes": output, "score_matrix_bytes": scores, "ratio": ratio},
    )


def decode_bound(ev: Evidence) -> Finding | None:
    """Few queries against a long KV cache: the forward streams K and V for little math."""
    spec, numbers = ev.spec, ev.numbers
    if spec is None or spec.q_len > DECODE_Q_LEN or spec.q_len >= spec.seq_len or not numbers:
        return None
    achieved, peak = numbers["achieved_gbps"], numbers["peak_gbps"]
    detail = (
        f"{spec.q_len} quer{'y' if spec.q_len == 1 else 'ies'} against {spec.seq_len} keys do "
        f"{numbers['arithmetic_intensity']:.1f} FLOP per byte moved, below the ridge point of "
        f"{numbers['ridge_point']:.1f}: the forward is {numbers['roofline_bound']}-bound. It moved "
        f"{fmt_bytes(numbers['bytes_moved'])} at {achieved:.3g} GB/s, {100 * achieved / peak:.0f}% of "
        f"{peak:.0f} GB/s ({numbers['bandwidth_source']})"
        + (
            ", faster than the yardstick: this forward's bytes fit in a cache the yardstick's do not"
            if achieved > peak
            else ""
        )
    )
    if ev.scope.on_gpu and ev.scope.device_ms:
        busy_ms = iv.total(iv.union(ev.scope.gpu["ts"], ev.scope.gpu["end"])) / 1e3 / ev.per
        detail += (
            f"; the host spent {ev.scope.cpu_ms:.3f} ms launching {ev.scope.kernels_per_window:g} kernels that ran "
            f"{busy_ms:.3f} ms"
        )
    return Finding("Decode is bandwidth-bound", detail + ".", {"achieved_gbps": achieved, "peak_gbps": peak})


def wrong_alignment(ev: Evidence) -> Finding | None:
    """A causal mask aligned to the top left while queries are fewer than keys: the decode bug."""
    if not has_attention(ev):
        return None
    q_len, kv_len, skipped = _top_left_causal_lengths(ev)
    if q_len is None or kv_len is None or q_len >= kv_len:
        return None
    missed = kv_len - q_len
    return Finding(
        "Wrong causal alignment",
        f"is_causal=True aligns the mask to the top left, so with {q_len} quer{'y' if q_len == 1 else 'ies'} and "
        f"{kv_len} keys query i sees only keys 0..i: the last query misses the newest {missed} keys it should see "
        f"(the whole cache but the first {q_len}). Align to the bottom right: "
        f"torch.nn.attention.bias.causal_lower_right({q_len}, {kv_len}) "
        "or an explicit mask.",
        {
            "q_len": q_len,
            "kv_len": kv_len,
            "keys_missed_by_last_query": missed,
            **left_out(skipped, "causal SDPA call(s)", "their Input Dims give no query and key lengths"),
        },
    )


def _top_left_causal_lengths(ev: Evidence) -> tuple[int | None, int | None, int]:
    """Query and key lengths of the first causal SDPA call with fewer queries than keys, and how many causal
    calls give no usable lengths."""
    if ev.spec is not None:
        return (ev.spec.q_len, ev.spec.seq_len, 0) if ev.spec.mask == "causal_top_left" else (None, None, 0)
    # An upload: an SDPA call with is_causal=True (its 6th input) and its query and key lengths.
    calls = ev.ops_named("aten::scaled_dot_product_attention")
    if "concrete_inputs" not in calls:
        return None, None, 0
    pairs: dict[tuple[int, int], list[Any]] = {}  # the reader shares one object per distinct value
    for dims, concrete in zip(calls["input_dims"], calls["concrete_inputs"], strict=True):
        pairs.setdefault((id(dims), id(concrete)), [dims, concrete, 0])[2] += 1
    found: tuple[int, int] | None = None
    skipped = 0
    for dims, concrete, count in pairs.values():
        if not (isinstance(concrete, list) and len(concrete) > 5 and concrete[5] == "True"):
            continue
        lengths = _query_and_key_lengths(dims)
        if lengths is None:
            skipped += count
        elif found is None and lengths[0] < lengths[1]:  # a prefill call (q == kv) is aligned either way
            found = lengths
    return (*found, skipped) if found else (None, None, skipped)


def _query_and_key_lengths(dims: Any) -> tuple[int, int] | None:
    """The sequence lengths (dimension -2) of SDPA's query and key, where both are whole numbers from 1."""
    if not (isinstance(dims, list) and len(dims) > 1):
        return None
    shapes = dims[:2]
    if not all(isinstance(d, list) and len(d) >= 2 and whole_number(d[-2], MAX_TENSOR_BYTES) for d in shapes):
        return None
    return int(shapes[0][-2]), int(shapes[1][-2])


def dense_mask_backend(ev: Evidence) -> Finding | None:
    """A dense mask and the SDPA backend it allowed: the one that ran, and the one that refused."""
    spec, numbers = ev.spec, ev.numbers
    if spec is None or spec.variant != "sdpa" or not _dense_mask(spec):
        return None
    used, reasons = numbers.get("backend_used"), numbers.get("backend_reasons") or {}
    if spec.device == "cpu":
        return Finding(
            "Dense mask",
            f"the {spec.mask} mask reaches SDPA as a dense attn_mask, and on the CPU torch's flash kernel takes it "
            f"(this run used {used}); on CUDA the flash kernel takes no dense mask, so SDPA would fall back to the "
            "efficient or math backend there.",
            {"backend_used": used},
        )
    if used == "flash" or "flash" not in reasons:
        return None
    return Finding(
        "Dense mask forced a slower backend",
        f"SDPA ran {used}; flash refused: {short(reasons['flash'], NAME_IN_PROSE * 2)}",
        {"backend_used": used, "refused": {"flash": reasons["flash"]}},
    )


def _dense_mask(spec: Any) -> bool:
    return spec.mask in ("sliding_window", "padding") or (spec.mask == "causal" and spec.q_len != spec.seq_len)


RULES: tuple[Rule, ...] = (
    Rule("mask_rebuilt", "aten::ones/tril/where or triu_tril_kernel inside the forward", mask_rebuilt),
    Rule("safe_softmax", "aten::_safe_softmax", safe_softmax),
    Rule("fused_attention", "kernels of an attention family (GPU); one compute op per forward (CPU)", fused),
    Rule(
        "unfused_attention",
        "GEMM, softmax, GEMM on the scores' shape, under one op, with only elementwise ops between",
        unfused,
    ),
    Rule("backward_memory", "memory left by attn_fwd for attn_bwd vs one score matrix (training)", backward_memory),
    Rule("decode_bound", "q_len <= 16 against a longer KV: bytes moved, GB/s vs peak, launch overhead", decode_bound),
    Rule("wrong_alignment", "is_causal (top-left) with fewer queries than keys", wrong_alignment),
    Rule("dense_mask_backend", "a dense SDPA mask: the backend that ran and the one refused", dense_mask_backend),
)
