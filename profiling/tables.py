"""Tables and per-forward counts, computed from the event table of any trace.

Definitions (DESIGN.md, "Definitions"): a forward is one `attn_fwd` annotation window;
`ops_per_forward` counts every `aten::` op inside it; `kernels_per_forward` counts the GPU
activity its launches caused on CUDA, and its leaf compute ops on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiling.kernels import decode
from profiling.trace import LAUNCH_CATEGORIES, Trace

FORWARD = "attn_fwd"
WHOLE_TRACE = "(whole trace)"

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


def is_metadata_op(name: str, input_dims: object) -> bool:
    if name in METADATA_OPS:
        return True
    if name in SCALAR_CONVERSIONS and isinstance(input_dims, list) and input_dims:
        return input_dims[0] == []
    return False


def nest(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Depth and parent row (-1 for none) of each complete event within its (pid, tid) lane."""
    depth = np.full(len(events), -1, dtype=np.int64)
    parent = np.full(len(events), -1, dtype=np.int64)
    complete = events["ph"].to_numpy() == "X"
    if not complete.any():
        return depth, parent
    rows = np.flatnonzero(complete)
    lanes = (events["pid"].to_numpy()[rows] + "/" + events["tid"].to_numpy()[rows]).astype(str)
    ts, end = events["ts"].to_numpy()[rows], events["end"].to_numpy()[rows]
    # Parents before children: by lane, then start, then the longer first.
    order = np.lexsort((-(end - ts), ts, lanes))
    stack: list[tuple[float, int]] = []
    lane_now = None
    for i in order.tolist():
        if lanes[i] != lane_now:
            lane_now, stack = lanes[i], []
        start, stop = ts[i], end[i]
        # A child may overhang its parent by a rounding step; 1 ns of slack absorbs it.
        while stack and stack[-1][0] < stop - 1e-3:
            stack.pop()
        depth[rows[i]] = len(stack)
        parent[rows[i]] = stack[-1][1] if stack else -1
        if stop >= start:
            stack.append((stop, int(rows[i])))
    return depth, parent


@dataclass
class Structure:
    """Nesting and compute-leaf flags of every event; computed once per trace."""

    depth: np.ndarray
    parent: np.ndarray
    is_aten: np.ndarray
    compute: np.ndarray  # leaf compute ops (DESIGN.md's CPU kernel count)


def structure(trace: Trace) -> Structure:
    cached = trace.cache.get("structure")
    if cached is not None:
        return cached
    ev = trace.events
    depth, parent = nest(ev)
    is_aten = (ev["cat"].to_numpy() == "cpu_op") & ev["name"].str.startswith("aten::").to_numpy()
    pairs = zip(ev["name"], ev["input_dims"], strict=True)
    metadata = np.fromiter((is_metadata_op(n, d) for n, d in pairs), bool, len(ev))
    counts_as_compute = (is_aten & ~metadata).astype(np.float64)
    # A compute op is a leaf: none of its descendants is itself a compute op.
    descendants = _propagate_up(counts_as_compute, parent, depth) - counts_as_compute
    result = Structure(depth, parent, is_aten, (counts_as_compute > 0) & (descendants == 0))
    trace.cache["structure"] = result
    return result


