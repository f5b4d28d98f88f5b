"""What a trace teaches, found automatically. Each rule is a row in `RULES`.

A rule reads one `Evidence` (the ops and GPU activity inside the forwards, or inside the
whole trace for an upload) and returns an `Insight`, a sentence plus the numbers behind it,
or None when it does not apply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.gpu_metrics import DeviceIndex, device_ids, device_index, valid_blocks_per_sm, valid_occupancy
from profiling.kernels import decode
from profiling.occupancy import block_threads, device_limits, theoretical_occupancy, whole_number
from profiling.tables import shared_correlation_launches
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
# Distinct GPU activity names a rule decodes, those with the most time: a trace can hold 20,000
# names, and decoding each costs tens of microseconds in every rule that did it.
MAX_NAMES_DECODED = 1000
MAX_NOTES = 10  # notes on skipped values kept in a finding's evidence (their count is kept whole)
# Bytes one tensor or copy can hold: sizes are int64 in torch, and no device has 2^63 bytes.
MAX_TENSOR_BYTES = 2**63 - 1
MAX_DIMS = 64  # dimensions of one tensor (torch's own limit is lower)


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


def _tensor_bytes(dims: Any, types: Any) -> int | None:
    """Bytes of an op's first input from its `Input Dims` and `Input type`: 0 where the trace gives no
    shape, None where what it gives is no tensor (dims that are not whole numbers, more than 2^63 bytes,
    a type that is not a name)."""
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list):
        return 0
    if isinstance(types, list) and types:
        if not isinstance(types[0], str):
            return None
        itemsize = ITEMSIZE.get(types[0], 4)
    else:
        itemsize = 4
    shape = dims[0]
    if len(shape) > MAX_DIMS or not all(whole_number(d, MAX_TENSOR_BYTES, smallest=0) for d in shape):
        return None
    size = itemsize
    for d in shape:  # exact integers, stopping as soon as the tensor could not exist
        size *= int(d)
        if size > MAX_TENSOR_BYTES:
            return None
    return size


def short(name: Any, limit: int = NAME_IN_PROSE) -> str:
    """A trace's name cut for prose: real CUTLASS names pass 1 kB, hostile ones 100 kB."""
    text = str(name)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _device_copies(scope: WindowStats) -> pd.DataFrame:
    gpu = scope.gpu
    return gpu[gpu["name"].str.startswith("Memcpy DtoD")] if len(gpu) else gpu


def _clone_bytes(clones: pd.DataFrame) -> tuple[float, int]:
    """Bytes the clones copy, and how many were left out for a shape or type that is no tensor."""
    sizes: dict[tuple[int, int], int | None] = {}  # the reader shares one object per distinct value
    total, skipped = 0, 0
    for d, t in zip(clones["input_dims"], clones["input_type"], strict=True):
        key = (id(d), id(t))
        if key not in sizes:
            sizes[key] = _tensor_bytes(d, t)
        size = sizes[key]
        if size is None:
            skipped += 1
        else:
            total += size
    return float(total), skipped


def _left_out(count: int, what: str, why: str = "their Input Dims or Input type describe no tensor") -> dict:
    """Evidence that says what was left out of a finding's numbers, and why; nothing when nothing was."""
    return {"note": f"{count} {what} left out: {why}"} if count else {}


def _copy_bytes(copies: pd.DataFrame) -> tuple[float, int]:
    """Bytes the memcpys move, and how many give a size that cannot be true (negative, 2^63 bytes or more)."""
    sizes = copies["bytes"].to_numpy(dtype=np.float64)
    valid = (sizes >= 0) & (sizes <= MAX_TENSOR_BYTES)
    return float(sizes[valid].sum()), int((~valid & ~np.isnan(sizes)).sum())


def _clones(scope: WindowStats, layout: bool) -> pd.DataFrame:
    """`aten::clone`s in the windows: those that make a layout (GQA's K/V heads), or the others."""
    clones = scope.ops[scope.ops["name"] == "aten::clone"]
    return clones[clones["parent"].isin(LAYOUT_COPY_CALLERS) == layout]


