"""The Memory view, for traces recorded with `profile_memory=True`: the TensorBoard plugin's three parts.

Its events are `[memory]` instant events (ph "i") with `Bytes` (negative: a free), `Total Allocated`,
`Total Reserved`, `Device Type` (0 CPU, 1 CUDA), `Device Id` and `Addr`. The definitions follow the
plugin's tb_plugin/torch_tb_profiler/profiler/memory_parser.py (pytorch/kineto), with these differences:
- an event belongs to the innermost `cpu_op` of its (pid, tid) lane that holds its ts in [start, end);
  the plugin keys lanes by tid alone and drops an event whose innermost host node is no operator (a
  user annotation, a python function), where this one gives it to the op around that node;
- allocations and frees pair by (device type, device id, address), the plugin by address alone, so an
  address reused on two devices is never one allocation here;
- a HIP device (ROCm) is a GPU here; the plugin names CUDA devices only and skips the others;
- tables are capped (MAX_ROWS, largest first) and keep the full count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiling.structure import lane_codes, nest, propagate_up
from profiling.trace import Trace

MEMORY_EVENT = "[memory]"
EXACT_ADDR = 2**53  # float64 holds every integer up to here
MAX_DEVICES = 64  # devices the op table covers, those with the most memory events
MAX_ROWS = 1000  # rows of a table kept (largest first); the count of all rows is kept beside it
CPU, CUDA, HIP = 0, 1, 6  # Device Type (c10::DeviceType); ROCm traces write HIP for the GPU
OP_COLUMNS = [
    "device",
    "name",
    "calls",
    "self_alloc_count",
    "self_alloc_bytes",
    "self_increase_bytes",
    "alloc_count",
    "alloc_bytes",
    "increase_bytes",
]
EVENT_COLUMNS = ["device", "op", "bytes", "addr", "alloc_ts", "release_ts", "duration"]


@dataclass
class MemoryView:
    """The Memory view of one trace; every ts is in µs from the trace's `ts_base_us`, as `trace.events.ts`.

    curves: one row per memory event, by device then ts: device, ts, allocated, reserved (bytes).
    peaks: one row per device: device, peak_allocated, peak_ts (the first ts at the peak), peak_reserved.
    ops: per (device, op name), OP_COLUMNS; `self_*` counts the events the op holds itself, the others
      add its descendant ops'; increase = bytes allocated - bytes freed. Sorted by alloc_bytes.
    events: the allocations (and frees whose allocation is outside the trace), EVENT_COLUMNS; release_ts
      and duration are NaN where the allocation is not freed within the trace. Largest first.
    """

    curves: pd.DataFrame
    peaks: pd.DataFrame
    ops: pd.DataFrame
    op_count: int
    events: pd.DataFrame
    event_count: int


def has_memory(trace: Trace) -> bool:
    """Whether the trace holds `[memory]` events (it was recorded with profile_memory=True)."""
    return bool(_memory_rows(trace).size)


def memory_view(trace: Trace, max_rows: int = MAX_ROWS) -> MemoryView | None:
    """The Memory view of `trace`, or None when it holds no `[memory]` events."""
    rows = _memory_rows(trace)
    if not rows.size:
        return None
    ev = trace.events
    mem = pd.DataFrame(
        {
            "row": rows,
            "device": device_names(ev["device_type"].to_numpy()[rows], ev["device_id"].to_numpy()[rows]),
            "ts": ev["ts"].to_numpy()[rows],
            "bytes": ev["alloc_bytes"].to_numpy()[rows],
            "allocated": ev["total_allocated"].to_numpy()[rows],
            "reserved": ev["total_reserved"].to_numpy()[rows],
            "addr": ev["addr"].to_numpy()[rows],
        }
    )
    mem = mem[mem["device"].notna() & np.isfinite(mem["ts"]) & np.isfinite(mem["bytes"])]
    mem = mem.sort_values(["ts", "row"], kind="stable").reset_index(drop=True)
    owned = _owning_ops(trace, mem["row"].to_numpy())
    owner = np.full(len(mem), -1, np.int64)  # rows of the trace
    held = owned.owner >= 0
    owner[held] = owned.ops[owned.owner[held]]
    op = np.full(len(mem), None, dtype=object)
    op[held] = ev["name"].to_numpy()[owner[held]]
    mem["op"] = op
    curves, peaks = _curves(mem)
    ops = _op_table(trace, mem, owned)
    events = _event_table(mem)
    top_ops = ops.sort_values(["alloc_bytes", "device", "name"], ascending=[False, True, True], kind="stable")
    top_events = events.sort_values(["bytes", "alloc_ts"], ascending=[False, True], kind="stable")
    return MemoryView(
        curves,
        peaks,
        top_ops.head(max_rows).reset_index(drop=True),
        len(ops),
        top_events.head(max_rows).reset_index(drop=True),
        len(events),
    )


def device_names(device_type: np.ndarray, device_id: np.ndarray) -> np.ndarray:
    """The plugin's device names: "CPU", "GPU<id>" for CUDA and for HIP (ROCm; the plugin knows CUDA only);
    None for any other type (the plugin skips those)."""
    out = np.full(len(device_type), None, dtype=object)
    out[device_type == CPU] = "CPU"
    # Any other id (fractional, past int32, missing) is no device: the event is left out, as the plugin's None.
    valid = np.isfinite(device_id) & (np.abs(device_id) < 2**31)
    cuda = np.flatnonzero(((device_type == CUDA) | (device_type == HIP)) & valid)
    cuda = cuda[device_id[cuda] == np.round(device_id[cuda])]
    if cuda.size:
        ids = pd.Series(device_id[cuda]).astype(np.int64).astype(str)
        out[cuda] = ("GPU" + ids).to_numpy()
    return out


def _memory_rows(trace: Trace) -> np.ndarray:
    ev = trace.events
    return np.flatnonzero((ev["name"].to_numpy() == MEMORY_EVENT) & (ev["ph"].to_numpy() == "i"))


@dataclass
class _Ownership:
    """The cpu_ops' nesting (positions in `ops`) and each memory event's innermost op (a position, -1: none)."""

    ops: np.ndarray  # rows of the trace's cpu_op events
    depth: np.ndarray
    parent: np.ndarray
    owner: np.ndarray


def _owning_ops(trace: Trace, mem_rows: np.ndarray) -> _Ownership:
    """Which cpu_op of its lane holds each memory event's ts in [start, end), innermost first. The events
    join the ops' nesting walk (profiling/structure.py `nest`, the one per-event loop here, as there) as
    zero-length events: the walk gives an event starting where an op ends to that op's parent (right-open)
    and one starting with an op to that op, and a zero-length event adopts nothing, so the ops nest as
    they would alone."""
    ev = trace.events
    ops = np.flatnonzero((ev["cat"].to_numpy() == "cpu_op") & (ev["ph"].to_numpy() == "X"))
    rows = np.concatenate([ops, mem_rows])
    ts = ev["ts"].to_numpy()[rows]
    end = np.concatenate([ev["end"].to_numpy()[ops], ts[len(ops) :]])
    sub = pd.DataFrame({"ph": "X", "ts": ts, "end": end, "pid": 0, "tid": 0})
    depth, parent = nest(sub, lane_codes(trace)[rows])  # parents are positions in `rows`: ops come first
    return _Ownership(ops, depth[: len(ops)], parent[: len(ops)], parent[len(ops) :])


def _curves(mem: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    curves = mem[["device", "ts", "allocated", "reserved"]].sort_values(["device", "ts"], kind="stable")
    curves = curves.reset_index(drop=True)
    valid = curves[curves["allocated"].notna()]
    if valid.empty:
        return curves, pd.DataFrame(columns=["device", "peak_allocated", "peak_ts", "peak_reserved"])
    at_peak = valid.loc[valid.groupby("device", sort=True)["allocated"].idxmax()]  # idxmax: the first at the max
    reserved = curves.groupby("device", sort=True)["reserved"].max()
    peaks = pd.DataFrame(
        {
            "device": at_peak["device"].to_numpy(),
            "peak_allocated": at_peak["allocated"].to_numpy(),
            "peak_ts": at_peak["ts"].to_numpy(),
            "peak_reserved": reserved.reindex(at_peak["device"]).to_numpy(),
        }
    )
    return curves, peaks


def _op_table(trace: Trace, mem: pd.DataFrame, owned: _Ownership) -> pd.DataFrame:
    """Per (device, op name): self figures from the events each op holds, totals adding its descendant ops'."""
    held = owned.owner >= 0
    if not held.any():
        return pd.DataFrame(columns=OP_COLUMNS)
    ev, all_ops, depth, parent, position = trace.events, owned.ops, owned.depth, owned.parent, owned.owner
    names = ev["name"].to_numpy()[all_ops]
    calls = pd.Series(names).value_counts()
    tables = []
    # One pass over the ops per device: the MAX_DEVICES devices with the most events (a real trace has a
    # handful; a hostile one could name millions).
    devices = mem.loc[held, "device"].value_counts(sort=True).index[:MAX_DEVICES]
    for device in devices:
        mine = held & (mem["device"].to_numpy() == device)
        size = mem["bytes"].to_numpy()[mine]
        at = position[mine]
        self_count = np.bincount(at, weights=(size > 0).astype(np.float64), minlength=len(all_ops))
        self_bytes = np.bincount(at, weights=np.where(size > 0, size, 0.0), minlength=len(all_ops))
        self_increase = np.bincount(at, weights=size, minlength=len(all_ops))
        figures = pd.DataFrame(
            {
                "name": names,
                "self_alloc_count": self_count,
                "self_alloc_bytes": self_bytes,
                "self_increase_bytes": self_increase,
                "alloc_count": propagate_up(self_count, parent, depth),
                "alloc_bytes": propagate_up(self_bytes, parent, depth),
                "increase_bytes": propagate_up(self_increase, parent, depth),
            }
        )
        table = figures.groupby("name", sort=True).sum()
        # The plugin lists an op on a device where any of its figures is non-zero.
        table = table[(table != 0).any(axis=1)].reset_index()
        table.insert(0, "device", device)
        table.insert(2, "calls", calls.reindex(table["name"]).to_numpy())
        tables.append(table)
    out = pd.concat(tables, ignore_index=True)
    for column in ("calls", "self_alloc_count", "alloc_count"):
        out[column] = out[column].astype(np.int64)
    return out[OP_COLUMNS]


