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

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiling.insights.base import MAX_DIMS, MAX_TENSOR_BYTES, NAME_IN_PROSE, short, tensor_bytes
from profiling.launches import first_launches, launch_owners
from profiling.step_breakdown import step_names
from profiling.structure import lane_codes, moves_a_scalar, structure
from profiling.trace import STEP_PREFIX, Trace
from profiling.windows import latest_start_on_lane

# The causes in the order they are tried, each with the ops that name it and its fix. The names are stable:
# findings' evidence and docs/rules.md use them. "expand_reshape" and "collective" are found by more than a name.
CAUSE_TABLE: dict[str, tuple[tuple[str, ...], str]] = {
    "masked_fill": (
        ("aten::masked_fill",),
        "use the in-place masked_fill_: the out-of-place aten::masked_fill clones its input first",
    ),
    "contiguous": (
        ("aten::contiguous",),
        "lay Q/K/V out as [batch, heads, seq, head_dim] upstream, or pass SDPA the strided views it accepts",
    ),
    "expand_reshape": (
        (),  # a reshape of a tensor an expand broadcast: `_reshapes_of_expanded`
        "a reshape wrote a broadcast (expand) out: SDPA's enable_gqa=True reads shared K/V heads without repeat_kv",
    ),
    "repeat_interleave": (
        ("aten::repeat_interleave",),
        "broadcast rather than repeat_interleave (SDPA's enable_gqa=True for K/V heads)",
    ),
    "cat": (
        ("aten::cat", "aten::_cat", "aten::concat", "aten::concatenate"),
        "preallocate the result and write into it in place (a static KV cache) rather than cat per step",
    ),
    "repeat": (("aten::repeat",), "expand (a view) rather than repeat where the consumer broadcasts"),
    "index": (
        ("aten::index", "aten::index_select", "aten::gather", "aten::index_put", "aten::index_put_"),
        "slice (a view) where the indices are a range, or index once outside the loop",
    ),
    "to": (
        ("aten::to", "aten::_to_copy"),
        "cast once and keep the dtype through the model; move data to the device once",
    ),
    "sync": (
        ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero"),
        "a host sync, not a copy: keep the value on the device rather than .item() or bool(tensor) in the loop",
    ),
    "collective": (
        (),  # by name: `_COLLECTIVE_PREFIXES`, `_COLLECTIVE`
        "the communication library's staging copy around a collective; usually not actionable",
    ),
}
CAUSES: tuple[str, ...] = tuple(CAUSE_TABLE)
OTHER = "other"  # written "other (<outermost op>)"
OTHER_ADVICE = "an in-place or view form of the op, where one exists, removes the copy"
SYNC = "sync"
LAYOUT_CAUSES = ("expand_reshape", "repeat_interleave")  # copies that lay K/V out per query head
_RANK_OF_OP = {op: CAUSES.index(cause) for cause, (ops, _) in CAUSE_TABLE.items() for op in ops}
# Collectives by name: torch's c10d and functional collectives, NCCL/RCCL/Gloo ranges, vLLM and SGLang's
# custom all-reduce ops. Substrings, since each library spells its own (`vllm::all_reduce`, `nccl:all_gather`).
_COLLECTIVE_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "nccl:", "rccl:", "gloo:")
_COLLECTIVE = re.compile(r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|record_param_comms", re.IGNORECASE)
HOST_OP_CATEGORIES = ("cpu_op", "user_annotation")  # python_function names are file paths, not ops
COPY_OPS = ("aten::clone", "aten::copy_")
# Levels walked up from a copy: real op trees are tens deep; a crafted one 100,000 deep must not cost
# 100,000 passes. A cause above this many levels goes unseen ("other").
MAX_WALK = 64
_NONE = len(CAUSES)  # the rank of an op that is no cause

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
    ranks = _Ranks(trace)
    copy_rows = np.flatnonzero(ranks.copy_op)
    copy_walk = _walk(copy_rows, ranks)
    is_root = copy_walk.outermost_copy == copy_rows
    root_mask = np.zeros(len(ev), dtype=bool)
    root_mask[copy_rows[is_root]] = True

    gpu = trace.gpu_activity
    owners = _owners(trace, gpu)
    gpu_walk = _walk(owners, ranks)
    gpu_root = gpu_walk.outermost_copy
    attached = (gpu_root >= 0) & root_mask[np.clip(gpu_root, 0, None)]
    work = _work_per_root(gpu, owners, np.where(attached, gpu_root, -1), ranks.names)

    roots = copy_rows[is_root]
    scalar = _per_distinct(ev["input_dims"].to_numpy()[roots], None, lambda d, _: moves_a_scalar(d)).astype(bool)
    keep = ~scalar | work["memcpy"].reindex(roots).notna().to_numpy()
    is_memcpy = _names_with(gpu["name"].to_numpy(), "Memcpy", prefix=True)
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


class _Ranks:
    """The cause rank of any event row (`_NONE` for none), each distinct name ranked once, when first met."""

    def __init__(self, trace: Trace) -> None:
        ev = self.events = trace.events
        self.trace = trace
        self.parent = structure(trace).parent
        self.names = ev["name"].to_numpy()
        complete = ev["ph"].to_numpy() == "X"
        cat = ev["cat"].to_numpy()
        factorized = trace.derived.factorized  # shared with step_breakdown.where_value: codes of complete rows
        if "name" not in factorized:
            codes, uniques = pd.factorize(trace.complete_column("name"))
            factorized["name"] = codes.astype(np.int32), uniques
        codes, self.uniques = factorized["name"]
        self.codes = np.full(len(ev), -1, dtype=np.int64)
        self.codes[trace.complete_rows] = codes
        self.by_code = np.full(len(self.uniques), -1, dtype=np.int64)  # -1: not ranked yet
        self.host = np.isin(cat, HOST_OP_CATEGORIES) & complete
        # The outermost op named in "other (<op>)": an op, never a step or a record_function range.
        steps = np.array([str(u).startswith(STEP_PREFIX) for u in self.uniques] + [False], dtype=bool)
        self.top_op = (cat == "cpu_op") & complete & ~steps[self.codes]
        self.copy_op = ev["name"].isin(COPY_OPS).to_numpy() & (cat == "cpu_op") & complete
        # Per-row ranks the name alone cannot give: a reshape of an expanded tensor.
        self.override = np.full(len(ev), -1, dtype=np.int64)
        self.override[_reshapes_of_expanded(self)] = CAUSES.index("expand_reshape")

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        codes = self.codes[rows]
        known = codes >= 0
        new = np.unique(codes[known][self.by_code[codes[known]] < 0])
        for code in new.tolist():
            self.by_code[code] = _rank_of_name(self.uniques[code])
        ranks = np.where(self.host[rows] & known, self.by_code[np.clip(codes, 0, None)], _NONE)
        return np.where(self.override[rows] >= 0, self.override[rows], ranks)


def _rank_of_name(name: Any) -> int:
    text = str(name)
    if text in _RANK_OF_OP:
        return _RANK_OF_OP[text]
    if text.startswith(_COLLECTIVE_PREFIXES) or _COLLECTIVE.search(text):
        return CAUSES.index("collective")
    return _NONE


@dataclass
class _Walk:
    """Per start row: the best cause rank on its path up the op tree and the row that gave it, the outermost
    op (`_Ranks.top_op`) and the outermost copy op on the path (-1 where none)."""

    rank: np.ndarray
    rank_row: np.ndarray
    top: np.ndarray
    outermost_copy: np.ndarray

    def take(self, at: np.ndarray) -> _Walk:
        return _Walk(self.rank[at], self.rank_row[at], self.top[at], self.outermost_copy[at])


def _walk(start: np.ndarray, ranks: _Ranks) -> _Walk:
    """From each start row (itself included) up the op tree, at most MAX_WALK levels, all starts at once."""
    n = len(start)
    walk = _Walk(*(np.full(n, fill, dtype=np.int64) for fill in (_NONE, -1, -1, -1)))
    cur = start.astype(np.int64).copy()
    active = np.flatnonzero(cur >= 0)
    for _ in range(MAX_WALK):
        if not len(active):
            break
        rows = cur[active]
        rank = ranks(rows)
        better = rank < walk.rank[active]
        walk.rank[active[better]], walk.rank_row[active[better]] = rank[better], rows[better]
        top, copy = ranks.top_op[rows], ranks.copy_op[rows]
        walk.top[active[top]] = rows[top]
        walk.outermost_copy[active[copy]] = rows[copy]
        cur[active] = ranks.parent[rows]
        active = active[cur[active] >= 0]
    return walk


def _owners(trace: Trace, gpu: pd.DataFrame) -> np.ndarray:
    """Per GPU event, the row of the op that launched it (through its correlation id), or -1."""
    launches = first_launches(trace)
    by_id = pd.Series(launches, index=trace.events["correlation"].to_numpy()[launches])
    launch = by_id.reindex(gpu["correlation"].to_numpy()).fillna(-1).to_numpy(dtype=np.int64)
    return np.where(launch >= 0, launch_owners(trace)[np.clip(launch, 0, None)], -1)


def _names_with(names: np.ndarray, text: str, prefix: bool = False) -> np.ndarray:
    """Which names start with (or hold) `text`, tested once per distinct name."""
    codes, uniques = pd.factorize(pd.Series(names, dtype=object).astype(str))
    found = [u.startswith(text) if prefix else text in u for u in uniques]
    return np.array(found, dtype=bool)[codes] if len(codes) else np.zeros(0, dtype=bool)


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


def _op_records(trace: Trace, roots: np.ndarray, walk: _Walk, work: pd.DataFrame, ranks: _Ranks) -> pd.DataFrame:
    ev, names = trace.events, ranks.names
    mine = work.reindex(roots)
    has_memcpy = mine["memcpy"].notna().to_numpy()
    op_bytes = _per_distinct(ev["input_dims"].to_numpy()[roots], ev["input_type"].to_numpy()[roots], _bytes_or_nan)
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
    trace: Trace, gpu: pd.DataFrame, orphans: np.ndarray, owners: np.ndarray, walk: _Walk, ranks: _Ranks
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


def _causes(walk: _Walk, own: np.ndarray, names: np.ndarray) -> dict[str, np.ndarray]:
    """`cause` and `cause_op` columns: the best cause on the path, else "other (<outermost op>)", the op being
    the copy's (or launching op's) own name where no op encloses it."""
    found = walk.rank < _NONE
    fallback = np.where(own >= 0, names[np.clip(own, 0, None)], "")
    top_name = np.where(walk.top >= 0, names[np.clip(walk.top, 0, None)], fallback).astype(object)
    labels = {n: f"{OTHER} ({short(n, NAME_IN_PROSE - 8) if n else 'no launching op'})" for n in pd.unique(top_name)}
    other = pd.Series(top_name, dtype=object).map(labels).to_numpy(dtype=object)
    cause = np.where(found, np.array([*CAUSES, ""], dtype=object)[np.minimum(walk.rank, _NONE)], other)
    cause_op = np.where(found, names[np.clip(walk.rank_row, 0, None)], top_name)
    return {"cause": cause, "cause_op": cause_op}


def _bytes_or_nan(dims: Any, types: Any) -> float:
    """The first input's bytes; NaN where the trace gives no shape (no record_shapes) or none that is a tensor."""
    if _first_shape(dims) is None:
        return np.nan
    size = tensor_bytes(dims, types)
    return np.nan if size is None else float(size)


def _per_distinct(first: np.ndarray, second: np.ndarray | None, fn: Callable[[Any, Any], Any]) -> np.ndarray:
    """`fn(a, b)` for each pair of objects, computed once per distinct pair of objects: the reader shares one
    object per distinct Input Dims or Input type value, so that is once per distinct shape, not per event."""
    if not len(first):
        return np.zeros(0, dtype=object)
    ids = np.fromiter(map(id, first), dtype=np.int64, count=len(first))
    other = ids * 0 if second is None else np.fromiter(map(id, second), dtype=np.int64, count=len(second))
    pairs = pd.MultiIndex.from_arrays([ids, other])
    codes, _ = pd.factorize(pairs)
    at = pd.Series(np.arange(len(first))).groupby(codes).first().to_numpy()
    values = [fn(first[i], None if second is None else second[i]) for i in at.tolist()]
    return np.array(values, dtype=object)[codes]


def _previous_on_lane(trace: Trace, rows: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """For each row, the candidate on its lane that started last before it and ended by its start, or -1."""
    ev = trace.events
    if not len(candidates) or not len(rows):
        return np.full(len(rows), -1, dtype=np.int64)
    lanes, ts, end = lane_codes(trace), ev["ts"].to_numpy(), ev["end"].to_numpy()
    at = latest_start_on_lane(lanes[candidates], ts[candidates], lanes[rows], np.nextafter(ts[rows], -np.inf))
    found = candidates[np.clip(at, 0, None)]
    return np.where((at >= 0) & (end[found] <= ts[rows] + 1e-3), found, -1)


def _reshapes_of_expanded(ranks: _Ranks) -> np.ndarray:
    """Rows of the `aten::reshape`s that copied (a clone under them) a tensor the previous `aten::expand` on
    their lane broadcast: same rank, each expanded size 1 or equal, at least one 1 made larger."""
    names, complete = ranks.names, ranks.events["ph"].to_numpy() == "X"
    above = ranks.parent[np.flatnonzero(ranks.copy_op)]
    reshapes = np.unique(above[above >= 0])
    reshapes = reshapes[names[reshapes] == "aten::reshape"]
    expand = _previous_on_lane(ranks.trace, reshapes, np.flatnonzero((names == "aten::expand") & complete))
    dims = ranks.events["input_dims"].to_numpy()
    found = expand >= 0
    ok = _per_distinct(dims[expand[found]], dims[reshapes[found]], _broadcasts).astype(bool)
    return reshapes[found][ok]


def _first_shape(dims: Any) -> list[int] | None:
    if isinstance(dims, list) and dims and isinstance(dims[0], list) and all(type(d) is int for d in dims[0]):
        return dims[0]
    return None


def _broadcasts(expanded: Any, reshaped: Any) -> bool:
    """Whether `expand`'s input (first shape of `expanded`) broadcasts to the reshape's input."""
    small, big = _first_shape(expanded), _first_shape(reshaped)
    if small is None or big is None or len(small) != len(big) or len(small) > MAX_DIMS:
        return False
    pairs = list(zip(small, big, strict=True))
    return all(s in (1, b) for s, b in pairs) and any(s == 1 < b for s, b in pairs)
