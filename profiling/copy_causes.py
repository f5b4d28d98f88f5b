"""Each copy a trace pays for, blamed on the op that really caused it.

A copy is a `Memcpy` on the GPU, or the outermost `aten::clone` / `aten::copy_` of a nest of them on the host
(`contiguous -> clone -> copy_` is one copy; `aten::contiguous` alone, on a tensor already contiguous, copies
nothing). A memcpy a copy op launched (found through correlation ids) is that op's, not a second copy. From the
copy, or from the op that launched a memcpy no copy op did, the op tree is walked up and the first of `CAUSES`
on the path, in that table's order, is the cause: a clone under `contiguous` under transformers'
`sdpa_attention_forward` is "contiguous", a `copy_` under `vllm::all_reduce` "collective", a 1-byte DtoH under
`aten::item` "sync". None found: "other (<the outermost op on the path>)". A copy of a 0-dim tensor (`x * 0.125`
converts the scalar) is metadata work, unless it moved through a memcpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiling.cause_walk import (
    CAUSE_TABLE,
    CAUSES,
    NO_CAUSE,
    Ranks,
    Walk,
    first_shape,
    per_distinct,
    walk_up,
)
from profiling.insights.base import MAX_TENSOR_BYTES, NAME_IN_PROSE, short, tensor_bytes
from profiling.launches import first_launches, launch_owners
from profiling.step_breakdown import step_names
from profiling.structure import moves_a_scalar
from profiling.trace import Trace, codes_of

OTHER = "other"  # written "other (<outermost op>)"
OTHER_ADVICE = "an in-place or view form of the op, where one exists, removes the copy"
SYNC = "sync"
LAYOUT_CAUSES = ("expand_reshape", "repeat_interleave")  # copies that lay K/V out per query head

PAGEABLE_ADVICE = "pin the host tensor (pin_memory()) and copy with non_blocking=True: pageable memory blocks the copy"
TABLE_COLUMNS = [
    *("row", "kind", "copy", "launching_op", "cause", "cause_op", "bytes", "gpu_us"),
    *("memcpy", "pageable", "host_ts", "ts_us", "step"),
]


def advice(cause: str) -> str:
    """The fix for copies of `cause` (one of CAUSES, or "other (<op>)")."""
    return CAUSE_TABLE[cause][1] if cause in CAUSE_TABLE else OTHER_ADVICE


def copy_table(trace: Trace) -> pd.DataFrame:
    """One row per copy in the trace (TABLE_COLUMNS).

    - `row`: the copy's event (the outermost clone/copy_, or a memcpy no copy op launched); `kind`
      "op" or "memcpy"; `copy`: its memcpy's name where it moved through one, else the op's name.
    - `launching_op`: the op that launched its GPU work (its own name where it launched none).
    - `cause` (CAUSES, or "other (<op>)") and `cause_op`, the op on the path that decided it.
    - `bytes`: its memcpys' `bytes`, else its first input's size from Input Dims and Input type;
      NaN where unknown. `gpu_us`: Σ dur of the GPU activity it launched (0 on a CPU run).
    - `host_ts` (trace µs, for step lookups), `ts_us` (absolute: its GPU work's start, else the op's),
      and `step`, the ProfilerStep around it (None without one).

    Built once per trace (`Derived.copy_table`): the summary and two rules read it.
    """
    if trace.derived.copy_table is None:
        trace.derived.copy_table = _copy_table(trace)
    return trace.derived.copy_table


def _copy_table(trace: Trace) -> pd.DataFrame:
    ev = trace.events
    ranks = Ranks(trace)
    copy_rows = np.flatnonzero(ranks.copy_op)
    copy_walk = walk_up(copy_rows, ranks)
    is_root = copy_walk.outermost_copy == copy_rows
    root_mask = np.zeros(len(ev), dtype=bool)
    root_mask[copy_rows[is_root]] = True

    gpu = trace.gpu_activity
    owners = _owners(trace, gpu)
    gpu_walk = walk_up(owners, ranks)
    gpu_root = gpu_walk.outermost_copy
    attached = (gpu_root >= 0) & root_mask[np.clip(gpu_root, 0, None)]
    work = _work_per_root(gpu, owners, np.where(attached, gpu_root, -1), ranks.names)

    roots = copy_rows[is_root]
    scalar = per_distinct(ev["input_dims"].to_numpy()[roots], None, lambda d, _: moves_a_scalar(d)).astype(bool)
    keep = ~scalar | work["memcpy"].reindex(roots).notna().to_numpy()
    is_memcpy = _names_with(gpu["name"], "Memcpy", prefix=True)
    orphans = np.flatnonzero(is_memcpy & ~attached)
    table = pd.concat(
        [
            _op_records(trace, roots[keep], copy_walk.take(np.flatnonzero(is_root)[keep]), work, ranks),
            _memcpy_records(trace, gpu, orphans, owners[orphans], gpu_walk.take(orphans), ranks),
        ],
        ignore_index=True,
    )
    if table.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in TABLE_COLUMNS})
    table["ts_us"] = table["ts_us"] + trace.ts_base_us
    table["step"] = step_names(trace, table["host_ts"].to_numpy(dtype=np.float64))
    return table[TABLE_COLUMNS]


def group_by_cause(table: pd.DataFrame) -> pd.DataFrame:
    """The copies of `table` grouped by cause: count, bytes (Σ of the known), unknown (how many have no
    size), gpu_us, pageable (how many moved pageable host memory), the most common
    copy, launching op and cause op, the advice, and the worst copy's ts_us and step (most GPU time,
    then most bytes). Ordered by GPU time, then bytes."""
    if table.empty:
        return pd.DataFrame()
    worst = table.sort_values(["gpu_us", "bytes"], ascending=False, kind="stable", na_position="last")
    grouped = table.groupby("cause", sort=False)
    groups = pd.DataFrame(
        {
            "count": grouped.size(),
            "bytes": grouped["bytes"].sum(min_count=1),  # NaN where no copy's size is known
            "unknown": table["bytes"].isna().groupby(table["cause"], sort=False).sum(),
            "gpu_us": grouped["gpu_us"].sum(),
            "pageable": grouped["pageable"].sum(),
        }
    )
    for column in ("copy", "launching_op", "cause_op"):
        groups[column] = _most_common(table, column).reindex(groups.index)
    first = worst.drop_duplicates("cause").set_index("cause")
    groups["ts_us"] = first["ts_us"].reindex(groups.index)
    groups["step"] = first["step"].reindex(groups.index)
    groups["advice"] = [advice(c) for c in groups.index]
    return groups.sort_values(["gpu_us", "bytes"], ascending=False, kind="stable")


def _most_common(table: pd.DataFrame, column: str) -> pd.Series:
    """Per cause, the most common value of `column` (the first met among equals), without a Python call per cause:
    a trace can have as many causes as op names ("other (<op>)")."""
    counts = table.groupby(["cause", column], sort=False).size().reset_index(name="n")
    counts = counts.sort_values("n", ascending=False, kind="stable").drop_duplicates("cause")
    return counts.set_index("cause")[column].astype(str)


def _owners(trace: Trace, gpu: pd.DataFrame) -> np.ndarray:
    """Per GPU event, the row of the op that launched it (through its correlation id), or -1."""
    launches = first_launches(trace)
    by_id = pd.Series(launches, index=trace.events["correlation"].to_numpy()[launches])
    launch = by_id.reindex(gpu["correlation"].to_numpy()).fillna(-1).to_numpy(dtype=np.int64)
    return np.where(launch >= 0, launch_owners(trace)[np.clip(launch, 0, None)], -1)


def _names_with(names: np.ndarray | pd.Series, text: str, prefix: bool = False) -> np.ndarray:
    """Which names start with (or hold) `text`, tested once per distinct name; a missing name holds nothing.
    The GPU frame's Categorical names are factorized from their codes (`trace.codes_of`)."""
    codes, uniques = codes_of(names if isinstance(names, pd.Series) else pd.Series(names, dtype=object))
    found = [isinstance(u, str) and (u.startswith(text) if prefix else text in u) for u in uniques]
    return np.append(np.array(found, dtype=bool), False)[codes]  # code -1 (missing) reads the appended False


