"""The shape of a trace: how events nest, and which ops are compute rather than metadata.

Computed once per trace and cached on it, since every table and window reads it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiling.reader import native_wanted
from profiling.trace import Trace

# Ops that only touch metadata or allocate: never a compute op, on CPU or GPU.
METADATA_OPS = frozenset(
    {
        *("aten::view", "aten::view_as", "aten::_unsafe_view", "aten::_reshape_alias", "aten::reshape"),
        *("aten::as_strided", "aten::as_strided_", "aten::transpose", "aten::t", "aten::permute"),
        *("aten::expand", "aten::expand_as", "aten::select", "aten::slice", "aten::narrow"),
        *("aten::unsqueeze", "aten::squeeze", "aten::flatten", "aten::unflatten", "aten::unbind"),
        *("aten::split", "aten::chunk", "aten::alias", "aten::detach", "aten::detach_", "aten::contiguous"),
        *("aten::resolve_conj", "aten::resolve_neg", "aten::real", "aten::conj", "aten::_conj", "aten::_neg_view"),
        *("aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided"),
        *("aten::scalar_tensor", "aten::lift_fresh", "aten::resize_", "aten::set_", "aten::record_stream"),
        *("aten::result_type", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense"),
    }
)
# Conversions that are metadata work when they move a 0-dim scalar (e.g. `x * 0.125`).
SCALAR_CONVERSIONS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_", "aten::lift_fresh_copy"})


def moves_a_scalar(input_dims: object) -> bool:
    """True when an op's first input is 0-dim, as in the `to` behind `x * 0.125`."""
    return isinstance(input_dims, list) and bool(input_dims) and input_dims[0] == []


def metadata_ops(trace: Trace) -> np.ndarray:
    """Which events only touch metadata or allocate (METADATA_OPS, or a conversion of a scalar)."""
    metadata = trace.texts.isin("name", METADATA_OPS)
    conversions = np.flatnonzero(trace.texts.isin("name", SCALAR_CONVERSIONS))
    dims = trace.events["input_dims"].to_numpy()[conversions]
    metadata[conversions] = np.fromiter((moves_a_scalar(d) for d in dims), bool, len(conversions))
    return metadata


def lanes_of(events: pd.DataFrame) -> np.ndarray:
    """An integer per (pid, tid) lane for each event, numbered in order of first appearance.

    The pair's codes are combined as integers: joining the texts (`pid + "/" + tid`) made a new
    string per event, gigabytes on a big trace, and merged lanes like ("1/2", "3") and ("1", "2/3").
    """
    pid, tid = pd.factorize(events["pid"].to_numpy())[0], pd.factorize(events["tid"].to_numpy())[0]
    return _lanes(events, pid, tid)


