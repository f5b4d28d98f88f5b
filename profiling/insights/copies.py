"""Copies: the out-of-place copies a trace pays for, each blamed on its cause, and the K/V layout copies of
grouped-query attention."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

# The module, not its names: copy_causes reads insights.base, so whichever of the two is imported first,
# this import meets a module still being initialised; its names are read only when a rule runs.
from profiling import copy_causes
from profiling.insights.base import (
    MAX_EVIDENCE_ITEMS,
    MAX_NAMES_IN_PROSE,
    MAX_TENSOR_BYTES,
    Evidence,
    Finding,
    Rule,
    fmt_bytes,
    gpu_share,
    left_out,
    short,
    tensor_bytes,
)
from profiling.windows import WindowStats

# Ops whose `aten::clone` child lays K/V heads out for grouped-query attention (reshape of an
# expand, as transformers' repeat_kv; repeat_interleave, as SDPA math does with enable_gqa).
LAYOUT_COPY_CALLERS = ("aten::reshape", "aten::repeat_interleave")


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
            sizes[key] = tensor_bytes(d, t)
        size = sizes[key]
        if size is None:
            skipped += 1
        else:
            total += size
    return float(total), skipped


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


def _copies(ev: Evidence) -> pd.DataFrame:
    """The copies inside the evidence's windows (`copy_causes.copy_table`): copy ops among its ops, memcpys no
    copy op launched among its GPU activity."""
    table = copy_causes.copy_table(ev.trace)
    if table.empty:
        return table
    is_op = table["kind"].to_numpy() == "op"
    inside = np.where(is_op, table["row"].isin(ev.scope.ops.index), table["row"].isin(ev.scope.gpu.index))
    return table[inside]


def _worst(copies: pd.DataFrame) -> dict[str, Any]:
    """Where to find the copy with the most GPU time (then the most bytes): its absolute ts_us and its step."""
    worst = copies.sort_values(["gpu_us", "bytes"], ascending=False, kind="stable", na_position="last").iloc[0]
    return {"ts_us": worst["ts_us"], "step": worst["step"]}


def _gpu_percent(ev: Evidence, copies: pd.DataFrame) -> float | None:
    """Share of GPU time the copies' GPU work took; None where they launched none (a CPU run, host tensors)."""
    launched = (copies["gpu_us"] > 0).any() or copies["memcpy"].notna().any()
    return gpu_share(ev, float(copies["gpu_us"].sum())) if launched else None


UNKNOWN_SIZE = "their size is not in the trace (no tensor in Input Dims, or a bytes arg that is no size)"


def _cause_sentence(cause: str, group: pd.Series, ev: Evidence) -> str:
    fix = group["advice"] + (f"; {copy_causes.PAGEABLE_ADVICE}" if group["pageable"] else "")
    unknown = int(group["unknown"])
    if unknown == group["count"]:
        size = "of a size the trace does not give"
    else:
        size = fmt_bytes(group["bytes"] / ev.per) + (f" (and {unknown} of unknown size)" if unknown else "")
    where = f"caused by {short(group['cause_op'])} ({cause})"
    return f"{short(group['copy'])} {group['count'] / ev.per:g}x {ev.unit} copies {size}, {where}: {fix}"


def hidden_copy(ev: Evidence) -> Finding | None:
    """Copies inside the forward (or the trace), grouped by the op that caused them, each cause with its fix.

    A host sync's one-value read (`.item()`) is no hidden copy, and GQA's K/V layout copies are
    `gqa_copy`'s where that rule has its evidence: each copy is told once.
    """
    copies = _copies(ev)
    if copies.empty:
        return None
    syncs = int((copies["cause"] == copy_causes.SYNC).sum())
    hidden = copies[copies["cause"] != copy_causes.SYNC]
    if gqa_heads(ev) is not None:
        hidden = hidden[~hidden["cause"].isin(copy_causes.LAYOUT_CAUSES)]
    if hidden.empty:
        return None
    groups = copy_causes.group_by_cause(hidden)
    told = [_cause_sentence(cause, group, ev) for cause, group in groups.head(MAX_NAMES_IN_PROSE).iterrows()]
    more = len(groups) - len(told)
    detail = "; ".join(told) + (f"; {more} more cause(s) in the evidence" if more else "") + "."
    if syncs:
        detail += f" Left out: {syncs} read(s) of one value by a host sync (.item() and the like), not hidden copies."
    unknown = int(groups["unknown"].sum())
    return Finding(
        "Hidden copy",
        detail,
        {
            "per_forward": len(hidden) / ev.per,
            "bytes_per_forward": float(groups["bytes"].sum()) / ev.per,
            "causes": {
                str(cause): {
                    **{k: group[k] for k in ("count", "bytes", "gpu_us", "copy", "launching_op", "cause_op")},
                    **{k: group[k] for k in ("pageable", "advice", "ts_us", "step")},
                }
                for cause, group in groups.head(MAX_EVIDENCE_ITEMS).iterrows()
            },
            **_worst(hidden),
            **({"syncs_not_counted": syncs} if syncs else {}),
            **left_out(unknown, "copy(ies)", UNKNOWN_SIZE),
        },
        _gpu_percent(ev, hidden),
    )


