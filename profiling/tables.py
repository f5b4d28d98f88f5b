"""The op and kernel tables, with units in their headers; empty tables keep their schema."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiling.kernels import decode
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
]
KERNEL_COLUMNS = [
    "name",
    "kind",
    "count",
    "per forward",
    "total (us)",
    "avg (us)",
    "grid",
    "block",
    "registers/thread",
    "shared mem (B)",
    "achieved occupancy (%)",
    "meaning",
]


def op_table_from_key_averages(averages: object) -> pd.DataFrame:
    """The op table from `prof.key_averages()`: times in µs, sorted by self CPU time."""
    rows = [
        (
            e.key,
            e.count,
            e.self_cpu_time_total,
            e.cpu_time_total,
            e.cpu_time_total / max(e.count, 1),
            e.self_device_time_total,
            e.device_time_total,
            e.device_time_total / max(e.count, 1),
        )
        for e in averages  # type: ignore[attr-defined]
    ]
    table = pd.DataFrame(rows, columns=OP_COLUMNS)
    return table.sort_values("self cpu (us)", ascending=False, ignore_index=True)


def op_table_from_trace(trace: Trace) -> pd.DataFrame:
    """The op table rebuilt from a trace's `cpu_op` events, for traces we did not record.

    Device time is attributed to the innermost op around each launch, then summed upwards.
    """
    ev = trace.events
    if ev.empty:
        return pd.DataFrame(columns=OP_COLUMNS)
    depth, parent = structure(trace).depth, structure(trace).parent
    dur = ev["dur"].to_numpy()
    child_dur = np.zeros(len(ev))
    has_parent = parent >= 0
    np.add.at(child_dur, parent[has_parent], dur[has_parent])
    self_cpu = np.clip(dur - child_dur, 0, None)

    gpu = trace.gpu_activity.groupby("correlation")["dur"].sum()
    launches = ev["cat"].isin(LAUNCH_CATEGORIES).to_numpy()
    launch_time = np.where(launches, ev["correlation"].map(gpu).fillna(0.0).to_numpy(), 0.0)
    self_device = np.zeros(len(ev))
    owners = launches & has_parent
    np.add.at(self_device, parent[owners], launch_time[owners])
    total_device = propagate_up(self_device, parent, depth)

    ops = ev["cat"].isin(("cpu_op", "user_annotation")).to_numpy()
    frame = pd.DataFrame(
        {
            "name": ev["name"].to_numpy()[ops],
            "self_cpu": self_cpu[ops],
            "total_cpu": dur[ops],
            "self_dev": self_device[ops],
            "total_dev": total_device[ops],
        }
    )
    grouped = frame.groupby("name", sort=False).agg(
        calls=("self_cpu", "size"),
        self_cpu=("self_cpu", "sum"),
        total_cpu=("total_cpu", "sum"),
        self_dev=("self_dev", "sum"),
        total_dev=("total_dev", "sum"),
    )
    table = pd.DataFrame(
        {
            "name": grouped.index,
            "calls": grouped["calls"].to_numpy(),
            "self cpu (us)": grouped["self_cpu"].to_numpy(),
            "total cpu (us)": grouped["total_cpu"].to_numpy(),
            "avg cpu (us)": (grouped["total_cpu"] / grouped["calls"]).to_numpy(),
            "self device (us)": grouped["self_dev"].to_numpy(),
            "total device (us)": grouped["total_dev"].to_numpy(),
            "avg device (us)": (grouped["total_dev"] / grouped["calls"]).to_numpy(),
        },
        columns=OP_COLUMNS,
    )
    return table.sort_values("self cpu (us)", ascending=False, ignore_index=True)


def _shape(value: object) -> str:
    return "×".join(str(v) for v in value) if isinstance(value, list) else ""


def kernel_table(trace: Trace, forwards: WindowStats | None = None) -> pd.DataFrame:
    """One row per GPU kernel/memcpy/memset name; `per forward` when forward windows exist."""
    gpu = trace.gpu_activity
    if gpu.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    grouped = gpu.groupby("name", sort=False)
    first = grouped.first()
    table = pd.DataFrame(
        {
            "name": first.index,
            "kind": first["cat"].to_numpy(),
            "count": grouped.size().to_numpy(),
            "per forward": 0.0,
            "total (us)": grouped["dur"].sum().to_numpy(),
            "avg (us)": grouped["dur"].mean().to_numpy(),
            "grid": first["grid"].map(_shape).to_numpy(),
            "block": first["block"].map(_shape).to_numpy(),
            "registers/thread": first["registers"].to_numpy(),
            "shared mem (B)": first["shared_memory"].to_numpy(),
            "achieved occupancy (%)": grouped["occupancy"].mean().to_numpy(),
            "meaning": [decode(n).summary for n in first.index],
        },
        columns=KERNEL_COLUMNS,
    )
    if forwards is not None and forwards.count:
        per = forwards.gpu.groupby("name").size() / forwards.count
        table["per forward"] = table["name"].map(per).fillna(0.0).to_numpy()
    return table.sort_values("total (us)", ascending=False, ignore_index=True)


def rounded(table: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """A copy for display: floats rounded, schema kept (an empty table keeps its columns)."""
    return table.round(digits) if len(table) else table
