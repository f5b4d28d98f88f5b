"""What a trace teaches, found automatically. Each rule is a row in `RULES`.

A rule reads one `Evidence` (the ops and GPU activity inside the forwards, or inside the
whole trace for an upload) and returns an `Insight`, a sentence plus the numbers behind it,
or None when it does not apply.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.kernels import decode
from profiling.occupancy import theoretical_occupancy
from profiling.trace import LAUNCH_CATEGORIES, Trace
from profiling.windows import FORWARD, WHOLE_TRACE, WindowStats

LOW_PRECISION_TYPES = ("c10::BFloat16", "c10::Half")
ITEMSIZE = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "bool": 1, "long int": 8, "int": 4}
MASK_OPS = ("aten::ones", "aten::tril", "aten::triu", "aten::where", "aten::logical_not", "aten::masked_fill")
SAFE_SOFTMAX_GUARDS = ("aten::isneginf", "aten::all", "aten::where")
FUSED_OP_HINTS = ("flash", "efficient", "cudnn", "flex_attention", "_fused_")
LOW_OCCUPANCY_PERCENT = 25
PROFILER_OVERHEAD_NOTICE = 0.15  # say so when the profiler adds more than this share
ATTENTION_FAMILIES = ("flash-attention", "efficient-attention", "cudnn-attention")
# Ops whose `aten::clone` child lays K/V heads out for grouped-query attention (reshape of an
# expand, as transformers' repeat_kv; repeat_interleave, as SDPA math does with enable_gqa).
LAYOUT_COPY_CALLERS = ("aten::reshape", "aten::repeat_interleave")
DECODE_Q_LEN = 16  # queries per forward at or below which a run is decode-like
KEPT_SCORES = 0.5  # beyond the output, this share of one score matrix means the probabilities were kept
NAME_IN_PROSE = 120  # characters of a trace's name quoted in a sentence
NAME_IN_LIST = 60  # ... in a list of several
MAX_NAMES_IN_PROSE = 3


@dataclass(frozen=True)
class Finding:
    """What a rule found: a short title, the evidence in words, and the numbers behind it."""

    title: str
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Insight:
    """A finding with the name of the rule (from `RULES`) that made it. Plain text, never markup."""

    rule: str
    title: str
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return f"{self.title}: {self.detail}"


@dataclass
class Evidence:
    """Everything a rule may read."""

    trace: Trace
    scope: WindowStats
    kernels: pd.DataFrame
    spec: Any | None = None  # our run's AttentionSpec; None for uploads
    numbers: Mapping[str, Any] = field(default_factory=dict)  # our run's summary (its insights not yet in)
    backward: WindowStats | None = None  # training runs: the `attn_bwd` windows

    @property
    def dtype(self) -> str | None:
        return self.spec.dtype if self.spec else None

    @property
    def device(self) -> str | None:
        return self.spec.device if self.spec else None

    @property
    def unprofiled_ms(self) -> float | None:
        return self.numbers.get("forward_unprofiled_ms")

    @property
    def per(self) -> float:
        return max(self.scope.count, 1)

    @property
    def whole_trace(self) -> bool:
        return self.scope.name == WHOLE_TRACE

    @property
    def unit(self) -> str:
        """How counts are phrased: per forward for our runs, in the trace for an upload."""
        return (
            "in the trace"
            if self.whole_trace
            else f"per {self.scope.name}"
            if self.scope.name != FORWARD
            else "per forward"
        )

    def ops_named(self, *names: str) -> pd.DataFrame:
        return self.scope.ops[self.scope.ops["name"].isin(names)]

    def has_op(self, name: str) -> bool:
        return bool((self.scope.ops["name"] == name).any())


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _tensor_bytes(dims: Any, types: Any) -> int:
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list):
        return 0
    itemsize = ITEMSIZE.get(types[0], 4) if isinstance(types, list) and types else 4
    return int(math.prod(dims[0])) * itemsize


def short(name: Any, limit: int = NAME_IN_PROSE) -> str:
    """A trace's name cut for prose: real CUTLASS names pass 1 kB, hostile ones 100 kB."""
    text = str(name)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _device_copies(scope: WindowStats) -> pd.DataFrame:
    gpu = scope.gpu
    return gpu[gpu["name"].str.startswith("Memcpy DtoD")] if len(gpu) else gpu


