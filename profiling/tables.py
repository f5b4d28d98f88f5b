"""The op and kernel tables, with units in their headers; empty tables keep their schema."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiling.gpu_metrics import kernel_stats
from profiling.kernels import UNDECODED, decode_most, short_name, short_name_in
from profiling.launches import first_launches, launch_owners
from profiling.names import MAX_NAME_CHARS, cut_name
from profiling.structure import propagate_up, structure
from profiling.trace import LAUNCH_CATEGORIES, Trace
from profiling.windows import WindowStats

OP_COLUMNS = [
    "name",
    "calls",
    "self cpu (us)",
    "total cpu (us)",
    "avg cpu (us)",
    "self device (us)",
    "total device (us)",
    "avg device (us)",
    "kind",  # op, or annotation (record_function ranges, profiler steps): never counted as ops
]
OP = "op"
ANNOTATION = "annotation"
KERNEL_COLUMNS = [
    "kernel",  # a short name: the full one, cut at its template arguments, is the last column
    "kind",
    "count",
    "per forward",
    "total (us)",
    "avg (us)",
    "max (us)",
    "min (us)",
    "grid",
    "block",
    "registers/thread",
    "shared mem (B)",
    "blocks per SM",
    "achieved occupancy (%)",
    "tensor cores",
    "launched by",
    "meaning",
    "name",
    "family",  # the decoder's (profiling/kernels.py): "communication" for collectives, "other" where unknown
    "engine",  # tensor, simt, copy or unknown: what "tensor cores" says yes, no or unknown to
    "precision",  # fp32, tf32, bf16, ... as the name says; None where it does not
]
SHORT_NAME = 60


def merged_into_parent(names: np.ndarray, parent: np.ndarray, children: np.ndarray) -> np.ndarray:
    """Each event's representative: itself, or the ancestor a same-name only child is merged into.

    torch's `EventList._remove_dup_nodes` (torch/autograd/profiler_util.py) and the TensorBoard
    plugin both fold an op whose parent has the same name and no other child (`aten::mul` calling
    `aten::mul` for a scalar) into that parent: one call, with the child's self time and launches.
    """
    rows = np.arange(len(names))
    safe_parent = np.clip(parent, 0, None)
    duplicate = (parent >= 0) & (names == names[safe_parent]) & (children[safe_parent] == 1)
    representative = np.where(duplicate, safe_parent, rows)
    while True:  # chains (a in a in a) resolve to the top; each pass climbs one level
        climbed = representative[representative]
        if np.array_equal(climbed, representative):
            return representative
        representative = climbed


def op_table_from_trace(trace: Trace, with_annotations: bool = False) -> pd.DataFrame:
    """The op table from a trace's `cpu_op` events (and, if asked, its annotations, listed last).

    Self CPU time is an event's duration less its children's; device time is attributed to the op
    that made each launch (self; `launches.launch_owners`) and summed upwards (total). Same-name only
    children are merged into their parent, as torch's `key_averages` does.
    """
    ev = trace.events
    if ev.empty:
        return pd.DataFrame(columns=OP_COLUMNS)
    s = structure(trace)
    parent, has_parent = s.parent, s.parent >= 0
    dur = ev["dur"].to_numpy()
    owner = parent[has_parent]
    child_dur = np.bincount(owner, weights=dur[has_parent], minlength=len(ev))
    self_cpu = np.clip(dur - child_dur, 0, None)
    children = np.bincount(owner, minlength=len(ev))
    # Each per-event array is freed once used: on a 10M-event trace each one is 80 MB.
    del owner, child_dur
    self_device = launched_device_time(trace)
    total_device = propagate_up(self_device, parent, s.depth)
    # Names by their codes (`trace.texts`): equal codes are equal names, compared and grouped as integers.
    names, texts = trace.texts.codes("name")
    representative = merged_into_parent(names, parent, children)
    del children
    self_cpu = np.bincount(representative, weights=self_cpu, minlength=len(ev))
    self_device = np.bincount(representative, weights=self_device, minlength=len(ev))
    is_op = trace.texts.equals("cat", "cpu_op")
    is_kept = is_op | (with_annotations & trace.texts.equals("cat", "user_annotation"))
    keep = is_kept & (representative == np.arange(len(ev))) & (names >= 0)  # a missing name is in no group
    del representative
    keep = np.flatnonzero(keep)
    frame = pd.DataFrame(
        {
            "name": names[keep],
            "is_op": is_op[keep],
            "self_cpu": self_cpu[keep],
            "total_cpu": dur[keep],
            "self_dev": self_device[keep],
            "total_dev": total_device[keep],
        }
    )
    return _aggregate_ops(frame, texts)


def shared_correlation_launches(trace: Trace) -> int:
    """Launch events whose correlation id an earlier launch already has: they get no GPU work."""
    ev = trace.events
    correlation = ev["correlation"].to_numpy()[trace.texts.isin("cat", LAUNCH_CATEGORIES)]
    return int((~np.isnan(correlation)).sum()) - len(first_launches(trace))


def launched_device_time(trace: Trace) -> np.ndarray:
    """Per event: the device time of the GPU work of the launches it made (`launches.launch_owners`: its
    direct runtime/driver children, or on 2021 traces the launches with its external id), each GPU
    event counted once (`launches.first_launches`)."""
    ev = trace.events
    owner = launch_owners(trace)
    gpu = trace.gpu_activity.groupby("correlation")["dur"].sum()
    launches = first_launches(trace)
    launches = launches[owner[launches] >= 0]
    launch_time = gpu.reindex(ev["correlation"].to_numpy()[launches]).fillna(0.0).to_numpy()
    return np.bincount(owner[launches], weights=launch_time, minlength=len(ev))


def _aggregate_ops(frame: pd.DataFrame, texts: np.ndarray) -> pd.DataFrame:
    """One row per (kind, name) of `frame`'s rows, whose names are codes into `texts`."""
    grouped = frame.groupby(["is_op", "name"], sort=False).agg(
        calls=("self_cpu", "size"),
        self_cpu=("self_cpu", "sum"),
        total_cpu=("total_cpu", "sum"),
        self_dev=("self_dev", "sum"),
        total_dev=("total_dev", "sum"),
    )
    table = pd.DataFrame(
        {
            "name": texts[grouped.index.get_level_values("name").to_numpy()],
            "calls": grouped["calls"].to_numpy(),
            "self cpu (us)": grouped["self_cpu"].to_numpy(),
            "total cpu (us)": grouped["total_cpu"].to_numpy(),
            "avg cpu (us)": (grouped["total_cpu"] / grouped["calls"]).to_numpy(),
            "self device (us)": grouped["self_dev"].to_numpy(),
            "total device (us)": grouped["total_dev"].to_numpy(),
            "avg device (us)": (grouped["total_dev"] / grouped["calls"]).to_numpy(),
            "kind": np.where(grouped.index.get_level_values("is_op").to_numpy(dtype=bool), OP, ANNOTATION),
        },
        columns=OP_COLUMNS,
    )
    # Ops first, then annotations; each by self CPU time.
    table = table.assign(_annotation=table["kind"].eq(ANNOTATION))
    table = table.sort_values(["_annotation", "self cpu (us)"], ascending=[True, False], ignore_index=True)
    return table.drop(columns="_annotation")


