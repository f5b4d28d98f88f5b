"""Walking up the op tree from a copy to its cause: the cause table, each op's rank in it, and the walk.

The first of `CAUSES` met on the path up from a copy, in the table's order, is its cause (see copy_causes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiling.structure import lane_codes, structure
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
NO_CAUSE = len(CAUSES)  # the rank of an op that is no cause


class Ranks:
    """The cause rank of any event row (`NO_CAUSE` for none), each distinct name ranked once, when first met."""

    def __init__(self, trace: Trace) -> None:
        ev = self.events = trace.events
        self.trace = trace
        self.parent = structure(trace).parent
        self.names = ev["name"].to_numpy()
        complete = trace.texts.equals("ph", "X")
        codes, self.uniques = trace.complete_codes("name")  # shared with step_breakdown.where_value
        self.codes = np.full(len(ev), -1, dtype=np.int64)
        self.codes[trace.complete_rows] = codes
        self.by_code = np.full(len(self.uniques), -1, dtype=np.int64)  # -1: not ranked yet
        self.host = trace.texts.isin("cat", HOST_OP_CATEGORIES) & complete
        op = trace.texts.equals("cat", "cpu_op")
        # The outermost op named in "other (<op>)": an op, never a step or a record_function range.
        steps = np.array([str(u).startswith(STEP_PREFIX) for u in self.uniques] + [False], dtype=bool)
        self.top_op = op & complete & ~steps[self.codes]
        self.copy_op = trace.texts.isin("name", COPY_OPS) & op & complete
        # Per-row ranks the name alone cannot give: a reshape of an expanded tensor.
        self.override = np.full(len(ev), -1, dtype=np.int64)
        self.override[_reshapes_of_expanded(self)] = CAUSES.index("expand_reshape")

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        codes = self.codes[rows]
        known = codes >= 0
        new = np.unique(codes[known][self.by_code[codes[known]] < 0])
        for code in new.tolist():
            self.by_code[code] = _rank_of_name(self.uniques[code])
        ranks = np.where(self.host[rows] & known, self.by_code[np.clip(codes, 0, None)], NO_CAUSE)
        return np.where(self.override[rows] >= 0, self.override[rows], ranks)


def _rank_of_name(name: Any) -> int:
    text = str(name)
    if text in _RANK_OF_OP:
        return _RANK_OF_OP[text]
    if text.startswith(_COLLECTIVE_PREFIXES) or _COLLECTIVE.search(text):
        return CAUSES.index("collective")
    return NO_CAUSE


@dataclass
class Walk:
    """Per start row: the best cause rank on its path up the op tree and the row that gave it, the outermost
    op (`Ranks.top_op`) and the outermost copy op on the path (-1 where none)."""

    rank: np.ndarray
    rank_row: np.ndarray
    top: np.ndarray
    outermost_copy: np.ndarray

    def take(self, at: np.ndarray) -> Walk:
        return Walk(self.rank[at], self.rank_row[at], self.top[at], self.outermost_copy[at])


def walk_up(start: np.ndarray, ranks: Ranks) -> Walk:
    """From each start row (itself included) up the op tree, at most MAX_WALK levels, all starts at once."""
    n = len(start)
    walk = Walk(*(np.full(n, fill, dtype=np.int64) for fill in (NO_CAUSE, -1, -1, -1)))
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


def per_distinct(first: np.ndarray, second: np.ndarray | None, fn: Callable[[Any, Any], Any]) -> np.ndarray:
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


def _reshapes_of_expanded(ranks: Ranks) -> np.ndarray:
    """Rows of the `aten::reshape`s that copied (a clone under them) a tensor the previous `aten::expand` on
    their lane broadcast: same rank, each expanded size 1 or equal, at least one 1 made larger."""
    names, texts = ranks.names, ranks.trace.texts
    above = ranks.parent[np.flatnonzero(ranks.copy_op)]
    reshapes = np.unique(above[above >= 0])
    reshapes = reshapes[names[reshapes] == "aten::reshape"]
    expands = np.flatnonzero(texts.equals("name", "aten::expand") & texts.equals("ph", "X"))
    expand = _previous_on_lane(ranks.trace, reshapes, expands)
    dims = ranks.events["input_dims"].to_numpy()
    found = expand >= 0
    ok = per_distinct(dims[expand[found]], dims[reshapes[found]], _broadcasts).astype(bool)
    return reshapes[found][ok]


def first_shape(dims: Any) -> list[int] | None:
    if isinstance(dims, list) and dims and isinstance(dims[0], list) and all(type(d) is int for d in dims[0]):
        return dims[0]
    return None


def _broadcasts(expanded: Any, reshaped: Any) -> bool:
    """Whether `expand`'s input (first shape of `expanded`) broadcasts to the reshape's input."""
    # Imported here: profiling.insights imports the copy rules, which import this module.
    from profiling.insights.base import MAX_DIMS

    small, big = first_shape(expanded), first_shape(reshaped)
    if small is None or big is None or len(small) != len(big) or len(small) > MAX_DIMS:
        return False
    pairs = list(zip(small, big, strict=True))
    return all(s in (1, b) for s, b in pairs) and any(s == 1 < b for s, b in pairs)
