"""Attention found on any trace: fused kernels by their names, unfused attention by its ops.

- Fused: kernels whose decoded family is an attention family (`profiling.kernels.ATTENTION_FAMILIES`).
- Unfused: a *match*, on one thread and under one parent op (Python stack frames skipped), is a GEMM
  whose first input has 3+ dimensions (bmm, matmul, baddbmm, einsum), then a softmax, then a GEMM whose
  first input has the softmax's shape, with only elementwise or metadata ops between them. Its GPU
  time is every kernel launched by the match's ops or by ops nested under them.

Everything is vectorised over the events; Python loops run over distinct names and distinct shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiling.kernels import ATTENTION_FAMILIES, MAX_NAMES_DECODED, decode
from profiling.launches import first_launches, launch_owners
from profiling.occupancy import whole_number
from profiling.step_breakdown import step_at
from profiling.structure import METADATA_OPS, lane_codes, structure
from profiling.trace import LAUNCH_CATEGORIES, Trace

GEMM_OPS = ("aten::bmm", "aten::matmul", "aten::baddbmm", "aten::einsum")
SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::_masked_softmax")
# What may sit between the GEMMs and the softmax of one attention: scaling, masking, soft-capping,
# dropout, casts. Anything else (a norm, a linear, a custom op) means the sequence is something else.
ELEMENTWISE_OPS = frozenset(
    {
        *("aten::div", "aten::div_", "aten::mul", "aten::mul_", "aten::add", "aten::add_", "aten::sub", "aten::sub_"),
        *("aten::rsub", "aten::neg", "aten::tanh", "aten::tanh_", "aten::clamp", "aten::clamp_", "aten::clamp_min"),
        *("aten::masked_fill", "aten::masked_fill_", "aten::where", "aten::fill_", "aten::type_as", "aten::clone"),
        *("aten::dropout", "aten::dropout_", "aten::native_dropout", "aten::feature_dropout", "aten::alpha_dropout"),
        *("aten::to", "aten::_to_copy", "aten::copy_", "aten::lift_fresh_copy"),
    }
)
BETWEEN_OPS = ELEMENTWISE_OPS | METADATA_OPS
MHA_OP = "aten::_native_multi_head_attention"
SDPA_MATH_OP = "aten::_scaled_dot_product_attention_math"
# Ops that are attention by name: SDPA and its backends, nn.MultiheadAttention's fast path, serving stacks.
ATTENTION_OPS = frozenset(
    {
        *("aten::scaled_dot_product_attention", SDPA_MATH_OP),
        *("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"),
        *("aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention"),
        *("aten::_scaled_dot_product_fused_attention_overrideable", "aten::_flash_attention_forward"),
        *("aten::_efficient_attention_forward", MHA_OP),
        *("vllm::unified_attention", "vllm::unified_attention_with_output", "sglang::unified_attention_with_output"),
    }
)
NEED_WEIGHTS_INPUT = 10  # need_weights' position in _native_multi_head_attention's Concrete Inputs
MAX_DIMS = 64
LARGEST_DIM = 2**63 - 1
_OTHER, _BETWEEN, _GEMM, _SOFTMAX = 0, 1, 2, 3


@dataclass(frozen=True)
class AttentionFound:
    """The attention in one trace: fused kernels per name, and the unfused matches with their GPU time."""

    kernel_us: float  # Σ dur of every kernel
    kernel_events: int
    fused: pd.DataFrame  # per fused kernel name: family, count, total_us (most time first)
    matches: pd.DataFrame  # per match: its ops' rows and names, shapes, GPU time (most GPU time first)
    unfused_us: float  # Σ dur of the kernels the matches launched that are not fused kernels themselves
    attention_ops: bool  # an SDPA, MHA or serving attention op is in the trace

    @property
    def fused_us(self) -> float:
        return float(self.fused["total_us"].sum())

    @property
    def kind(self) -> str:
        fused, unfused = self.fused_us > 0, self.unfused_us > 0
        return "mixed" if fused and unfused else "fused" if fused else "unfused" if unfused else "none"

    @property
    def present(self) -> bool:
        """Whether the trace shows attention at all: kernels, a match (on any device), or an attention op."""
        return self.attention_ops or len(self.matches) > 0 or len(self.fused) > 0


def attention_keys(trace: Trace) -> dict[str, Any]:
    """The summary keys `attention_time_us`, `attention_time_percent` and `attention_kind`; None without kernels."""
    found = attention_found(trace)
    if not found.kernel_events:
        return {"attention_time_us": None, "attention_time_percent": None, "attention_kind": None}
    total = found.fused_us + found.unfused_us
    return {
        "attention_time_us": total,
        "attention_time_percent": 100.0 * total / found.kernel_us if found.kernel_us > 0 else None,
        "attention_kind": found.kind,
    }


def attention_found(trace: Trace) -> AttentionFound:
    """Fused attention kernels and unfused matches in `trace` (see the module's docstring); found once per
    trace, as the summary and every attention rule ask."""
    if trace.derived.attention is None:
        trace.derived.attention = _find(trace)
    return trace.derived.attention


def _find(trace: Trace) -> AttentionFound:
    kernels = trace.kernels
    fused = fused_kernels(kernels)
    matches, match_of_gpu, softmax_gpu = unfused_matches(trace)
    gpu = trace.gpu_activity
    is_kernel = gpu["cat"].to_numpy() == "kernel"
    not_fused = ~gpu["name"].isin(fused.index).to_numpy()
    unfused_us = float(np.nansum(gpu["dur"].to_numpy()[(match_of_gpu >= 0) & is_kernel & not_fused]))
    # Each match's GPU time (kernels, memcpys, memsets), and its softmax's.
    dur, at = np.nan_to_num(gpu["dur"].to_numpy()), match_of_gpu >= 0
    soft = at & softmax_gpu
    matches = matches.assign(
        gpu_us=np.bincount(match_of_gpu[at], weights=dur[at], minlength=len(matches)),
        softmax_us=np.bincount(match_of_gpu[soft], weights=dur[soft], minlength=len(matches)),
    ).sort_values("gpu_us", ascending=False, kind="stable")
    attention_ops = bool((trace.texts.equals("cat", "cpu_op") & trace.texts.isin("name", ATTENTION_OPS)).any())
    return AttentionFound(
        kernel_us=float(np.nansum(kernels["dur"].to_numpy())),
        kernel_events=len(kernels),
        fused=fused,
        matches=matches,
        unfused_us=unfused_us,
        attention_ops=attention_ops,
    )


def fused_kernels(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per kernel name whose decoded family is an attention family: family, count and total µs."""
    per_name = kernels.groupby("name", sort=False)["dur"].agg(["count", "sum"])
    per_name = per_name.sort_values("sum", ascending=False, kind="stable").head(MAX_NAMES_DECODED)
    families = [decode(str(name)).family for name in per_name.index]
    per_name = per_name.assign(family=families).rename(columns={"sum": "total_us"})
    return per_name[per_name["family"].isin(ATTENTION_FAMILIES)][["family", "count", "total_us"]]


MATCH_COLUMNS = ["first", "softmax", "second", "start", "parent", "first_shape", "scores_shape", "second_shape", "span"]


def unfused_matches(trace: Trace) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The matches (one row each, `MATCH_COLUMNS`), and per GPU activity event: the match whose ops
    launched it (-1 for none), and whether the match's softmax did."""
    ev = trace.events
    gpu_count = len(trace.gpu_activity)
    none = pd.DataFrame(columns=MATCH_COLUMNS), np.full(gpu_count, -1), np.zeros(gpu_count, dtype=bool)
    host = trace.texts.isin("cat", ("cpu_op", "user_annotation"))
    rows = np.flatnonzero(host & trace.texts.equals("ph", "X"))
    codes, distinct = trace.texts.of_rows("name", rows)
    kind = np.array([_kind_of(name) for name in distinct], dtype=np.int8)[codes] if len(rows) else codes
    if not (kind == _SOFTMAX).any():
        return none
    parent = nearest(structure(trace).parent, host)  # the op or annotation around each event, Python frames skipped
    lanes = lane_codes(trace)[rows].astype(np.int64)
    group = lanes * (int(parent.max(initial=0)) + 2) + parent[rows] + 1
    order = np.lexsort((rows, ev["ts"].to_numpy()[rows], group))
    rows, kind, group = rows[order], kind[order], group[order]
    before, after = _neighbours(kind, group)
    soft = np.flatnonzero((kind == _SOFTMAX) & (before >= 0) & (after >= 0))
    gemms = (kind[before[soft]] == _GEMM) & (kind[after[soft]] == _GEMM)
    soft = soft[gemms]
    found = _shaped(trace, rows, (before[soft], soft, after[soft]), parent)
    if found is None:
        return none
    positions, table = found
    match_of_gpu, softmax_gpu = _gpu_of_matches(trace, rows, positions, table)
    return table, match_of_gpu, softmax_gpu


def _kind_of(name: str) -> int:
    if name in SOFTMAX_OPS:
        return _SOFTMAX
    if name in GEMM_OPS:
        return _GEMM
    return _BETWEEN if name in BETWEEN_OPS else _OTHER


def _neighbours(kind: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position: the nearest earlier and later positions in its group that are not elementwise or
    metadata ops (-1 where there is none)."""
    n = len(kind)
    stops = kind != _BETWEEN
    at = np.arange(n)
    before = np.maximum.accumulate(np.where(stops, at, -1))
    before = np.concatenate(([-1], before[:-1]))
    after = np.minimum.accumulate(np.where(stops, at, n)[::-1])[::-1]
    after = np.concatenate((after[1:], [n]))
    first = np.where((before >= 0) & (group[np.clip(before, 0, None)] == group), before, -1)
    later = np.clip(after, 0, n - 1)
    second = np.where((after < n) & (group[later] == group), after, -1)
    return first, second


def _shaped(
    trace: Trace, rows: np.ndarray, candidates: tuple[np.ndarray, np.ndarray, np.ndarray], parent: np.ndarray
) -> tuple[np.ndarray, pd.DataFrame] | None:
    """The candidates (positions of GEMM, softmax, GEMM in `rows`) whose first GEMM has a 3+-dimensional
    input and whose second GEMM's first input has the softmax's shape: the positions of every op of each
    match, and the matches' table."""
    first, soft, second = candidates
    if not len(soft):
        return None
    ev = trace.events
    at = rows[np.concatenate((first, soft, second))]
    codes, shapes = _shape_codes(ev["name"].to_numpy()[at], ev["input_dims"].to_numpy()[at])
    triples = codes.reshape(3, -1).T  # per candidate: the codes of its first GEMM, softmax, second GEMM
    distinct, which = np.unique(triples, axis=0, return_inverse=True)
    matching = np.fromiter(
        (_is_match(shapes[a], shapes[b], shapes[c]) for a, b, c in distinct.tolist()), bool, len(distinct)
    )
    keep = matching[which.ravel()]
    if not keep.any():
        return None
    kept = np.flatnonzero(keep)
    first, soft, second = first[kept], soft[kept], second[kept]
    table = pd.DataFrame(
        {
            "first": rows[first],
            "softmax": rows[soft],
            "second": rows[second],
            "start": ev["ts"].to_numpy()[rows[first]],
            "parent": parent[rows[soft]],
            **{
                column: [shapes[code] for code in triples[kept, i].tolist()]
                for i, column in enumerate(MATCH_COLUMNS[5:8])
            },
            "span": second - first + 1,
        }
    )
    # Each match's ops: every position from its first GEMM to its second.
    lengths = table["span"].to_numpy()
    offsets = np.repeat(first - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return offsets + np.arange(lengths.sum()), table


def _shape_codes(names: np.ndarray, dims: np.ndarray) -> tuple[np.ndarray, list[tuple[int, ...] | None]]:
    """Per op, a code into the distinct shapes of first tensor inputs (None where the trace gives none).

    Parsed once per distinct Input Dims object (the reader shares one object per distinct value), and
    per way of reading it (einsum's differs): a trace can hold a million softmaxes, but few shapes."""
    ids = np.fromiter(map(id, dims), np.uint64, len(dims))  # in C: no Python step per op
    einsum = names == "aten::einsum"
    codes = np.empty(len(dims), dtype=np.int64)
    shapes: list[tuple[int, ...] | None] = []
    for is_einsum in (False, True):
        mine = np.flatnonzero(einsum == is_einsum)
        _, first_of, inverse = np.unique(ids[mine], return_index=True, return_inverse=True)
        codes[mine] = inverse.ravel() + len(shapes)
        shapes.extend(_first_tensor(is_einsum, dims[mine[i]]) for i in first_of.tolist())
    return codes, shapes


def _first_tensor(einsum: bool, dims: Any) -> tuple[int, ...] | None:
    """The first tensor's shape from an op's Input Dims, if it is one; einsum's first input is its equation,
    and its tensors follow as a list."""
    if not isinstance(dims, list) or not dims:
        return None
    shape = dims[0]
    if einsum:
        shape = dims[1][0] if len(dims) > 1 and isinstance(dims[1], list) and dims[1] else None
    if not isinstance(shape, list) or not 0 < len(shape) <= MAX_DIMS:
        return None
    if not all(whole_number(d, LARGEST_DIM, smallest=0) for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _is_match(first: tuple[int, ...] | None, scores: tuple[int, ...] | None, second: tuple[int, ...] | None) -> bool:
    return first is not None and len(first) >= 3 and _same_scores(scores, second)


def _same_scores(scores: tuple[int, ...] | None, second: tuple[int, ...] | None) -> bool:
    """The second GEMM reads the softmax's output: the same shape, or a view of it that keeps the score
    matrix's last two dimensions and flattens the batch and heads (`nn.MultiheadAttention`'s bmm)."""
    if scores is None or second is None:
        return False
    if scores == second:
        return True
    return scores[-2:] == second[-2:] and math.prod(scores) == math.prod(second)


def _gpu_of_matches(
    trace: Trace, rows: np.ndarray, positions: np.ndarray, table: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU activity event: the match whose ops (or ops nested under them) launched it, and whether
    that op was the match's softmax."""
    ev = trace.events
    member = np.full(len(ev), -1, dtype=np.int64)
    member[rows[positions]] = np.repeat(np.arange(len(table)), table["span"].to_numpy())
    is_softmax = np.zeros(len(ev), dtype=bool)
    is_softmax[table["softmax"].to_numpy()] = True
    gpu = trace.gpu_activity
    launches = first_launches(trace)
    owners = launch_owners(trace)[launches]
    owned = owners >= 0
    launches, owners = launches[owned], owners[owned]
    inside = nearest(structure(trace).parent, member >= 0, include_self=True)[owners]
    found = inside >= 0
    correlation = ev["correlation"].to_numpy()[launches[found]]
    op = pd.Series(inside[found], index=correlation)
    op_of_gpu = op.reindex(gpu["correlation"].to_numpy()).fillna(-1).to_numpy(dtype=np.int64)
    at = op_of_gpu >= 0
    match_of_gpu = np.where(at, member[np.clip(op_of_gpu, 0, None)], -1)
    return match_of_gpu, at & is_softmax[np.clip(op_of_gpu, 0, None)]


def nearest(parent: np.ndarray, stop: np.ndarray, include_self: bool = False) -> np.ndarray:
    """Per event, its nearest ancestor (or itself, with `include_self`) where `stop` holds; -1 for none.

    Pointer jumping: each pass doubles how far a pointer has looked, so a tree nested d deep takes
    log2(d) vectorised passes, never a Python step per event.
    """
    pointer = parent.copy()
    while True:
        active = np.flatnonzero(pointer >= 0)
        active = active[~stop[pointer[active]]]
        if not len(active):
            break
        pointer[active] = pointer[pointer[active]]
    return np.where(stop, np.arange(len(parent)), pointer) if include_self else pointer


def step_of_launch(trace: Trace, correlation: float) -> str | None:
    """The ProfilerStep holding the host launch of the GPU work with this correlation id, or None."""
    ev = trace.events
    launch = (ev["correlation"].to_numpy() == correlation) & trace.texts.isin("cat", LAUNCH_CATEGORIES)
    starts = ev["ts"].to_numpy()[launch]
    return step_at(trace, float(starts[0])) if len(starts) else None


def need_weights(trace: Trace, row: int) -> bool:
    """Whether the op at `row` is `_native_multi_head_attention` called with need_weights=True."""
    ev = trace.events
    if row < 0 or ev["name"].iloc[row] != MHA_OP:
        return False
    concrete = ev["concrete_inputs"].iloc[row]
    return isinstance(concrete, list) and len(concrete) > NEED_WEIGHTS_INPUT and concrete[NEED_WEIGHTS_INPUT] == "True"