def _shape(value: object) -> str:
    return "×".join(str(v) for v in value) if isinstance(value, list) else ""


def short_kernel_name(name: str) -> str:
    """`void at::native::elementwise_kernel<128, 2, …>(int, …)` -> `elementwise_kernel` (`kernels.short_name`),
    cut to SHORT_NAME characters."""
    return _cut_short(short_name(name))


def _cut_short(bare: str) -> str:
    return bare if len(bare) <= SHORT_NAME else bare[: SHORT_NAME - 1] + "…"


def kernel_table(trace: Trace, forwards: WindowStats | None = None) -> pd.DataFrame:
    """One row per GPU kernel/memcpy/memset name; `per forward` when forward windows exist.

    Blocks per SM and achieved occupancy are weighted by duration, as the TensorBoard plugin's
    kernel table is (`profiling.gpu_metrics.kernel_stats`).
    """
    gpu = trace.gpu_activity
    if gpu.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    # Only the columns the table reads are grouped: `first` of every column cost a fifth of the table.
    grouped = gpu[["name", "cat", "dur", "grid", "block", "registers", "shared_memory"]].groupby("name", sort=False)
    first = grouped.first()
    names = first.index
    infos = decode_most(gpu["name"], gpu["dur"])  # once per name: the tensor-core column and the meaning read it
    # A name left undecoded shares one placeholder for its meaning and family (nothing built per name).
    decoded = [infos.get(n, UNDECODED) for n in names]
    stats = kernel_stats(trace, {n: d.tensor_cores for n, d in infos.items()}).reindex(names)
    table = pd.DataFrame(
        {
            "kernel": [_cut_short(short_name_in(infos, n)) for n in names],
            "kind": first["cat"].to_numpy(),
            "count": grouped.size().to_numpy(),
            "per forward": 0.0,
            "total (us)": grouped["dur"].sum().to_numpy(),
            "avg (us)": grouped["dur"].mean().to_numpy(),
            "max (us)": grouped["dur"].max().to_numpy(),
            "min (us)": grouped["dur"].min().to_numpy(),
            "grid": first["grid"].map(_shape).to_numpy(),
            "block": first["block"].map(_shape).to_numpy(),
            "registers/thread": first["registers"].to_numpy(),
            "shared mem (B)": first["shared_memory"].to_numpy(),
            "blocks per SM": stats["blocks per SM"].to_numpy(),
            "achieved occupancy (%)": stats["achieved occupancy (%)"].to_numpy(),
            "tensor cores": stats["tensor cores"].fillna("n/a").to_numpy(),
            "launched by": launching_ops(trace).reindex(names).fillna("").to_numpy(),
            "meaning": [d.summary for d in decoded],
            "name": names,
            "family": [d.family for d in decoded],
            "engine": [d.engine for d in decoded],
            "precision": [d.precision for d in decoded],
        },
        columns=KERNEL_COLUMNS,
    )
    if forwards is not None and forwards.count:
        per = forwards.gpu.groupby("name").size() / forwards.count
        table["per forward"] = table["name"].map(per).fillna(0.0).to_numpy()
    return table.sort_values("total (us)", ascending=False, ignore_index=True)