def copied_bytes_per_window(scope: WindowStats) -> float:
    """Bytes a window copies out of place: its DtoD memcpys on a GPU, else its `aten::clone`s (not GQA's).
    A size that cannot be true (negative, 2^63 bytes or more, no tensor) counts as unknown, not as bytes."""
    copies = _device_copies(scope)
    if len(copies):
        return _copy_bytes(copies)[0] / max(scope.count, 1)
    return _clone_bytes(_clones(scope, layout=False))[0] / max(scope.count, 1)


def hidden_copy(ev: Evidence) -> Finding | None:
    """An out-of-place op copied a whole tensor inside the forward."""
    copies = _device_copies(ev.scope)
    if len(copies):
        moved, skipped = _copy_bytes(copies)  # what copied_bytes_per_window gives, with the count left out
        per_bytes = moved / ev.per
        return Finding(
            "Hidden copy",
            f"{len(copies) / ev.per:g} Memcpy DtoD {ev.unit} move {_fmt_bytes(per_bytes)} (an out-of-place op such "
            "as masked_fill cloned its input). Use the in-place masked_fill_ to remove it.",
            {
                "kernel": "Memcpy DtoD",
                "per_forward": len(copies) / ev.per,
                "bytes_per_forward": per_bytes,
                **_left_out(skipped, "Memcpy DtoD", "their bytes arg is negative or 2^63 or more"),
            },
        )
    clones = _clones(ev.scope, layout=False)
    if clones.empty:
        return None
    copied, skipped = _clone_bytes(clones)  # what copied_bytes_per_window gives, with the count left out
    per_bytes = copied / ev.per
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
        {
            "op": "aten::clone",
            "callers": callers,
            "per_forward": len(clones) / ev.per,
            "bytes_per_forward": per_bytes,
            **_left_out(skipped, "aten::clone call(s)"),
        },
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


def _names_decoded(gpu: pd.DataFrame) -> tuple[list[str], bool]:
    """The distinct names a rule decodes, in order of first appearance: the MAX_NAMES_DECODED with the
    most time; and whether others were left out."""
    if not len(gpu):
        return [], False
    per_name = gpu.groupby("name", sort=False)["dur"].sum()
    if len(per_name) <= MAX_NAMES_DECODED:
        return per_name.index.tolist(), False
    keep = np.zeros(len(per_name), dtype=bool)
    keep[np.argsort(-per_name.to_numpy(), kind="stable")[:MAX_NAMES_DECODED]] = True
    return per_name.index[keep].tolist(), True


def _cuda_core_gemms(ev: Evidence) -> Finding | None:
    if ev.dtype not in (None, "bfloat16", "float16"):
        return None
    names, cut = _names_decoded(ev.scope.gpu)
    fp32 = [n for n in names if decode(n).tensor_cores is False]
    if not fp32:
        return None
    among = f" among the {MAX_NAMES_DECODED:,} kernels with the most time" if cut else ""
    return Finding(
        "FP32 math, no tensor cores",
        f"{len(fp32)} GEMM/convolution kernel(s){among} run on CUDA cores ({short(fp32[0])})"
        + (f" although the inputs are {ev.dtype}." if ev.dtype else "."),
        {"kernels": fp32},
    )