def _sizes(gpu: pd.DataFrame, at: np.ndarray) -> np.ndarray:
    """The `bytes` of GPU events, NaN where missing or not a size (negative, 2^63 or more)."""
    size = gpu["bytes"].to_numpy(dtype=np.float64)[at]
    return np.where((size >= 0) & (size <= MAX_TENSOR_BYTES), size, np.nan)


def _work_per_root(gpu: pd.DataFrame, owners: np.ndarray, root: np.ndarray, names: np.ndarray) -> pd.DataFrame:
    """Per copy op, what it launched: GPU µs, memcpy bytes (NaN where a memcpy's is not a size), the first
    memcpy's name, the op that launched its first GPU event, its start, and whether a memcpy moved pageable
    host memory."""
    on = np.flatnonzero(root >= 0)
    name = gpu["name"].to_numpy()[on]
    memcpy = _names_with(name, "Memcpy", prefix=True)
    frame = pd.DataFrame(
        {
            "root": root[on],
            "gpu_us": np.nan_to_num(gpu["dur"].to_numpy(dtype=np.float64)[on]),
            "memcpy_bytes": np.where(memcpy, _sizes(gpu, on), 0.0),
            "bad_size": memcpy & np.isnan(_sizes(gpu, on)),
            "memcpy": np.where(memcpy, name, None),
            "pageable": memcpy & _names_with(name, "Pageable"),
            "owner": np.where(owners[on] >= 0, names[np.clip(owners[on], 0, None)], None),
            "start": gpu["ts"].to_numpy(dtype=np.float64)[on],
        }
    )
    work = frame.groupby("root", sort=False).agg(
        gpu_us=("gpu_us", "sum"),
        memcpy_bytes=("memcpy_bytes", "sum"),
        bad_size=("bad_size", "any"),
        memcpy=("memcpy", "first"),
        pageable=("pageable", "any"),
        owner=("owner", "first"),
        start=("start", "min"),
    )
    work.loc[work["bad_size"], "memcpy_bytes"] = np.nan  # one memcpy of unknown size: the copy's is unknown
    return work