def _event_table(mem: pd.DataFrame) -> pd.DataFrame:
    """Allocations paired with their frees: in ts order per (device, address), a free pairs with the record
    just before it when that one is an allocation (the plugin's dict of open allocations, which a new
    allocation at an address overwrites and a free empties)."""
    # Traces before torch 1.10 carry no Addr: nothing to pair. The reader keeps numbers as float64, exact
    # to 2**53 (Linux addresses stay below 2**48); past it two addresses could read as one: left unpaired.
    mem = mem[mem["addr"].abs() <= EXACT_ADDR]
    keyed = mem.sort_values(["device", "addr", "ts", "row"], kind="stable").reset_index(drop=True)
    alloc = keyed["bytes"].to_numpy() > 0  # the plugin: bytes > 0 allocates, anything else frees
    same = (keyed["device"].to_numpy()[1:] == keyed["device"].to_numpy()[:-1]) & (
        keyed["addr"].to_numpy()[1:] == keyed["addr"].to_numpy()[:-1]
    )
    freed_next = np.zeros(len(keyed), bool)
    freed_next[:-1] = same & alloc[:-1] & ~alloc[1:]
    paired_free = np.zeros(len(keyed), bool)
    paired_free[1:] = freed_next[:-1]
    release = np.full(len(keyed), np.nan)
    release[:-1] = np.where(freed_next[:-1], keyed["ts"].to_numpy()[1:], np.nan)
    allocs = keyed[alloc].assign(alloc_ts=keyed["ts"][alloc], release_ts=release[alloc])
    # A free whose allocation happened before the trace: the plugin lists it with no allocation time.
    orphans = keyed[~alloc & ~paired_free]
    orphans = orphans.assign(bytes=-orphans["bytes"], alloc_ts=np.nan, release_ts=orphans["ts"], op=None)
    table = pd.concat([allocs, orphans], ignore_index=True)
    table["duration"] = table["release_ts"] - table["alloc_ts"]
    return table[EVENT_COLUMNS]
