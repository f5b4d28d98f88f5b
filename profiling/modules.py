"""The Module view: `nn.Module` calls as a tree, with host and device time, self and total.

With `with_stack=True`, torch records each `nn.Module` forward as a `python_function` event named
`nn.Module: <Class>_<n>`, carrying `Python id`, `Python parent id` and `Python module id`. As the
TensorBoard plugin (tb_plugin/torch_tb_profiler/profiler/module_op.py, `_build_module_hierarchy`),
a module's parent is the nearest `nn.Module` event up its chain of Python parent ids, walking
through the plain `python_function` events between them.

Per module call:
- host total: its `dur` (the plugin's `host_duration`, end - start);
- host self: host total minus its child modules' host totals. The plugin's `self_host_duration`
  subtracts every child op too (the op tree's), which leaves ~0 for any module that runs ops; here
  self is the time not spent in child modules, the useful split for a tree of modules;
- device self: the GPU work (kernel, memcpy, memset) of the launches whose op's innermost enclosing
  module (by nesting on its thread) is this call; device total: that plus all descendant modules'.
  The plugin's `device_duration` is the same total; its `self_device_duration` counts only launches
  made directly by the module, outside any op (again ~0), so self here follows the host definition.
Calls are aggregated by module path (`Sequential_0 > Linear_1`), where the plugin aggregates by
(name, module id) under each distinct tree shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiling.launches import first_launches, launch_owners
from profiling.structure import END_SLACK_US, lane_codes, process_codes, propagate_up, structure
from profiling.trace import Trace

MODULE_PREFIX = "nn.Module: "
PATH_SEPARATOR = " > "
MAX_MODULE_ROWS = 500  # module paths shown; the count of all is kept
MAX_PATH_LEVELS = 64  # ancestors named in one path's text
MAX_JUMPS = 64  # pointer-doubling rounds: 2**64 levels, far past any acyclic chain
COLUMNS = [
    "module",
    "path",
    "depth",
    "calls",
    "host total (us)",
    "host self (us)",
    "device total (us)",
    "device self (us)",
]


@dataclass(frozen=True)
class ModuleView:
    """The module table (one row per module path, in tree order) and what it covers."""

    table: pd.DataFrame  # COLUMNS; device columns NaN when the trace has no GPU activity
    module_events: int  # `nn.Module:` python_function events read
    paths: int  # distinct module paths, before the row cap
    note: str  # why the table is empty, or what was cut; "" when neither


@dataclass(frozen=True)
class ModuleCalls:
    """One entry per `nn.Module:` event (module call), in file order."""

    rows: np.ndarray  # event rows in trace.events
    parent: np.ndarray  # index (into these arrays) of the parent module call, -1 for a root
    depth: np.ndarray
    host_total: np.ndarray
    host_self: np.ndarray
    device_total: np.ndarray  # NaN without GPU activity
    device_self: np.ndarray
    by_python_ids: bool  # parents from Python parent ids (False: by nesting on the thread)


def module_calls(trace: Trace) -> ModuleCalls:
    """Every module call with its parent call, depth, and host and device time, self and total."""
    ev = trace.events
    is_python = trace.texts.equals("cat", "python_function") & trace.texts.equals("ph", "X")
    is_module = is_python & trace.texts.isin("name", lambda name: name.startswith(MODULE_PREFIX))
    rows = np.flatnonzero(is_module)
    local = np.full(len(ev), -1, dtype=np.int64)
    local[rows] = np.arange(len(rows))
    by_ids = bool(len(rows)) and not np.isnan(ev["python_parent_id"].to_numpy()[rows]).all()
    parent_row = _python_parents(trace, is_python) if by_ids else structure(trace).parent
    nearest = _nearest_marked(parent_row, is_module)
    above = nearest[np.maximum(parent_row[rows], 0)]
    parent = np.where((parent_row[rows] >= 0) & (above >= 0), local[np.maximum(above, 0)], -1)
    depth = _depths(parent)
    host_total = ev["dur"].to_numpy()[rows].astype(np.float64)
    host_self = host_total - _child_sums(host_total, parent)
    device_self = _device_self(trace, is_module, local, len(rows))
    device_total = propagate_up(device_self, parent, depth)
    if trace.gpu_activity.empty:
        device_self = device_total = np.full(len(rows), np.nan)
    return ModuleCalls(rows, parent, depth, host_total, host_self, device_total, device_self, by_ids)


def module_view(trace: Trace, max_rows: int = MAX_MODULE_ROWS) -> ModuleView:
    """The Module view: module calls aggregated by path, the `max_rows` longest in host time, as a tree."""
    calls = module_calls(trace)
    if not len(calls.rows):
        return ModuleView(pd.DataFrame(columns=COLUMNS), 0, 0, _why_empty(trace))
    names = trace.events["name"].to_numpy()[calls.rows]
    name_code, name_text = pd.factorize(names)
    path, path_parent, path_name = _path_ids(calls.parent, calls.depth, name_code)
    paths = len(path_parent)
    sums = {
        key: np.bincount(path, weights=np.nan_to_num(values), minlength=paths)
        for key, values in (
            ("host total (us)", calls.host_total),
            ("host self (us)", calls.host_self),
            ("device total (us)", calls.device_total),
            ("device self (us)", calls.device_self),
        )
    }
    count = np.bincount(path, minlength=paths)
    depth = np.zeros(paths, dtype=np.int64)
    depth[path] = calls.depth
    first_ts = np.full(paths, np.inf)
    np.minimum.at(first_ts, path, trace.events["ts"].to_numpy()[calls.rows])
    # An ancestor path's host total is at least its descendants' (they run inside it), so the
    # longest paths, ties to the shallower, keep each kept path's ancestors.
    kept = np.lexsort((np.arange(paths), depth, -sums["host total (us)"]))[: max(max_rows, 0)]
    order = _tree_order(kept, path_parent, first_ts)
    short = [str(name_text[c]).removeprefix(MODULE_PREFIX) for c in path_name[order]]
    table = pd.DataFrame(
        {
            "module": short,
            "path": [_path_text(p, path_parent, path_name, name_text) for p in order],
            "depth": depth[order],
            "calls": count[order],
            **{key: values[order] for key, values in sums.items()},
        },
        columns=COLUMNS,
    )
    if trace.gpu_activity.empty:
        table[["device total (us)", "device self (us)"]] = np.nan
    note = f"{len(order):,} of {paths:,} module paths shown (the longest in host time)" if len(order) < paths else ""
    if not calls.by_python_ids:
        note = "; ".join(filter(None, [note, "module events carry no Python parent ids: parents found by nesting"]))
    return ModuleView(table, len(calls.rows), paths, note)


def _why_empty(trace: Trace) -> str:
    """Why a trace has no module tree."""
    if not trace.texts.equals("cat", "python_function").any():
        return "No python_function events: record with torch.profiler.profile(with_stack=True) for the module view."
    return "python_function events but no `nn.Module:` ones: no nn.Module forward was called while profiling."


def _python_parents(trace: Trace, is_python: np.ndarray) -> np.ndarray:
    """Per event: the row of the python_function event its `Python parent id` names, else -1.

    Ids are matched within a process. A parent must enclose its child on the same thread and come
    before it in nesting order (start, longer first, row): ids are data, and a cycle of them would
    otherwise send the walk up the chain round forever.
    """
    ev = trace.events
    rows = np.flatnonzero(is_python)
    out = np.full(len(ev), -1, dtype=np.int64)
    ids, parent_ids = ev["python_id"].to_numpy()[rows], ev["python_parent_id"].to_numpy()[rows]
    process = process_codes(trace)[rows]
    known = ~np.isnan(ids)
    index = pd.MultiIndex.from_arrays([process[known], ids[known]])
    unique = ~index.duplicated()  # a repeated id names its first event
    lookup = pd.Series(rows[known][unique], index=index[unique])
    asked = ~np.isnan(parent_ids)
    found = lookup.reindex(pd.MultiIndex.from_arrays([process[asked], parent_ids[asked]]))
    parent = np.full(len(rows), -1, dtype=np.int64)
    parent[asked] = found.fillna(-1).to_numpy(dtype=np.int64)
    ts, end, lanes = ev["ts"].to_numpy(), ev["end"].to_numpy(), lane_codes(trace)
    rank = np.empty(len(ev), dtype=np.int64)
    rank[np.lexsort((np.arange(len(ev)), -(end - ts), ts))] = np.arange(len(ev))
    p = np.maximum(parent, 0)
    valid = (
        (parent >= 0)
        & (lanes[p] == lanes[rows])
        & (ts[p] <= ts[rows])
        & (end[p] + END_SLACK_US >= end[rows])
        & (rank[p] < rank[rows])
    )
    out[rows[valid]] = parent[valid]
    return out


def _nearest_marked(parent: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """Per node: the nearest marked node at or above it (following `parent`), else -1.

    Pointer doubling: O(n log depth), where a walk per node is O(n x depth). `parent` must be acyclic.
    """
    hop = np.where(marked, np.arange(len(parent)), parent)
    for _ in range(MAX_JUMPS):
        ahead = hop >= 0
        nxt = hop.copy()
        nxt[ahead] = hop[hop[ahead]]
        if np.array_equal(nxt, hop):
            break
        hop = nxt
    return np.where((hop >= 0) & marked[np.maximum(hop, 0)], hop, -1)


def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth of each node of an acyclic parent array, by pointer doubling."""
    ancestor, depth = parent.copy(), (parent >= 0).astype(np.int64)
    for _ in range(MAX_JUMPS):
        going = np.flatnonzero(ancestor >= 0)
        if not len(going):
            break
        depth[going] += depth[ancestor[going]]
        ancestor[going] = ancestor[ancestor[going]]
    return depth