def launching_ops(trace: Trace) -> pd.Series:
    """Per GPU activity name, the op that launched it most often (`launches.launch_owners`); among ops
    tied for most, the one whose launch came first."""
    ev = trace.events
    parent = launch_owners(trace)
    launches = first_launches(trace)
    launches = launches[parent[launches] >= 0]
    names, texts = trace.texts.codes("name")
    op_codes = names[parent[launches]].astype(np.float64)
    op_codes[op_codes < 0] = np.nan  # a missing name is no op
    op_of_launch = pd.Series(op_codes, index=ev["correlation"].to_numpy()[launches])
    gpu = trace.gpu_activity
    op = op_of_launch.reindex(gpu["correlation"].to_numpy()).to_numpy()
    kernel = gpu["name"].cat.codes.to_numpy()
    paired = ~np.isnan(op) & (kernel >= 0)
    if not paired.any():
        return pd.Series(dtype=object)
    # One count per (name, op) in order of first sight, then the largest per name: no Python per name. Codes
    # stand for the texts one to one, so the groups and their order are the texts'.
    counts = (
        pd.Series(np.ones(int(paired.sum()), np.int64))
        .groupby([kernel[paired], op[paired].astype(np.int64)], sort=False)
        .size()
    )
    best = counts.iloc[np.argsort(-counts.to_numpy(), kind="stable")]
    best = best[~best.index.get_level_values(0).duplicated()]
    kernel_names = gpu["name"].cat.categories.to_numpy(dtype=object)[best.index.get_level_values(0).to_numpy()]
    return pd.Series(texts[best.index.get_level_values(1).to_numpy()], index=kernel_names)


# Characters of a trace's string shown in a table cell: the one bound on names (`names.MAX_NAME_CHARS`),
# applied here to the other strings too (categories, lanes, shapes).
NAME_IN_TABLE = MAX_NAME_CHARS


def rounded(table: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """A copy for display: floats rounded, strings from the trace cut to NAME_IN_TABLE characters,
    schema kept (an empty table keeps its columns)."""
    if not len(table):
        return table
    shown = table.round(digits)
    for column in shown.select_dtypes(exclude="number").columns:
        shown[column] = shown[column].map(_cut)
    return shown


def _cut(value: object) -> object:
    return cut_name(value) if isinstance(value, str) else value