def _propagate_up(values: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Each node's value plus all of its descendants' (deepest level first)."""
    total = values.astype(np.float64).copy()
    for level in range(int(depth.max(initial=0)), 0, -1):
        nodes = np.flatnonzero((depth == level) & (parent >= 0))
        np.add.at(total, parent[nodes], total[nodes])
    return total


def annotations(trace: Trace) -> pd.DataFrame:
    """Every CPU-side `user_annotation` duration event (cached: analyses ask many times)."""
    if "annotations" not in trace.cache:
        ev = trace.complete
        trace.cache["annotations"] = ev[ev["cat"] == "user_annotation"]
    return trace.cache["annotations"]


def annotation_windows(trace: Trace, name: str = FORWARD) -> pd.DataFrame:
    """The windows of annotation `name`, in time order."""
    ann = annotations(trace)
    return ann[ann["name"] == name].sort_values("ts")


def lane_codes(trace: Trace) -> np.ndarray:
    """An integer per (pid, tid) lane for every event, computed once per trace."""
    if "lanes" not in trace.cache:
        ev = trace.events
        trace.cache["lanes"] = pd.factorize(ev["pid"] + "/" + ev["tid"])[0]
    return trace.cache["lanes"]


def window_of(trace: Trace, windows: pd.DataFrame) -> np.ndarray:
    """For each event, the position of the window on its lane that contains it, or -1.

    Windows on one lane must not overlap (forwards, profiler steps, one annotation name).
    """
    ev = trace.events
    inside = np.full(len(ev), -1, dtype=np.int64)
    if windows.empty:
        return inside
    lanes = lane_codes(trace)
    ts, end = ev["ts"].to_numpy(), ev["end"].to_numpy()
    window_lane = lanes[windows.index.to_numpy()]
    window_start, window_stop = windows["ts"].to_numpy(), windows["end"].to_numpy()
    order = np.argsort(window_start, kind="stable")
    for code in np.unique(window_lane):
        positions = order[window_lane[order] == code]  # this lane's windows, by start time
        rows = np.flatnonzero(lanes == code)
        k = np.searchsorted(window_start[positions], ts[rows], side="right") - 1
        ok = (k >= 0) & (end[rows] <= window_stop[positions][np.clip(k, 0, None)] + 1e-3)
        inside[rows[ok]] = positions[k[ok]]
    return inside


@dataclass
class WindowStats:
    """What happened inside the windows of one annotation (by default, the forwards)."""

    name: str
    count: int
    cpu_ms: float  # mean window duration on the host
    device_ms: float | None  # mean span of the GPU activity the window launched
    ops: pd.DataFrame  # aten ops inside the windows, with `window`, `depth`, `compute`
    gpu: pd.DataFrame  # GPU activity launched from inside the windows, with `window`
    on_gpu: bool
    peak_memory_bytes: int

    @property
    def compute_ops(self) -> pd.DataFrame:
        return self.ops[self.ops["compute"]]

    def per_window(self, n: int) -> float:
        return n / self.count if self.count else 0.0

    @property
    def ops_per_window(self) -> float:
        return self.per_window(len(self.ops))

    @property
    def kernels_per_window(self) -> float:
        return self.per_window(len(self.gpu) if self.on_gpu else len(self.compute_ops))


def window_stats(trace: Trace, name: str | None = FORWARD, device: str | None = None) -> WindowStats:
    """Per-window ops, compute ops, GPU activity and memory for annotation `name`.

    `name=None` treats the whole trace as one window (for uploads without annotations).
    `device` is `cuda` or `cpu`; None infers it from whether the trace launched device work.
    """
    ev = trace.events
    s = structure(trace)
    if name is None:
        where = np.zeros(len(ev), dtype=np.int64)
        count = 1 if len(ev) else 0
        cpu_ms = float((ev["end"].max() - ev["ts"].min()) / 1e3) if len(ev) else 0.0
    else:
        windows = annotation_windows(trace, name)
        where = window_of(trace, windows)
        count = len(windows)
        cpu_ms = float(windows["dur"].mean() / 1e3) if count else 0.0
    on_gpu = (
        (device == "cuda") if device else bool(len(trace.gpu_activity) or len(trace.of_category(*LAUNCH_CATEGORIES)))
    )

    inside = s.is_aten & (where >= 0)
    parent_name = np.where(s.parent >= 0, ev["name"].to_numpy()[np.clip(s.parent, 0, None)], "")
    ops = ev[inside].assign(
        window=where[inside], depth=s.depth[inside], parent=parent_name[inside], compute=s.compute[inside]
    )

    launches = ev[ev["cat"].isin(LAUNCH_CATEGORIES) & (where >= 0)]
    launch_window = pd.Series(where[launches.index], index=launches["correlation"].to_numpy())
    launch_window = launch_window[~launch_window.index.duplicated()]
    gpu = trace.gpu_activity
    if name is not None:
        gpu = gpu[gpu["correlation"].isin(launch_window.index)]
        gpu = gpu.assign(window=launch_window.reindex(gpu["correlation"].to_numpy()).to_numpy())
    else:
        gpu = gpu.assign(window=0)

    device_ms = None
    if len(gpu):
        spans = gpu.groupby("window").agg(start=("ts", "min"), stop=("end", "max"))
        device_ms = float((spans["stop"] - spans["start"]).mean() / 1e3)
    return WindowStats(
        name=name or WHOLE_TRACE,
        count=count,
        cpu_ms=cpu_ms,
        device_ms=device_ms,
        ops=ops,
        gpu=gpu,
        on_gpu=on_gpu,
        peak_memory_bytes=peak_memory(ev, where, device_type=1 if on_gpu else 0),
    )


WINDOW_COLUMNS = ["annotation", "count", "cpu (ms)", "device (ms)", "ops/window", "kernels/window", "kernel time (us)"]
STEP_COLUMNS = ["step", "cpu (ms)", "device (ms)", "ops", "gpu activities", "kernel time (us)"]


def per_window(trace: Trace, windows: pd.DataFrame) -> pd.DataFrame:
    """One row per window: CPU ms, device span ms, aten ops, GPU activities and kernel µs it launched.

    Vectorised: one pass over the events for all the (non-overlapping) windows together.
    """
    ev = trace.events
    n = len(windows)
    where = window_of(trace, windows)
    gpu = trace.gpu_activity
    is_kernel = gpu["cat"].eq("kernel").to_numpy()
    launched = (
        pd.DataFrame(
            {
                "n": 1.0,
                "kernel_us": np.where(is_kernel, gpu["dur"].to_numpy(), 0.0),
                "start": gpu["ts"].to_numpy(),
                "stop": gpu["end"].to_numpy(),
                "correlation": gpu["correlation"].to_numpy(),
            }
        )
        .groupby("correlation")
        .agg(n=("n", "sum"), kernel_us=("kernel_us", "sum"), start=("start", "min"), stop=("stop", "max"))
    )
    launches = ev["cat"].isin(LAUNCH_CATEGORIES).to_numpy() & (where >= 0)
    work = launched.reindex(ev["correlation"].to_numpy()[launches])
    w = where[launches]
    found = work["n"].notna().to_numpy()
    ops = np.bincount(where[structure(trace).is_aten & (where >= 0)], minlength=n)
    first = pd.Series(work["start"].to_numpy()[found]).groupby(w[found]).min().reindex(range(n))
    last = pd.Series(work["stop"].to_numpy()[found]).groupby(w[found]).max().reindex(range(n))
    return pd.DataFrame(
        {
            "name": windows["name"].to_numpy(),
            "cpu_ms": windows["dur"].to_numpy() / 1e3,
            "device_ms": ((last - first) / 1e3).to_numpy(),
            "ops": ops[:n],
            "gpu": np.bincount(w[found], weights=work["n"].to_numpy()[found], minlength=n)[:n],
            "kernel_us": np.bincount(w[found], weights=work["kernel_us"].to_numpy()[found], minlength=n)[:n],
        }
    )


def step_table(trace: Trace, windows: pd.DataFrame) -> pd.DataFrame:
    """One row per profiler step."""
    rows = per_window(trace, windows)
    table = pd.DataFrame(
        {
            "step": rows["name"],
            "cpu (ms)": rows["cpu_ms"],
            "device (ms)": rows["device_ms"],
            "ops": rows["ops"],
            "gpu activities": rows["gpu"],
            "kernel time (us)": rows["kernel_us"],
        },
        columns=STEP_COLUMNS,
    )
    return table


def window_table(trace: Trace, names: list[str]) -> pd.DataFrame:
    """One row per annotation name: windows, mean CPU and device ms, ops and GPU work per window."""
    rows = []
    for name in names:
        per = per_window(trace, annotation_windows(trace, name))
        device = per["device_ms"].dropna()
        rows.append(
            [
                name,
                len(per),
                per["cpu_ms"].mean(),
                device.mean() if len(device) else None,
                per["ops"].mean(),
                per["gpu"].mean(),
                per["kernel_us"].sum(),
            ]
        )
    return pd.DataFrame(rows, columns=WINDOW_COLUMNS)


def peak_memory(events: pd.DataFrame, where: np.ndarray, device_type: int) -> int:
    """Highest bytes allocated inside a window above the level just before it (max over windows)."""
    memory = events[(events["name"] == "[memory]") & (events["device_type"] == device_type) & (where >= 0)]
    if memory.empty:
        return 0
    memory = memory.assign(window=where[memory.index]).sort_values("ts", kind="stable")
    before = memory.groupby("window").first()
    baseline = before["total_allocated"] - before["alloc_bytes"]
    peak = memory.groupby("window")["total_allocated"].max()
    return int(max(0.0, float((peak - baseline).max())))


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
    total_device = _propagate_up(self_device, parent, depth)

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