def _clone_bytes(clones: pd.DataFrame) -> float:
    return float(sum(_tensor_bytes(d, t) for d, t in zip(clones["input_dims"], clones["input_type"], strict=True)))


def _clones(scope: WindowStats, layout: bool) -> pd.DataFrame:
    """`aten::clone`s in the windows: those that make a layout (GQA's K/V heads), or the others."""
    clones = scope.ops[scope.ops["name"] == "aten::clone"]
    return clones[clones["parent"].isin(LAYOUT_COPY_CALLERS) == layout]


def copied_bytes_per_window(scope: WindowStats) -> float:
    """Bytes a window copies out of place: its DtoD memcpys on a GPU, else its `aten::clone`s (not GQA's)."""
    copies = _device_copies(scope)
    if len(copies):
        return float(copies["bytes"].fillna(0).sum()) / max(scope.count, 1)
    return _clone_bytes(_clones(scope, layout=False)) / max(scope.count, 1)


def hidden_copy(ev: Evidence) -> Finding | None:
    """An out-of-place op copied a whole tensor inside the forward."""
    copies = _device_copies(ev.scope)
    if len(copies):
        per_bytes = copied_bytes_per_window(ev.scope)
        return Finding(
            "Hidden copy",
            f"{len(copies) / ev.per:g} Memcpy DtoD {ev.unit} move {_fmt_bytes(per_bytes)} (an out-of-place op such "
            "as masked_fill cloned its input). Use the in-place masked_fill_ to remove it.",
            {"kernel": "Memcpy DtoD", "per_forward": len(copies) / ev.per, "bytes_per_forward": per_bytes},
        )
    clones = _clones(ev.scope, layout=False)
    if clones.empty:
        return None
    per_bytes = copied_bytes_per_window(ev.scope)
    callers = sorted(set(clones["parent"]) - {""})
    fix = (
        "; the in-place masked_fill_ removes the op and the copy"
        if "aten::masked_fill" in callers
        else "; an in-place version of the caller would remove it"
    )
    named = ", ".join(short(c) for c in callers[:MAX_NAMES_IN_PROSE]) or "the forward"
    return Finding(
        "Hidden copy",
        f"aten::clone runs {len(clones) / ev.per:g}x {ev.unit} and copies {_fmt_bytes(per_bytes)}, "
        f"called by {named} (out of place){fix}.",
        {"op": "aten::clone", "callers": callers, "per_forward": len(clones) / ev.per, "bytes_per_forward": per_bytes},
    )


def mask_rebuilt(ev: Evidence) -> Finding | None:
    """SDPA math (or any forward) building a causal mask on every call."""
    gpu = ev.scope.gpu
    tril_kernels = gpu[gpu["name"].str.contains("triu_tril", regex=False)] if len(gpu) else gpu
    if not (ev.has_op("aten::tril") or ev.has_op("aten::triu") or len(tril_kernels)):
        return None
    ops = ev.ops_named(*MASK_OPS)
    counts = (ops["name"].value_counts() / ev.per).round(2).to_dict()
    return Finding(
        "Mask rebuilt per call",
        f"{len(ops) / ev.per:g} mask ops {ev.unit} ({', '.join(counts)}) build the causal mask inside the forward. "
        "is_causal did not remove the work, it moved it.",
        {"ops_per_forward": counts, "kernels_per_forward": len(tril_kernels) / ev.per},
    )


