"""Copies: the out-of-place copies a trace pays for, and the K/V layout copies of grouped-query attention."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiling.insights.base import (
    MAX_NAMES_IN_PROSE,
    MAX_TENSOR_BYTES,
    Evidence,
    Finding,
    Rule,
    fmt_bytes,
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


def hidden_copy(ev: Evidence) -> Finding | None:
    """An out-of-place op copied a whole tensor inside the forward."""
    copies = _device_copies(ev.scope)
    if len(copies):
        moved, skipped = _copy_bytes(copies)  # what copied_bytes_per_window gives, with the count left out
        per_bytes = moved / ev.per
        return Finding(
            "Hidden copy",
            f"{len(copies) / ev.per:g} Memcpy DtoD {ev.unit} move {fmt_bytes(per_bytes)} (an out-of-place op such "
            "as masked_fill cloned its input). Use the in-place masked_fill_ to remove it.",
            {
                "kernel": "Memcpy DtoD",
                "per_forward": len(copies) / ev.per,
                "bytes_per_forward": per_bytes,
                **left_out(skipped, "Memcpy DtoD", "their bytes arg is negative or 2^63 or more"),
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
        f"aten::clone runs {len(clones) / ev.per:g}x {ev.unit} and copies {fmt_bytes(per_bytes)}, "
        f"called by {named} (out of place){fix}.",
        {
            "op": "aten::clone",
            "callers": callers,
            "per_forward": len(clones) / ev.per,
            "bytes_per_forward": per_bytes,
            **left_out(skipped, "aten::clone call(s)"),
        },
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
        f"{fmt_bytes(per_bytes)} {ev.unit}; {fix}.",
        {
            "copies_per_forward": len(copies) / ev.per,
            "bytes_per_forward": per_bytes,
            "callers": callers,
            **left_out(skipped, "K/V copy call(s)"),
        },
    )


RULES: tuple[Rule, ...] = (
    Rule("hidden_copy", "aten::clone / Memcpy DtoD inside the forward", hidden_copy),
    Rule("gqa_copy", "aten::clone under reshape/repeat_interleave: K and V copied per query head", gqa_copy),
)