def _op_records(trace: Trace, roots: np.ndarray, walk: Walk, work: pd.DataFrame, ranks: Ranks) -> pd.DataFrame:
    ev, names = trace.events, ranks.names
    mine = work.reindex(roots)
    has_memcpy = mine["memcpy"].notna().to_numpy()
    op_bytes = per_distinct(ev["input_dims"].to_numpy()[roots], ev["input_type"].to_numpy()[roots], _bytes_or_nan)
    ts, start = ev["ts"].to_numpy(dtype=np.float64)[roots], mine["start"].to_numpy(dtype=np.float64)
    return pd.DataFrame(
        {
            "row": roots,
            "kind": "op",
            "copy": np.where(has_memcpy, mine["memcpy"].to_numpy(), names[roots]),
            "launching_op": np.where(mine["owner"].notna(), mine["owner"].to_numpy(), names[roots]),
            **_causes(walk, roots, names),
            "bytes": np.where(has_memcpy, mine["memcpy_bytes"].to_numpy(dtype=np.float64), op_bytes.astype(float)),
            "gpu_us": np.nan_to_num(mine["gpu_us"].to_numpy(dtype=np.float64)),
            "memcpy": mine["memcpy"].to_numpy(),
            "pageable": mine["pageable"].fillna(False).to_numpy(dtype=bool),
            "host_ts": ts,
            "ts_us": np.where(np.isnan(start), ts, start),
        }
    )


def _memcpy_records(
    trace: Trace, gpu: pd.DataFrame, orphans: np.ndarray, owners: np.ndarray, walk: Walk, ranks: Ranks
) -> pd.DataFrame:
    name, ts = gpu["name"].to_numpy()[orphans], gpu["ts"].to_numpy(dtype=np.float64)[orphans]
    launched, at = owners >= 0, np.clip(owners, 0, None)
    return pd.DataFrame(
        {
            "row": gpu.index.to_numpy()[orphans],
            "kind": "memcpy",
            "copy": name,
            "launching_op": np.where(launched, ranks.names[at], ""),
            **_causes(walk, owners, ranks.names),
            "bytes": _sizes(gpu, orphans),
            "gpu_us": np.nan_to_num(gpu["dur"].to_numpy(dtype=np.float64)[orphans]),
            "memcpy": name,
            "pageable": _names_with(name, "Pageable"),
            "host_ts": np.where(launched, trace.events["ts"].to_numpy(dtype=np.float64)[at], ts),
            "ts_us": ts,
        }
    )


def _causes(walk: Walk, own: np.ndarray, names: np.ndarray) -> dict[str, np.ndarray]:
    """`cause` and `cause_op` columns: the best cause on the path, else "other (<outermost op>)", the op being
    the copy's (or launching op's) own name where no op encloses it."""
    found = walk.rank < NO_CAUSE
    fallback = np.where(own >= 0, names[np.clip(own, 0, None)], "")
    top_name = np.where(walk.top >= 0, names[np.clip(walk.top, 0, None)], fallback).astype(object)
    labels = {n: f"{OTHER} ({short(n, NAME_IN_PROSE - 8) if n else 'no launching op'})" for n in pd.unique(top_name)}
    other = pd.Series(top_name, dtype=object).map(labels).to_numpy(dtype=object)
    cause = np.where(found, np.array([*CAUSES, ""], dtype=object)[np.minimum(walk.rank, NO_CAUSE)], other)
    cause_op = np.where(found, names[np.clip(walk.rank_row, 0, None)], top_name)
    return {"cause": cause, "cause_op": cause_op}


def _bytes_or_nan(dims: Any, types: Any) -> float:
    """The first input's bytes; NaN where the trace gives no shape (no record_shapes) or none that is a tensor."""
    if first_shape(dims) is None:
        return np.nan
    size = tensor_bytes(dims, types)
    return np.nan if size is None else float(size)