def safe_softmax(ev: Evidence) -> Finding | None:
    if not ev.has_op("aten::_safe_softmax"):
        return None
    guards = ev.ops_named(*SAFE_SOFTMAX_GUARDS)
    return Finding(
        "Safe softmax",
        "aten::_safe_softmax checks each row for all -inf (isneginf, all, where) so that a fully masked row gives 0 "
        f"instead of NaN; that guard costs {len(guards) / ev.per:g} extra ops {ev.unit}.",
        {"op": "aten::_safe_softmax", "guard_ops_per_forward": len(guards) / ev.per},
    )


def fp32_upcast(ev: Evidence) -> Finding | None:
    """Low-precision inputs computed in float32: no tensor cores on a GPU."""
    if ev.scope.on_gpu:
        return _cuda_core_gemms(ev)
    copies = ev.ops_named("aten::copy_")
    upcasts = copies[
        [
            isinstance(t, list) and len(t) >= 2 and t[0] == "float" and t[1] in LOW_PRECISION_TYPES
            for t in copies["input_type"]
        ]
    ]
    if upcasts.empty:
        return None
    return Finding(
        "FP32 upcast",
        f"{len(upcasts) / ev.per:g} copies {ev.unit} turn {upcasts['input_type'].iloc[0][1]} inputs into float32, "
        "so the matmuls and softmax run in FP32 (on a GPU: sgemm on CUDA cores, no tensor cores).",
        {"op": "aten::_to_copy", "per_forward": len(upcasts) / ev.per},
    )


def _cuda_core_gemms(ev: Evidence) -> Finding | None:
    names = ev.scope.gpu["name"].unique() if len(ev.scope.gpu) else []
    fp32 = [n for n in names if decode(n).tensor_cores is False]
    if not fp32 or ev.dtype not in (None, "bfloat16", "float16"):
        return None
    return Finding(
        "FP32 math, no tensor cores",
        f"{len(fp32)} GEMM/convolution kernel(s) run on CUDA cores ({short(fp32[0])})"
        + (f" although the inputs are {ev.dtype}." if ev.dtype else "."),
        {"kernels": fp32},
    )


def fused(ev: Evidence) -> Finding | None:
    """One kernel (GPU) or one compute op (CPU) per forward does all of attention."""
    scope = ev.scope
    if scope.on_gpu:
        names = scope.gpu["name"].unique() if len(scope.gpu) else []
        attention_kernels = [n for n in names if decode(n).family in ATTENTION_FAMILIES]
        one_per_forward = not ev.whole_trace and len(scope.gpu) == scope.count > 0
        if not (one_per_forward or attention_kernels):
            return None
        name = attention_kernels[0] if attention_kernels else names[0]
        meaning = decode(name).summary
        return Finding(
            "Fused",
            f"one kernel does the whole attention: {short(name)} ({meaning}).",
            {"kernel": name, "meaning": meaning},
        )
    compute = scope.compute_ops
    if ev.whole_trace or scope.count == 0 or len(compute) != scope.count:
        return None
    name = compute["name"].iloc[0]
    if not any(h in name for h in FUSED_OP_HINTS):
        return None
    detail = f"one op does the whole attention: {short(name)}, with no score matrix in memory."
    return Finding("Fused", detail, {"op": name})


def overhead_bound(ev: Evidence) -> Finding | None:
    """Host time per forward vs device time per forward, with the idle gaps between kernels."""
    scope = ev.scope
    if not scope.on_gpu or scope.device_ms is None or not len(scope.gpu):
        return None
    busy_ms = iv.total(iv.union(scope.gpu["ts"], scope.gpu["end"])) / 1e3 / ev.per  # intervals merged: streams overlap
    gap_ms = max(0.0, scope.device_ms - busy_ms)
    if ev.whole_trace:
        busy = 100 * busy_ms / scope.device_ms if scope.device_ms else 0.0
        return Finding(
            "GPU busy",
            f"{busy:.0f}% of the time from its first to its last activity ({scope.device_ms:.3f} ms); "
            f"{gap_ms:.3f} ms with no GPU activity on any stream (see the idle-time breakdown for their causes).",
            {"span_ms": scope.device_ms, "busy_ms": busy_ms, "gap_ms": gap_ms},
        )
    bound = "overhead-bound (the CPU is the bottleneck)" if scope.cpu_ms > scope.device_ms else "device-bound"
    return Finding(
        bound[0].upper() + bound[1:],
        f"{scope.cpu_ms:.3f} ms of CPU {ev.unit} vs {scope.device_ms:.3f} ms on the device, of which {gap_ms:.3f} ms "
        "are gaps between kernels (launch latency).",
        {"cpu_ms": scope.cpu_ms, "device_ms": scope.device_ms, "busy_ms": busy_ms, "gap_ms": gap_ms},
    )