def fused(ev: Evidence) -> Finding | None:
    """One kernel (GPU) or one compute op (CPU) per forward does all of attention."""
    scope = ev.scope
    if scope.on_gpu:
        names, _ = _names_decoded(scope.gpu)
        attention_kernels = [n for n in names if decode(n).family in ATTENTION_FAMILIES]
        one_per_forward = not ev.whole_trace and len(scope.gpu) == scope.count > 0
        if not (one_per_forward or attention_kernels):
            return None
        name = attention_kernels[0] if attention_kernels else scope.gpu["name"].iloc[0]
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
    """Theoretical occupancy per kernel name (its first launch's shape), achieved beside it; a note for the
    first few that are low. Computed once per distinct shape and device, never once per name in Python."""
    kernels = ev.scope.gpu if len(ev.scope.gpu) else ev.trace.kernels
    kernels = kernels[(kernels["cat"] == "kernel") & kernels["registers"].notna()] if len(kernels) else kernels
    if kernels.empty:
        return None
    per_name = _per_kernel_name(kernels, ev.trace)
    rows, skipped, device_notes = _occupancy_rows(per_name, device_index(ev.trace))
    notes = []
    for row in rows:
        note = _occupancy_note(row)
        if note:
            notes.append(note)
            if len(notes) == MAX_NAMES_IN_PROSE:  # the prose names no more, so no more names are decoded
                break
    if not notes:
        return None
    evidence: dict[str, Any] = {"kernels": rows}
    if skipped:
        evidence["skipped"] = skipped[:MAX_NOTES]
        evidence["skipped_count"] = len(skipped)
    if device_notes:
        evidence["device_notes"] = device_notes[:MAX_NOTES]
    return Finding("Occupancy", "; ".join(notes) + ".", evidence)