# Attention ops whose Input Dims give Q, K and V first, and the axis of their heads in each.
HEAD_AXIS: dict[str, int] = {
    **dict.fromkeys(
        (
            "aten::scaled_dot_product_attention",
            "aten::_scaled_dot_product_attention_math",
            "aten::_scaled_dot_product_flash_attention",
            "aten::_scaled_dot_product_flash_attention_for_cpu",
            "aten::_scaled_dot_product_efficient_attention",
            "aten::_scaled_dot_product_cudnn_attention",
            "aten::_scaled_dot_product_fused_attention_overrideable",
        ),
        -3,  # [batch, heads, seq, head_dim]
    ),
    # [batch, seq, heads, head_dim], and vLLM's [tokens, heads, head_dim]
    **dict.fromkeys(("aten::_flash_attention_forward", "aten::_efficient_attention_forward"), -2),
    **dict.fromkeys(("vllm::unified_attention", "vllm::unified_attention_with_output"), -2),
}


def gqa_heads(ev: Evidence) -> dict[str, Any] | None:
    """Evidence of grouped-query attention: our run's spec (kv_heads < heads), or an attention op (HEAD_AXIS)
    anywhere in the trace whose K has fewer heads than its Q in Input Dims. None where neither shows it."""
    if ev.spec is not None:
        heads = int(ev.spec.heads)
        kv_heads = int(ev.spec.kv_heads or heads)
        return {"source": "spec", "heads": heads, "kv_heads": kv_heads} if kv_heads < heads else None
    events = ev.trace.events
    attention = events[ev.trace.texts.isin("name", HEAD_AXIS) & ev.trace.texts.equals("cat", "cpu_op")]
    seen: set[tuple[str, int]] = set()  # the reader shares one Input Dims object per distinct value
    for name, dims in zip(attention["name"], attention["input_dims"], strict=True):
        if (name, id(dims)) in seen:
            continue
        seen.add((name, id(dims)))
        heads = _heads(dims, HEAD_AXIS[name])
        if heads is not None and heads[1] < heads[0]:
            return {"source": short(name), "heads": heads[0], "kv_heads": heads[1]}
    return None


def _heads(dims: Any, axis: int) -> tuple[int, int] | None:
    """(Q heads, K heads) from an attention op's Input Dims, None where they are not two shapes with heads."""
    if not isinstance(dims, list) or len(dims) < 2:
        return None
    q, k = dims[0], dims[1]
    shapes = (q, k)
    if not all(isinstance(s, list) and len(s) >= -axis and all(type(d) is int for d in s) for s in shapes):
        return None
    return (q[axis], k[axis]) if k[axis] > 0 else None


def gqa_copy(ev: Evidence) -> Finding | None:
    """Grouped-query attention paid for by copying K and V up to the query heads: the trace (or our spec) shows
    fewer K/V heads than query heads, and copies laid them out (expand + reshape, repeat_interleave)."""
    heads = gqa_heads(ev)
    if heads is None:
        return None
    copies = _copies(ev)
    if copies.empty:
        return None
    layout = copies[copies["cause"].isin(copy_causes.LAYOUT_CAUSES)]
    if layout.empty:
        return None
    known = layout["bytes"].to_numpy(dtype=np.float64)
    per_bytes = float(np.nansum(known)) / ev.per
    callers = sorted(set(layout["cause_op"]))
    if ev.numbers.get("backend_used") == "math":
        fix = (
            "SDPA's enable_gqa was on, yet the math backend still repeats K and V; the flash kernel reads the shared "
            "heads in place"
        )
    elif ev.gpu_time_us > 0:
        fix = (
            "F.scaled_dot_product_attention(..., enable_gqa=True) reads the shared heads in place where the "
            "backend supports it"
        )
    else:
        fix = (
            "F.scaled_dot_product_attention(..., enable_gqa=True) avoids it where the backend supports it "
            "(the CPU flash kernel does)"
        )
    return Finding(
        "GQA copy",
        f"{len(layout) / ev.per:g} copies {ev.unit} ({', '.join(short(c) for c in callers)}) lay out K and V for "
        f"every query head ({heads['kv_heads']} K/V heads, {heads['heads']} query heads), {fmt_bytes(per_bytes)} "
        f"{ev.unit}; {fix}.",
        {
            "copies_per_forward": len(layout) / ev.per,
            "bytes_per_forward": per_bytes,
            "callers": callers,
            "heads": heads["heads"],
            "kv_heads": heads["kv_heads"],
            "heads_from": heads["source"],
            **_worst(layout),
            **left_out(int(np.isnan(known).sum()), "K/V copy call(s)"),
        },
        _gpu_percent(ev, layout),
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "hidden_copy",
        "Memcpys and aten::clone/copy_ inside the forward, each blamed on the op above it (copy_causes.CAUSES)",
        hidden_copy,
    ),
    Rule(
        "gqa_copy",
        "fewer K/V heads than query heads (the spec, or an attention op's Input Dims) and copies that lay K/V out "
        "per query head (expand + reshape, repeat_interleave)",
        gqa_copy,
    ),
)