def occupancy(ev: Evidence) -> Finding | None:
    kernels = ev.scope.gpu if len(ev.scope.gpu) else ev.trace.kernels
    kernels = kernels[(kernels["cat"] == "kernel") & kernels["registers"].notna()] if len(kernels) else kernels
    if kernels.empty:
        return None
    device = ev.trace.device_properties[0] if ev.trace.device_properties else None
    driver_launches = set(ev.trace.of_category("cuda_driver")["correlation"].dropna())
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    for name, group in kernels.groupby("name", sort=False):
        row = _kernel_occupancy(name, group, device, driver_launches)
        if row is None:
            continue
        rows.append(row)
        note = _occupancy_note(row)
        if note:
            notes.append(note)
    if not notes:
        return None
    return Finding("Occupancy", "; ".join(notes[:MAX_NAMES_IN_PROSE]) + ".", {"kernels": rows})


def _kernel_occupancy(name: str, group: pd.DataFrame, device: Any, driver_launches: set) -> dict[str, Any] | None:
    first = group.iloc[0]
    threads = int(np.prod(first["block"])) if isinstance(first["block"], list) else 0
    if threads <= 0:
        return None
    theory = theoretical_occupancy(first["registers"], threads, first["shared_memory"] or 0, device)
    measured = group["occupancy"].notna()
    # Weighted by duration, as the TensorBoard plugin's kernel table does (kernel_parser.py).
    weights = group.loc[measured, "dur"]
    achieved = (
        float(np.average(group.loc[measured, "occupancy"], weights=weights))
        if measured.any() and weights.sum() > 0
        else float(group.loc[measured, "occupancy"].mean())
        if measured.any()
        else None
    )
    return {
        "kernel": name,
        "theoretical_percent": theory.percent,
        "achieved_percent": achieved,
        "limiter": theory.limiter,
        "blocks_per_sm": theory.blocks_per_sm,
        "driver_launch": bool(group["correlation"].isin(driver_launches).any()),
    }


def _occupancy_note(row: dict[str, Any]) -> str | None:
    name, percent = short(row["kernel"], NAME_IN_LIST), row["theoretical_percent"]
    if row["achieved_percent"] == 0 and row["driver_launch"]:
        return (
            f"{name} reports 0% achieved occupancy, but it was launched through the driver API "
            "(cuLaunchKernel/cuLaunchKernelEx), which CUPTI does not measure: a measurement gap, not a stall"
        )
    if percent < LOW_OCCUPANCY_PERCENT and decode(row["kernel"]).family in ATTENTION_FAMILIES:
        return (
            f"{name} holds {row['blocks_per_sm']} block(s) per SM ({percent:.0f}% theoretical, limited by "
            f"{row['limiter']}): low occupancy by design, big tiles in registers hide latency"
        )
    if percent < LOW_OCCUPANCY_PERCENT:
        return f"{name} is limited to {percent:.0f}% occupancy by {row['limiter']}"
    return None


def no_kernels(ev: Evidence) -> Finding | None:
    """A trace that should hold kernels but holds none. Checks first that none is truly there."""
    trace = ev.trace
    if len(trace.gpu_activity):
        return None
    launches = len(trace.of_category(*LAUNCH_CATEGORIES))
    expected_gpu = ev.device == "cuda" or launches > 0 or bool(trace.device_properties)
    if not expected_gpu:
        return None
    return Finding(
        "No kernels recorded",
        f"the trace has {launches} CUDA runtime/driver calls but no kernel, memcpy or memset events. Likely causes: "
        "ProfilerActivity.CUDA was not enabled, CUPTI ran in counter (range-profiling) mode, the process lacked "
        "GPU performance-counter permission, or the trace ended before the device was synchronised.",
        {"launch_calls": launches, "kernel_events": 0},
    )