def _per_kernel_name(kernels: pd.DataFrame, trace: Trace) -> pd.DataFrame:
    """One row per kernel name, in order of first launch: that launch's shape and device, the achieved
    occupancy weighted by duration (the plugin's kernel table, kernel_parser.py; a plain mean where the
    launches took no time; impossible values left out, as `gpu_metrics.valid_occupancy` says), and
    whether any launch went through the driver API."""
    codes, names = pd.factorize(kernels["name"].to_numpy())
    first = np.unique(codes, return_index=True)[1]
    n = len(names)
    occ = valid_occupancy(kernels["occupancy"].to_numpy())
    dur = kernels["dur"].to_numpy()
    measured = ~np.isnan(occ)
    at = codes[measured]
    count = np.bincount(at, minlength=n)
    weight = np.bincount(at, weights=dur[measured], minlength=n)
    weighted = np.bincount(at, weights=(occ * dur)[measured], minlength=n)
    plain = np.bincount(at, weights=occ[measured], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        achieved = np.where(weight > 0, weighted / weight, np.where(count > 0, plain / count, np.nan))
    driver = trace.of_category("cuda_driver")["correlation"].dropna().to_numpy()
    by_driver = np.bincount(codes, weights=kernels["correlation"].isin(driver).to_numpy(), minlength=n) > 0
    return pd.DataFrame(
        {
            "kernel": names,
            "block": kernels["block"].to_numpy()[first],
            "registers": kernels["registers"].to_numpy()[first],
            "shared_memory": np.nan_to_num(kernels["shared_memory"].to_numpy()[first], nan=0.0),
            "device": device_ids(kernels.iloc[first]),
            "achieved": np.minimum(achieved, 100.0),  # rounding only: a mean of values in 0..100
            "driver_launch": by_driver,
        }
    )


def _occupancy_rows(per_name: pd.DataFrame, index: DeviceIndex) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The insight's row per kernel name; a note per name left out (a shape no launch can have, or one
    that fits no block on the device described); and the notes on unusable `deviceProperties` fields.
    Each distinct shape on a device is computed once."""
    devices: dict[float | None, tuple[dict[str, int], list[str]]] = {}
    shapes: dict[tuple[int, float, float, float], tuple[Any, str | None]] = {}
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name, block, registers, shared, number, achieved, driver in per_name.itertuples(index=False):
        device = None if np.isnan(number) else float(number)
        if device not in devices:  # a kernel on a device the trace does not list is read against its first
            devices[device] = device_limits(index.entry(device) or index.entry(None))
        limits = devices[device][0]
        key = (id(block), registers, shared, device)  # the reader shares one object per distinct block
        if key not in shapes:
            shapes[key] = _shape_occupancy(block, registers, shared, limits)
        theory, why = shapes[key]
        if why:
            skipped.append(f"{short(name, NAME_IN_LIST)}: {why}")
        if theory is None:
            continue
        rows.append(
            {
                "kernel": name,
                "theoretical_percent": theory.percent,
                "achieved_percent": None if np.isnan(achieved) else float(achieved),
                "limiter": theory.limiter,
                "blocks_per_sm": theory.blocks_per_sm,
                "driver_launch": bool(driver),
            }
        )
    device_notes = list(dict.fromkeys(note for _, notes in devices.values() for note in notes))
    return rows, skipped, device_notes


def _shape_occupancy(block: Any, registers: float, shared: float, limits: dict[str, int]) -> tuple[Any, str | None]:
    """The theoretical occupancy of one launch shape, or None and why it was left out (None: no shape)."""
    threads, why = block_threads(block, limits["maxThreadsPerBlock"])
    if threads is None:
        return None, why
    theory = theoretical_occupancy(registers, threads, shared, limits)
    if theory.blocks_per_sm == 0:  # it ran, so the shape or the device described is not what ran
        return None, f"not one block of it fits on an SM of the device described (by {theory.limiter})"
    return theory, None


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
    copied, skipped = _clone_bytes(copies)
    per_bytes = copied / ev.per
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
        {
            "copies_per_forward": len(copies) / ev.per,
            "bytes_per_forward": per_bytes,
            "callers": callers,
            **_left_out(skipped, "K/V copy call(s)"),
        },
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
    q_len, kv_len, skipped = _top_left_causal_lengths(ev)
    if q_len is None or kv_len is None or q_len >= kv_len:
        return None
    missed = kv_len - q_len
    return Finding(
        "Wrong causal alignment",
        f"is_causal=True aligns the mask to the top left, so with {q_len} queries and {kv_len} keys query i sees "
        f"only keys 0..i: the last query misses the newest {missed} keys it should see (the whole cache but the "
        f"first {q_len}). Align to the bottom right: torch.nn.attention.bias.causal_lower_right({q_len}, {kv_len}) "
        "or an explicit mask.",
        {
            "q_len": q_len,
            "kv_len": kv_len,
            "keys_missed_by_last_query": missed,
            **_left_out(skipped, "causal SDPA call(s)", "their Input Dims give no query and key lengths"),
        },
    )


def _top_left_causal_lengths(ev: Evidence) -> tuple[int | None, int | None, int]:
    """Query and key lengths of the first causal SDPA call, and how many causal calls give no usable lengths."""
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
        elif found is None:
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


def impossible_values(ev: Evidence) -> Finding | None:
    """Values the trace gives that cannot be true, and what every table and metric did instead."""
    trace = ev.trace
    shared = shared_correlation_launches(trace)
    occupancy = trace.kernels["occupancy"].to_numpy()
    bad_occupancy = ~np.isnan(occupancy) & np.isnan(valid_occupancy(occupancy))
    blocks = trace.kernels["blocks_per_sm"].to_numpy()
    bad_blocks = ~np.isnan(blocks) & np.isnan(valid_blocks_per_sm(blocks))
    found = []
    if shared:
        found.append(
            f"{shared} launch event(s) reuse the correlation id of an earlier launch, which CUPTI never does: the "
            "GPU work with that id is counted once, for the first launch, not once per launch"
        )
    if bad_occupancy.any():
        found.append(
            f"{bad_occupancy.sum()} kernel event(s) give an est. achieved occupancy outside 0..100% (from "
            f"{occupancy[bad_occupancy].min():.4g} to {occupancy[bad_occupancy].max():.4g}): left out of every "
            "occupancy figure, as a missing value is"
        )
    if bad_blocks.any():
        found.append(
            f"{bad_blocks.sum()} kernel event(s) give a negative or larger-than-any-grid blocks per SM: left out, "
            "as a missing value is"
        )
    if not found:
        return None
    return Finding(
        "Impossible values left out",
        "; ".join(found) + ".",
        {
            "launches_sharing_correlation": shared,
            "occupancy_out_of_range": int(bad_occupancy.sum()),
            "blocks_per_sm_out_of_range": int(bad_blocks.sum()),
        },
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
    Rule(
        "impossible_values",
        "shared correlation ids, occupancy outside 0..100%, impossible blocks per SM",
        impossible_values,
    ),
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