def _lanes(events: pd.DataFrame, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """`lanes_of`, from the codes of each event's pid and tid (in order of first sight)."""
    pid, tid = pid.astype(np.int64), tid.astype(np.int64)
    if len(pid) and min(pid.min(), tid.min()) < 0:  # a missing id (not from our reader): as before
        return pd.factorize(events["pid"] + "/" + events["tid"])[0]
    return pd.factorize(pid * (int(tid.max(initial=0)) + 1) + tid)[0]


def nest(events: pd.DataFrame, lanes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Depth and parent row (-1 for none) of each complete event within its (pid, tid) lane.

    An event's parent is the innermost one it starts strictly inside and ends within (as torch
    nests them; see `_walk`). `lanes` is `lanes_of(events)`, passed in when the caller has it.
    """
    # int32: a trace holds at most reader.MAX_EVENTS events, and each per-event array of a big trace is
    # memory held for the whole analysis (25 MB less per array at 3 million events).
    depth = np.full(len(events), -1, dtype=np.int32)
    parent = np.full(len(events), -1, dtype=np.int32)
    complete = events["ph"].to_numpy() == "X"  # a frame of any events: not only a trace's
    if not complete.any():
        return depth, parent
    rows = np.flatnonzero(complete)
    lanes = (lanes_of(events) if lanes is None else lanes)[rows]
    ts, end = events["ts"].to_numpy()[rows], events["end"].to_numpy()[rows]
    order = nesting_order(lanes, ts, end)
    sorted_rows = rows[order]
    parents, depths = nesting_parents_and_depths(lanes[order], ts[order], end[order])  # positions in `order`
    depth[sorted_rows] = depths
    parent[sorted_rows] = np.where(parents >= 0, sorted_rows[np.clip(parents, 0, None)], -1)
    return depth, parent


def nesting_order(lanes: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The events by lane, then start, then the longer first (parents before children): `np.lexsort((-(end -
    ts), ts, lanes))`, sorted by lane and start only, then by length within each run of equal starts alone.

    Sorting every event by length first cost 5x the two keys (lengths are in no order; starts nearly are),
    and equal starts are few. NaN starts sort last on their lane and count as equal, as lexsort has them."""
    order = np.lexsort((ts, lanes))
    lane, start = lanes[order], ts[order]
    tied = (lane[1:] == lane[:-1]) & ((start[1:] == start[:-1]) | (np.isnan(start[1:]) & np.isnan(start[:-1])))
    if not tied.any():
        return order
    # The runs of equal (lane, start) of two or more events, each sorted by its length (stable: ties keep order).
    in_run = np.append(tied, False) | np.insert(tied, 0, False)
    run = np.cumsum(np.insert(~tied, 0, True))[in_run]
    members = order[in_run]
    order[in_run] = members[np.lexsort((-(end[members] - ts[members]), run))]
    return order


WALK_BLOCK = 1 << 18
END_SLACK_US = 1e-3  # 1 ns: how far a child's end may pass its parent's
# Rounds of pointer jumping before the events still climbing are walked instead: a round climbs one level of
# closed ancestors (or doubles a run of closed siblings), and real traces nest ~60 deep at most.
MAX_JUMP_ROUNDS = 64
_CLIMBING = -2  # an event whose parent the jumping left unknown
# Steps an overhang's climb may take, per event of the trace, on the whole; past them the lanes are walked.
CLIMB_STEPS_PER_EVENT = 4


def nesting_parents_and_depths(
    lanes: np.ndarray, starts: np.ndarray, stops: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The parent (a position in nesting order, -1 for none) and depth of each event given in nesting order: by
    the compiled walk where numba is loaded already (`compiled_walk`), else by the whole-array steps below."""
    walked = compiled_walk()
    if walked is not None:
        return walked(lanes, starts, stops, END_SLACK_US)
    parents = nesting_parents(lanes, starts, stops)
    return parents, chain_depths(parents)


def compiled_walk() -> Callable[..., tuple[np.ndarray, np.ndarray]] | None:
    """`native_nest.walked`, the walk in compiled code (~30x the steps below), where the reader would take its
    compiled decoder at no cost to load it (`reader.native_wanted`: numba loaded already, by a big trace's read
    or the app's workers; or PROFILING_NATIVE on); else None. numba is never loaded for the nesting alone."""
    if not native_wanted(0):
        return None
    try:
        from profiling.native_nest import walked
    except ImportError:  # PROFILING_NATIVE on, and no numba
        return None
    return walked


def nesting_parents(lanes: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The parent of each event given in nesting order, as a position in that order (-1 for none): the walk's
    (`_walk`, torch's rule), found by whole-array steps, and a short climb for each event that overhangs.

    The walk's open events before an event are always the event before it, that one's parent, its parent's
    parent, ... (what lies under an open event never changes while it is open). It pops those that ended by
    the event's start (closed: closed for every later event too) and those the event overhangs (ends 1 ns
    past). So every open event before it is on its stack but those popped for an overhang, and none of those
    is the latest open one: whatever overhung it came later and ends later. An event's parent is therefore
    the latest open event before it on its lane (`_open_parents`), unless it overhangs that one; then it
    climbs that one's chain of parents to the first it neither starts after nor overhangs (`_climbed`).
    """
    parents = _open_parents(lanes, starts, stops)
    # NaN and infinite times (the walk's comparisons decide), or still climbing after MAX_JUMP_ROUNDS: walked.
    odd = np.isin(lanes, lanes[~np.isfinite(starts) | ~np.isfinite(stops) | (parents == _CLIMBING)])
    has = np.flatnonzero((parents >= 0) & ~odd)
    unclimbed = _climbed(parents, has[stops[has] > stops[parents[has]] + END_SLACK_US], starts, stops)
    odd |= np.isin(lanes, lanes[unclimbed])
    return _walked(parents, np.flatnonzero(odd), lanes, starts, stops)


def _climbed(parents: np.ndarray, overhangs: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Set the parent of each event of `overhangs` (in order, each the latest open event's overhang) to the
    walk's: down the chain of parents under the one it overhangs, the first it neither starts after the end
    of nor overhangs. The parents it climbs through are the walk's already (overhangs before it are set).
    Climbs at most CLIMB_STEPS_PER_EVENT steps per event of the trace on the whole; returns the overhangs
    left unset past that (a hostile nest thousands deep under each), whose lanes are walked instead."""
    budget = CLIMB_STEPS_PER_EVENT * len(parents)
    for done, at in enumerate(overhangs.tolist()):
        start, stop = float(starts[at]), float(stops[at])
        up = int(parents[parents[at]])
        while up >= 0 and (start >= stops[up] or stop > stops[up] + END_SLACK_US):
            up = int(parents[up])
            budget -= 1
        if budget < 0:
            return overhangs[done:]
        parents[at] = up
    return overhangs[:0]


def _open_parents(lanes: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """For each event, the first still open (stop after its start) of the event before it on its lane, that
    one's parent, ...: each event starts at the one before it and, while that one is closed, jumps to where
    that one has got to (all it skipped closed before it, so before this one too). -1: none open; _CLIMBING:
    not found within MAX_JUMP_ROUNDS."""
    parents = np.full(len(lanes), -1, np.int64)
    same_lane = np.flatnonzero(lanes[1:] == lanes[:-1])
    # An event that starts once every earlier event of its lane has stopped has none open: no jumps (a GPU
    # stream's kernels, one after another, would each double back through its whole run of closed siblings).
    latest_stop = pd.Series(stops, copy=False).groupby(lanes, sort=False).cummax().to_numpy()
    climbing = same_lane[~(starts[same_lane + 1] >= latest_stop[same_lane])] + 1
    parents[climbing] = climbing - 1
    for _ in range(MAX_JUMP_ROUNDS):
        if not len(climbing):
            return parents
        at = parents[climbing]
        closed = starts[climbing] >= stops[at]
        climbing, at = climbing[closed], at[closed]
        parents[climbing] = parents[at]
        climbing = climbing[parents[climbing] >= 0]
    parents[climbing] = _CLIMBING
    return parents


def _walked(
    parents: np.ndarray, walk: np.ndarray, lanes: np.ndarray, starts: np.ndarray, stops: np.ndarray
) -> np.ndarray:
    """`parents` with the events at positions `walk` (whole lanes) walked.
    Python floats and ints from lists: indexing numpy arrays per element costs 3x the loop itself.
    Converted a block at a time: lists of a whole big trace would take ~100 bytes per event."""
    state = _WalkState()
    for at in range(0, len(walk), WALK_BLOCK):
        picked = walk[at : at + WALK_BLOCK]
        found = _walk(lanes[picked].tolist(), starts[picked].tolist(), stops[picked].tolist(), at, state)
        found = np.asarray(found, dtype=np.int64)  # positions in `walk`
        parents[picked] = np.where(found >= 0, walk[np.clip(found, 0, None)], -1)
    return parents


def chain_depths(parents: np.ndarray) -> np.ndarray:
    """How many ancestors each node has, given its parent (-1 for a root; a parent anywhere in the array): by
    pointer jumping, each round adding the count of the ancestor reached and jumping to that one's."""
    depths = (parents >= 0).astype(np.int32)
    up = parents.copy()
    climbing = np.flatnonzero(up >= 0)
    while len(climbing):
        at = up[climbing]
        depths[climbing] += depths[at]
        up[climbing] = up[at]
        climbing = climbing[up[climbing] >= 0]
    return depths


@dataclass
class _WalkState:
    """Where a nesting walk stands between blocks: the lane it is on and its open events, each as
    (stop, stop + END_SLACK_US, position in the nesting order)."""

    lane: int | None = None
    stack: list[tuple[float, float, int]] = field(default_factory=list)


_NONE_OPEN = (math.inf, -math.inf, -1)  # the open event when there is none: adopts nothing, pops nothing


def _walk(lanes: list[int], starts: list[float], stops: list[float], first: int, state: _WalkState) -> list[int]:
    """The parent of each event, given in nesting order (by lane, start, longer first) from position
    `first` of that order; a parent is a position in that order too (-1 for none).

    torch's `EventList._populate_cpu_children` (torch/autograd/profiler_util.py): the open event adopts only
    what starts before it ends and ends by its end. An event that starts where the open one ends is its
    sibling: at 1.7e15 µs float64 rounds to 0.25 µs, so back-to-back ns-resolution events share a timestamp.
    So a zero-length event never adopts anything (a 0 µs launch, the next launch at that µs). Only the end
    gets END_SLACK_US: a child may overhang its parent by a rounding step.

    The loop runs once per event of a big trace, so the open event is kept in locals (its stop, its stop
    plus the slack, its position) rather than read from the stack: 40% less time than indexing the stack.
    """
    parents: list[int] = []
    add_parent = parents.append
    stack, lane_now = state.stack, state.lane
    push, pop = stack.append, stack.pop
    top_stop, top_limit, top_at = stack[-1] if stack else _NONE_OPEN
    for lane, start, stop, at in zip(lanes, starts, stops, range(first, first + len(lanes)), strict=True):
        if lane != lane_now:
            lane_now = lane
            stack.clear()
            top_stop, top_limit, top_at = _NONE_OPEN
        while stack and (start >= top_stop or stop > top_limit):
            pop()
            top_stop, top_limit, top_at = stack[-1] if stack else _NONE_OPEN
        add_parent(top_at)
        top_stop, top_limit, top_at = entry = (stop, stop + END_SLACK_US, at)
        push(entry)
    state.lane = lane_now
    return parents


@dataclass
class Structure:
    """Nesting and compute-leaf flags of every event; computed once per trace."""

    depth: np.ndarray
    parent: np.ndarray
    is_aten: np.ndarray
    compute: np.ndarray  # leaf compute ops (the README's CPU kernel count)


def structure(trace: Trace) -> Structure:
    if trace.derived.structure is not None:
        return trace.derived.structure
    ev = trace.events
    depth, parent = nest(ev, lane_codes(trace))
    is_aten = _is_aten(trace)
    counts_as_compute = (is_aten & ~metadata_ops(trace)).astype(np.float64)
    # A compute op is a leaf: none of its descendants is itself a compute op.
    descendants = propagate_up(counts_as_compute, parent, depth) - counts_as_compute
    result = Structure(depth, parent, is_aten, (counts_as_compute > 0) & (descendants == 0))
    trace.derived.structure = result
    return result


def _is_aten(trace: Trace) -> np.ndarray:
    """`cpu_op` events named `aten::...`; the prefix is tested once per distinct name, not per event."""
    return trace.texts.equals("cat", "cpu_op") & trace.texts.isin("name", lambda name: name.startswith("aten::"))


def propagate_up(values: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Each node's value plus all of its descendants' (deepest level first).

    The nodes are grouped by level once: a scan of the whole array per level cost O(events x depth),
    minutes on a hostile trace of identical intervals nested 100,000 deep.
    """
    total = values.astype(np.float64).copy()
    children = np.flatnonzero(parent >= 0)
    if not len(children):
        return total
    children = children[_deepest_first(depth[children])]
    cuts = np.flatnonzero(np.diff(depth[children])) + 1
    for level in np.split(children, cuts):
        np.add.at(total, parent[level], total[level])
    return total


def _deepest_first(depth: np.ndarray) -> np.ndarray:
    """`np.argsort(-depth, kind="stable")`; by a radix sort where the depths span fewer than 2**16 levels (every
    real trace): numpy sorts 16-bit keys stably in linear time, a quarter of the comparison sort's time here."""
    below = int(depth.max()) - depth
    if int(below.max()) < 2**16:
        below = below.astype(np.uint16)
    return np.argsort(below, kind="stable")


def lane_codes(trace: Trace) -> np.ndarray:
    """An integer per (pid, tid) lane for every event, computed once per trace."""
    if trace.derived.lanes is None:
        pid, tid = trace.texts.codes("pid")[0], trace.texts.codes("tid")[0]
        trace.derived.lanes = _lanes(trace.events, pid, tid).astype(np.int32)
    return trace.derived.lanes


def process_codes(trace: Trace) -> np.ndarray:
    """An integer per process (pid) for every event, computed once per trace."""
    if trace.derived.processes is None:
        trace.derived.processes = trace.texts.codes("pid")[0].astype(np.int32)
    return trace.derived.processes