def profiler_overhead(ev: Evidence) -> Finding | None:
    """On CPU the profiler's per-op bookkeeping lands inside the forward it measures."""
    scope = ev.scope
    if ev.unprofiled_ms is None or scope.on_gpu or not scope.count or ev.unprofiled_ms <= 0:
        return None
    ratio = scope.cpu_ms / ev.unprofiled_ms
    if ratio < 1 + PROFILER_OVERHEAD_NOTICE:
        return None
    return Finding(
        "Profiler overhead",
        f"a forward took {scope.cpu_ms:.3f} ms under the profiler but {ev.unprofiled_ms:.3f} ms without it "
        f"(x{ratio:.2f}); its {scope.ops_per_window:g} ops per forward each pay the profiler's bookkeeping, so "
        "compare runs by their unprofiled time.",
        {"profiled_ms": scope.cpu_ms, "unprofiled_ms": ev.unprofiled_ms, "ratio": ratio},
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
        f"{ratio:.1f}x one score matrix ({_fmt_bytes(scores)}): it keeps the probabilities, "
        "q_len x seq_len per head, for the backward; a fused kernel (flash) keeps only the output and "
        "the log-sum-exp and recomputes the rest"
        if ratio >= KEPT_SCORES
        else f"{ratio:.2f}x one score matrix ({_fmt_bytes(scores)}): no score matrix is kept, only the "
        "log-sum-exp (the backward recomputes the scores); math, naive and in-place keep the probabilities"
    )
    return Finding(
        "Backward memory",
        f"the forward left {_fmt_bytes(saved)} allocated for the backward, {_fmt_bytes(output)} of it the "
        f"output; the rest is {kept}.",
        {"saved_for_backward_bytes": saved, "output_bytes": output, "score_matrix_bytes": scores, "ratio": ratio},
    )