def _child_sums(values: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Per node: the sum of its direct children's values."""
    children = np.flatnonzero(parent >= 0)
    return np.bincount(parent[children], weights=values[children], minlength=len(parent))


def _device_self(trace: Trace, is_module: np.ndarray, local: np.ndarray, calls: int) -> np.ndarray:
    """Per module call: device time of the launches whose op's innermost enclosing module it is."""
    ev = trace.events
    owner = launch_owners(trace)
    launches = first_launches(trace)
    launches = launches[owner[launches] >= 0]
    gpu = trace.gpu_activity.groupby("correlation")["dur"].sum()
    launch_time = gpu.reindex(ev["correlation"].to_numpy()[launches]).fillna(0.0).to_numpy()
    module = _nearest_marked(structure(trace).parent, is_module)[owner[launches]]
    inside = module >= 0
    return np.bincount(local[module[inside]], weights=launch_time[inside], minlength=calls).astype(np.float64)


def _path_ids(parent: np.ndarray, depth: np.ndarray, name_code: np.ndarray) -> tuple[np.ndarray, ...]:
    """Path id of each call (same names from the root down: same id), with each path's parent path and name code.

    Level by level from the roots, a path is (parent path, name): one factorize per level.
    """
    path = np.full(len(parent), -1, dtype=np.int64)
    path_parent: list[np.ndarray] = []
    path_name: list[np.ndarray] = []
    names = int(name_code.max(initial=0)) + 1
    order = np.argsort(depth, kind="stable")
    cuts = np.flatnonzero(np.diff(depth[order])) + 1
    made = 0
    for level in np.split(order, cuts):
        above = np.where(parent[level] >= 0, path[np.maximum(parent[level], 0)], -1)
        codes, firsts = pd.factorize((above + 1) * names + name_code[level])
        path[level] = codes + made
        first = np.zeros(len(firsts), dtype=np.int64)
        first[codes] = np.arange(len(codes))  # any call of each new path (they agree)
        path_parent.append(above[first])
        path_name.append(name_code[level][first])
        made += len(firsts)
    empty = np.zeros(0, dtype=np.int64)
    return path, np.concatenate(path_parent or [empty]), np.concatenate(path_name or [empty])


def _tree_order(kept: np.ndarray, path_parent: np.ndarray, first_ts: np.ndarray) -> np.ndarray:
    """The kept paths depth first, siblings by first call; a path whose parent was cut is a root."""
    kept_set = set(kept.tolist())
    children: dict[int, list[int]] = {}
    roots = []
    for p in kept.tolist():
        up = int(path_parent[p])
        (children.setdefault(up, []) if up in kept_set else roots).append(p)
    out: list[int] = []
    stack = sorted(roots, key=lambda p: -first_ts[p])
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(sorted(children.get(p, []), key=lambda c: -first_ts[c]))
    return np.array(out, dtype=np.int64)


def _path_text(path: int, path_parent: np.ndarray, path_name: np.ndarray, name_text: pd.Index) -> str:
    """`A_0 > B_1 > C_0`, naming at most MAX_PATH_LEVELS levels (the deepest)."""
    parts: list[str] = []
    while path >= 0 and len(parts) < MAX_PATH_LEVELS:
        parts.append(str(name_text[path_name[path]]).removeprefix(MODULE_PREFIX))
        path = int(path_parent[path])
    if path >= 0:
        parts.append("…")
    return PATH_SEPARATOR.join(reversed(parts))
