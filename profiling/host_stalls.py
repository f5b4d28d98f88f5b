"""Where the host stalls the GPU: blocking syncs that fill its idle time, and steps too short to hide launches.

Two measurements, each read from the whole trace, for the `blocking_sync` and `launch_bound` rules
(profiling/insights/host.py):
- `blocking_syncs`: host calls that wait for the device (a synchronous copy, a stream, device or
  event synchronize, `aten::item` / `_local_scalar_dense`), with how much of the GPU's idle time
  each one covers. Idle time is `idle_time.merged_idle_us`'s: the steps' span minus the union of
  kernel intervals on every GPU, so a finding's idle time equals the summary's `idle_time_us`.
- `launch_stats`: whether the trace replays CUDA/HIP graphs, HTA's host wait on the busiest stream
  (`idle_time.idle_breakdown_us`) against the steps' span, kernels per step, the median kernel and
  the median gap between consecutive kernels on that stream.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.idle_time import idle_breakdown_us, stream_codes
from profiling.step_breakdown import adjusted_steps, step_names, steps_span
from profiling.structure import structure
from profiling.trace import LAUNCH_CATEGORIES, Trace, per_trace

# Host calls that return only once the device has caught up. cudaMemcpy and its synchronous relatives
# (hipMemcpyWithStream is what torch's ROCm build calls for a blocking copy), and the synchronize calls.
SYNC_CALLS = frozenset(
    {
        *("cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyPeer", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol"),
        *("hipMemcpy", "hipMemcpyWithStream", "hipMemcpy2D", "hipMemcpy3D", "hipMemcpyPeer"),
        *("hipMemcpyToSymbol", "hipMemcpyFromSymbol", "cuMemcpy", "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpyDtoD"),
        *("cudaStreamSynchronize", "hipStreamSynchronize", "cuStreamSynchronize"),
        *("cudaDeviceSynchronize", "hipDeviceSynchronize", "cuCtxSynchronize"),
        *("cudaEventSynchronize", "hipEventSynchronize", "cuEventSynchronize"),
    }
)
# Ops that read a device value on the host: they end in a copy and a stream synchronize.
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
# Graph replay: one launch runs a whole captured step, so launch overhead is no longer per kernel.
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "hipGraphLaunch", "cuGraphLaunch"})
# CUPTI's API names may carry a version or per-thread-stream suffix (`cudaMemcpy_v3020`, `_ptsz`).
_API_SUFFIX = re.compile(r"(?:_v\d{1,6}|_pt[sd]z?)+$")
# No runtime API name is longer; longer names are left as they are, as the suffix search above retries
# from every `_v`, which is quadratic in a crafted name of repeated `_v1`.
MAX_API_NAME = 64

SYNC_MIN_US = 1000.0  # a sync that covers less idle time than this is not worth a finding
SYNC_MIN_IDLE_SHARE = 0.10  # ... nor one that covers less than this share of the GPU's idle time
MAX_ANCESTORS = 1000  # levels walked up from a sync to find its op: real traces nest < 100 deep
MAX_SYNCS_EXAMINED = 1000  # qualifying syncs examined for their op, the most idle time first
MAX_FRAMES = 5  # Python frames kept around a sync (`<built-in method ...>` frames say nothing of the caller)


def api_name(name: str) -> str:
    """A runtime call's name without CUPTI's version or per-thread suffix."""
    return _API_SUFFIX.sub("", name) if len(name) <= MAX_API_NAME else name


@dataclass(frozen=True)
class BlockingSync:
    """One host call that waited for the device while the GPU ran no kernel."""

    row: int  # its row in `trace.events`
    name: str
    ts: float
    dur: float
    idle_us: float  # how much of the GPU's merged idle time it covers
    op: str | None  # the innermost op around it (the op that issued it); itself, for an aten op with none
    top_op: str | None  # the outermost op around it
    python: tuple[str, ...]  # the Python frames around it, innermost first (builtins left out), where recorded
    step: str | None  # the ProfilerStep it ran in, or None (no ProfilerStep in the trace, or outside them)


@dataclass(frozen=True)
class SyncReport:
    """The GPU's merged idle time in the steps' span, and the syncs that cover a large part of it."""

    idle_us: float
    span_us: float
    candidates: int  # sync calls and ops in the trace
    qualifying: int  # those over both thresholds, nested ones counted once
    worst: list[BlockingSync] = field(default_factory=list)  # most idle time first, at most MAX_SYNCS_EXAMINED

    @property
    def busy_percent(self) -> float:
        return 100.0 * (1.0 - self.idle_us / self.span_us) if self.span_us > 0 else 0.0


def _rows_named(trace: Trace, categories: tuple[str, ...], wanted: Callable[[str], bool]) -> np.ndarray:
    """Rows in `trace.events` of the complete events of `categories` whose name `wanted` accepts: tested once
    per distinct name among those events (kernel names, the most numerous, are never tested)."""
    rows = trace.complete_rows[trace.texts.isin("cat", categories, trace.complete_rows)]
    return rows[trace.texts.isin("name", wanted, rows)]


def _sync_rows(trace: Trace) -> np.ndarray:
    """Rows in `trace.events` of the complete sync calls and sync ops, in file order."""
    calls = _rows_named(trace, LAUNCH_CATEGORIES, lambda n: api_name(n) in SYNC_CALLS)
    return np.sort(np.concatenate([calls, _rows_named(trace, ("cpu_op",), SYNC_OPS.__contains__)]))


def idle_intervals(trace: Trace) -> tuple[iv.Intervals, float] | None:
    """When no kernel ran on any GPU inside the steps' span, and the span's length; None without kernels or span.

    The same definition as `idle_time.merged_idle_us` (the plugin's utilization: kernels only)."""
    span = steps_span(trace)
    kernels = trace.kernels
    if span is None or kernels.empty:
        return None
    busy = iv.clip(iv.union(kernels["ts"].to_numpy(), kernels["end"].to_numpy()), *span)
    whole = (np.array([span[0]]), np.array([span[1]]))
    return iv.subtract(whole, busy), float(span[1] - span[0])


@per_trace
def blocking_syncs(trace: Trace) -> SyncReport | None:
    """The syncs that each cover at least SYNC_MIN_US and SYNC_MIN_IDLE_SHARE of the GPU's idle time;
    None where the trace has no kernels or no sync."""
    found = idle_intervals(trace)
    rows = _sync_rows(trace)
    if found is None or not len(rows):
        return None
    idle, span_us = found
    idle_us, candidates = iv.total(idle), len(rows)
    ev = trace.events
    covered = iv.overlap_per_window(idle, ev["ts"].to_numpy()[rows], ev["end"].to_numpy()[rows])
    floor = max(SYNC_MIN_US, SYNC_MIN_IDLE_SHARE * idle_us)
    keep = covered >= floor
    rows, covered = rows[keep], covered[keep]
    # The most idle time first; among equals the longest, so an `aten::item` comes before the sync inside it.
    order = np.lexsort((-ev["dur"].to_numpy()[rows], -covered))[:MAX_SYNCS_EXAMINED]
    syncs = _outermost(trace, rows[order], covered[order])
    return SyncReport(idle_us, span_us, candidates, len(syncs), syncs)


def _outermost(trace: Trace, rows: np.ndarray, covered: np.ndarray) -> list[BlockingSync]:
    """Each sync with the ops around it; a sync inside another qualifying one (the copy inside `aten::item`)
    is that one's, and left out."""
    ev = trace.events
    parent, names, cats = structure(trace).parent, ev["name"].to_numpy(), ev["cat"].to_numpy()
    qualifying = set(rows.tolist())
    steps = step_names(trace, ev["ts"].to_numpy()[rows])
    out = []
    for row, idle_us, step in zip(rows.tolist(), covered.tolist(), steps, strict=True):
        ops, python, inside_another = [], [], False
        at = int(parent[row])
        for _ in range(MAX_ANCESTORS):
            if at < 0:
                break
            if at in qualifying:
                inside_another = True
                break
            if cats[at] == "cpu_op":
                ops.append(str(names[at]))
            elif cats[at] == "python_function" and len(python) < MAX_FRAMES and not str(names[at]).startswith("<"):
                python.append(str(names[at]))
            at = int(parent[at])
        if inside_another:
            continue
        own = str(names[row]) if cats[row] == "cpu_op" else None
        op = ops[0] if ops else own
        top = ops[-1] if ops else own
        ts, dur = float(ev.at[ev.index[row], "ts"]), float(ev.at[ev.index[row], "dur"])
        out.append(BlockingSync(row, str(names[row]), ts, dur, idle_us, op, top, tuple(python), step))
    return out


@dataclass(frozen=True)
class LaunchStats:
    """How the host fed the GPU over the steps' span."""

    graph_launches: int
    steps: int
    span_us: float  # the steps' span, first start to last end
    stream: str  # the stream with the most kernel time (`device:stream` where several devices ran work)
    host_wait_us: float  # HTA's host wait on that stream
    kernels: int  # kernels that start inside the span
    median_kernel_us: float
    median_gap_us: float | None  # between consecutive kernels on the busiest stream; None with fewer than two
    ts: float | None = None  # start of the kernel after the widest gap on that stream, to find it in Perfetto
    widest_gap_us: float | None = None

    @property
    def host_wait_percent(self) -> float:
        return 100.0 * self.host_wait_us / self.span_us if self.span_us > 0 else 0.0

    @property
    def kernels_per_step(self) -> float:
        return self.kernels / self.steps if self.steps else 0.0


def graph_launches(trace: Trace) -> int:
    """How many cudaGraphLaunch / hipGraphLaunch calls the trace holds."""
    return len(_rows_named(trace, LAUNCH_CATEGORIES, lambda n: api_name(n) in GRAPH_LAUNCHES))


@per_trace
def launch_stats(trace: Trace) -> LaunchStats | None:
    """Graph launches, host wait and kernel cadence over the steps' span; None without steps or kernels in it."""
    steps = adjusted_steps(trace)
    if steps.empty:
        return None
    lo, hi = float(steps["start"].iloc[0]), float(steps["end"].iloc[-1])
    # Stream keys as idle_breakdown_us makes them, over all GPU activity, so the two name streams alike; only
    # the columns read here are taken, not the whole frame's.
    gpu = trace.gpu_activity
    gpu = gpu[gpu["stream"].notna() & gpu["stream"].ge(0)]
    codes, keys = stream_codes(gpu)
    ts, end, dur = (gpu[column].to_numpy() for column in ("ts", "end", "dur"))
    chosen = np.flatnonzero((gpu["cat"].to_numpy() == "kernel") & (ts >= lo) & (ts <= hi))
    if not len(chosen):
        return None
    # Codes follow the keys' sorted order, so the first stream of the most time is the one grouping the keys finds.
    busiest_code = int(pd.Series(dur[chosen]).groupby(codes[chosen]).sum().idxmax())
    busiest = str(keys[busiest_code])
    waits = idle_breakdown_us(trace).get(busiest, {})
    on_stream = chosen[codes[chosen] == busiest_code]
    on_stream = on_stream[np.argsort(ts[on_stream], kind="stable")]
    # A gap is from the end of all earlier work on the stream (its union's reach) to the next start, as in
    # idle_time: a kernel inside a longer earlier one leaves no gap.
    reach = np.maximum.accumulate(end[on_stream])
    gaps = np.clip(ts[on_stream][1:] - reach[:-1], 0.0, None)
    widest = int(np.argmax(gaps)) if len(gaps) else None
    return LaunchStats(
        graph_launches=graph_launches(trace),
        steps=len(steps),
        span_us=hi - lo,
        stream=busiest,
        host_wait_us=float(waits.get("host_wait", 0.0)),
        kernels=len(chosen),
        median_kernel_us=float(np.median(dur[chosen])),
        median_gap_us=float(np.median(gaps)) if len(gaps) else None,
        ts=float(ts[on_stream][widest + 1]) if widest is not None else None,
        widest_gap_us=float(gaps[widest]) if widest is not None else None,
    )