def gqa_copy(ev: Evidence) -> Finding | None:
    """Grouped-query attention paid for by copying K and V up to the query heads."""
    copies = _clones(ev.scope, layout=True)
    if copies.empty:
        return None
    per_bytes = _clone_bytes(copies) / ev.per
    callers = sorted(set(copies["parent"]))
    backend = ev.numbers.get("backend_used")
    fix = (
        "SDPA's enable_gqa was on, yet the math backend still repeats K and V; the flash kernel reads the shared "
        "heads in place"
        if backend == "math"
        else "F.scaled_dot_product_attention(..., enable_gqa=True) avoids it where the backend supports it "
        "(the CPU flash kernel does)"
    )
    return Finding(
        "GQA copy",
        f"{len(copies) / ev.per:g} copies {ev.unit} ({', '.join(callers)}) lay out K and V for every query head, "
        f"{_fmt_bytes(per_bytes)} {ev.unit}; {fix}.",
        {"copies_per_forward": len(copies) / ev.per, "bytes_per_forward": per_bytes, "callers": callers},
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
        f"{_fmt_bytes(numbers['bytes_moved'])} at {achieved:.3g} GB/s, {100 * achieved / peak:.0f}% of "
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
    q_len, kv_len = _top_left_causal_lengths(ev)
    if q_len is None or kv_len is None or q_len >= kv_len:
        return None
    missed = kv_len - q_len
    return Finding(
        "Wrong causal alignment",
        f"is_causal=True aligns the mask to the top left, so with {q_len} queries and {kv_len} keys query i sees "
        f"only keys 0..i: the last query misses the newest {missed} keys it should see (the whole cache but the "
        f"first {q_len}). Align to the bottom right: torch.nn.attention.bias.causal_lower_right({q_len}, {kv_len}) "
        "or an explicit mask.",
        {"q_len": q_len, "kv_len": kv_len, "keys_missed_by_last_query": missed},
    )


def _top_left_causal_lengths(ev: Evidence) -> tuple[int | None, int | None]:
    if ev.spec is not None:
        return (ev.spec.q_len, ev.spec.seq_len) if ev.spec.mask == "causal_top_left" else (None, None)
    # An upload: an SDPA call with is_causal=True (its 6th input) and its query and key lengths.
    calls = ev.ops_named("aten::scaled_dot_product_attention")
    if "concrete_inputs" not in calls:
        return None, None
    for dims, concrete in zip(calls["input_dims"], calls["concrete_inputs"], strict=True):
        causal = isinstance(concrete, list) and len(concrete) > 5 and concrete[5] == "True"
        if causal and isinstance(dims, list) and len(dims) > 1 and all(isinstance(d, list) and d for d in dims[:2]):
            return int(dims[0][-2]), int(dims[1][-2])
    return None, None


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


def first_call(ev: Evidence) -> Finding | None:
    """The spec's first call, much slower than the steady state, with its cause."""
    cause = ev.numbers.get("first_call_cause")
    if not cause:
        return None
    first, steady = ev.numbers["first_call_ms"], ev.numbers["forward_unprofiled_ms"]
    return Finding(
        "First call >> steady state",
        f"the first forward took {first:.3f} ms against {steady:.3f} ms once warm (x{first / steady:.1f}): {cause}.",
        {"first_call_ms": first, "steady_ms": steady, "cause": cause},
    )


@dataclass(frozen=True)
class Rule:
    name: str
    applies_to: str  # what it looks for, shown in the README's rule list
    check: Callable[[Evidence], Finding | None]


RULES: tuple[Rule, ...] = (
    Rule("hidden_copy", "aten::clone / Memcpy DtoD inside the forward", hidden_copy),
    Rule("mask_rebuilt", "aten::ones/tril/where or triu_tril_kernel inside the forward", mask_rebuilt),
    Rule("safe_softmax", "aten::_safe_softmax", safe_softmax),
    Rule("fp32_upcast", "copy_ from bf16/fp16 to float; sgemm kernels", fp32_upcast),
    Rule("fused", "one kernel (GPU) or one compute op (CPU) per forward", fused),
    Rule("overhead_bound", "CPU vs device time per forward, kernel gaps", overhead_bound),
    Rule("occupancy", "registers x threads, shared memory, deviceProperties", occupancy),
    Rule("no_kernels", "GPU launches or devices but no kernel events", no_kernels),
    Rule("profiler_overhead", "profiled vs unprofiled forward time (CPU runs)", profiler_overhead),
    Rule("backward_memory", "memory left by attn_fwd for attn_bwd vs one score matrix (training)", backward_memory),
    Rule("gqa_copy", "aten::clone under reshape/repeat_interleave: K and V copied per query head", gqa_copy),
    Rule("decode_bound", "q_len <= 16 against a longer KV: bytes moved, GB/s vs peak, launch overhead", decode_bound),
    Rule("wrong_alignment", "is_causal (top-left) with fewer queries than keys", wrong_alignment),
    Rule("dense_mask_backend", "a dense SDPA mask: the backend that ran and the one refused", dense_mask_backend),
    Rule("first_call", "first forward vs the steady state, with its cause", first_call),
)


def find_insights(
    trace: Trace,
    scope: WindowStats,
    kernels: pd.DataFrame,
    spec: Any | None = None,
    numbers: Mapping[str, Any] | None = None,
    backward: WindowStats | None = None,
) -> list[Insight]:
    """Every rule's insight for this trace, in rule order; `spec` and `numbers` are our run's, if it is one."""
    evidence = Evidence(trace, scope, kernels, spec, numbers or {}, backward)
    return [
        Insight(rule.name, found.title, found.detail, found.evidence)
        for rule in RULES
        if (found := rule.check(evidence)) is not None
    ]
