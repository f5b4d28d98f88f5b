"""Windows: the spans of one annotation (a forward is one `attn_fwd` window) and what ran in them.

Definitions (the README's): `ops_per_forward` counts every `aten::` op inside the forward windows;
`kernels_per_forward` counts the GPU activity their launches caused on CUDA, and the leaf
compute ops on CPU; `peak_memory_bytes` is the highest allocation inside a window above the
level just before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiling.launches import first_launches
from profiling.step_breakdown import POSITION
from profiling.structure import lane_codes, process_codes, structure
from profiling.trace import LAUNCH_CATEGORIES, Trace, rows_of, rows_where

FORWARD = "attn_fwd"
WHOLE_TRACE = "(whole trace)"


def annotations(trace: Trace) -> pd.DataFrame:
    """Every CPU-side `user_annotation` duration event (cached on the trace: analyses ask many times)."""
    return trace.annotations


def annotation_windows(trace: Trace, name: str = FORWARD) -> pd.DataFrame:
    """The windows of annotation `name`, in time order."""
    ann = annotations(trace)
    return ann[ann["name"] == name].sort_values("ts")


def window_of(
    trace: Trace, windows: pd.DataFrame, across_threads: bool = False, rows: np.ndarray | None = None
) -> np.ndarray:
    """For each event, the position of the window on its lane that contains it, or -1.

    Windows on one lane must not overlap (forwards, profiler steps, one annotation name).
    `across_threads` matches within the whole process instead: GPU work belongs to the window
    that contains its launch on any thread, since the backward pass launches from autograd's
    own thread (the TensorBoard plugin attributes steps the same way).
    `rows` (event positions) limits the answer to those events, in that order.
    """
    ev = trace.events
    if windows.empty:
        return np.full(len(ev) if rows is None else len(rows), -1, dtype=np.int64)
    lanes = process_codes(trace) if across_threads else lane_codes(trace)
    window_start, window_stop = windows["ts"].to_numpy(), windows["end"].to_numpy()
    # An event inside a window starts by the window's end (its own end is no earlier): no event past it is taken.
    reach = window_stop + 1e-3
    window, event = _placed(trace, rows, across_threads).members(lanes[windows.index.to_numpy()], window_start, reach)
    ts, end = ev["ts"].to_numpy(), ev["end"].to_numpy()
    at = event if rows is None else rows[event]
    ok = (ts[at] >= window_start[window]) & (end[at] <= reach[window])
    found = np.full(len(ev) if rows is None else len(rows), -1, dtype=np.int64)
    found[event[ok]] = window[ok]
    return found


@dataclass(frozen=True)
class LaneTimes:
    """Events placed once by lane and start, so that each set of windows costs two binary searches per window
    and a step per event inside them, not a sort of all the events with the windows (`window_table` asks
    twice per annotation name)."""

    order: np.ndarray  # the events' positions by key: by lane, then start (of equal keys, in their order)
    keys: np.ndarray  # in that order, each event's lane * span + the rank of its start among `times`: ascending
    times: np.ndarray  # the events' distinct starts, sorted
    span: int  # more than any rank

    @classmethod
    def of(cls, lane: np.ndarray, ts: np.ndarray) -> LaneTimes:
        times, rank = np.unique(ts, return_inverse=True)
        span = len(times) + 1
        keys = lane.astype(np.int64) * span + rank.reshape(-1)
        order = np.argsort(keys, kind="stable")
        # int32 positions: a trace holds at most reader.MAX_EVENTS events, and a set of rows is kept per analysis.
        return cls(order.astype(np.int32), keys[order], times, span)

    def latest_start(self, window_lane: np.ndarray, window_start: np.ndarray) -> np.ndarray:
        """`latest_start_on_lane(window_lane, window_start, lane, ts)` for these events' lanes and starts."""
        found = np.full(len(self.order), -1, np.int64)
        window, event = self.members(window_lane, window_start)
        found[event] = window
        return found

    def members(
        self, window_lane: np.ndarray, window_start: np.ndarray, reach: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each event that `latest_start` places in a window, as (window, event) positions, by window; with
        `reach` (per window), only those that start by the window's reach (none for a NaN reach).

        A window's key is its lane's and the rank its start would take among the events' starts (left of equals),
        so it sorts at or before each event of its lane that starts with or after it. The events a window takes
        are those from its key up to the next window's on its lane (to the lane's end after the last), or to
        its reach's key if that comes first: a range of the events by key, found by two binary searches per
        window. So a set of windows costs its windows and the events in them, not a search per event of the
        trace, nor the events between sparse windows (`window_table` asks twice per annotation name).
        Of windows with equal keys (equal starts), the last in order takes the events; the others take none.
        """
        if not len(window_lane) or not len(self.keys):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        by_lane = np.lexsort((window_start, window_lane))  # stable: of equal starts, the last in order wins
        lane = window_lane[by_lane].astype(np.int64)
        keys = lane * self.span + np.searchsorted(self.times, window_start[by_lane], "left")
        last_on_lane = np.append(lane[1:] != lane[:-1], True)
        next_keys = np.where(last_on_lane, (lane + 1) * self.span, np.append(keys[1:], 0))
        if reach is not None:  # the rank past every start at or before the reach
            reached = reach[by_lane]
            reach_keys = lane * self.span + np.searchsorted(self.times, reached, "right")
            next_keys = np.where(np.isnan(reached), keys, np.maximum(keys, np.minimum(next_keys, reach_keys)))
        first = np.searchsorted(self.keys, keys, "left")
        counts = np.searchsorted(self.keys, next_keys, "left") - first
        # The positions first[j] .. first[j] + counts[j] - 1 of every window j, in one array.
        starts_at = np.cumsum(counts) - counts
        positions = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(first - starts_at, counts)
        return np.repeat(by_lane, counts), self.order[positions]


def _placed(trace: Trace, rows: np.ndarray | None, across_threads: bool) -> LaneTimes:
    """The LaneTimes of events `rows` (None: all), kept on the trace for the same array of rows (the aten
    ops', the launches': asked once per annotation name). All events' are not kept: asked once per
    analysis, they would hold 12 bytes an event through it."""
    lanes = process_codes(trace) if across_threads else lane_codes(trace)
    ts = trace.events["ts"].to_numpy()
    if rows is None:
        return LaneTimes.of(lanes, ts)
    cache, key = trace.derived.lane_times, (id(rows), across_threads)
    if key not in cache or cache[key][0] is not rows:
        if len(cache) >= 8:
            cache.clear()
        cache[key] = (rows, LaneTimes.of(lanes[rows], ts[rows]))
    return cache[key][1]


def latest_start_on_lane(
    window_lane: np.ndarray, window_start: np.ndarray, lane: np.ndarray, ts: np.ndarray
) -> np.ndarray:
    """For each (lane, ts), the position of the window on the same lane that started last at or before ts, or -1.

    One sort of windows and events together, for all lanes at once: a loop over lanes scanned
    every event once per lane, minutes on a trace with an annotation on each of 100k threads.
    Among windows that start together, the last in `window_start`'s order wins (as a stable
    sort and a right-sided search would pick).
    """
    by_lane = np.lexsort((window_start, window_lane))  # windows by lane, then start: ordinal j is by_lane[j]
    n = len(by_lane)
    # At equal (lane, time) a window sorts before an event, so a window starting at ts counts.
    kind = np.concatenate([np.zeros(n, dtype=np.int8), np.ones(len(ts), dtype=np.int8)])
    times = np.concatenate([window_start[by_lane], ts])
    lanes = np.concatenate([window_lane[by_lane], lane])
    order = np.lexsort((kind, times, lanes))
    ordinal = np.concatenate([np.arange(n), np.full(len(ts), -1)])[order]
    # Ordinals rise with (lane, start): the running maximum is the latest window at or before each element.
    latest = np.maximum.accumulate(ordinal)
    is_event = kind[order] == 1
    found = np.empty(len(ts), dtype=np.int64)
    found[order[is_event] - n] = latest[is_event]
    at = np.clip(found, 0, None)
    same_lane = (found >= 0) & (window_lane[by_lane][at] == lane) if n else np.zeros(len(ts), dtype=bool)
    return np.where(same_lane, by_lane[at], -1)


@dataclass
class WindowStats:
    """What happened inside the windows of one annotation (by default, the forwards)."""

    name: str
    windows: pd.DataFrame  # the annotation events themselves, in time order (empty for the whole trace)
    count: int
    cpu_ms: float  # mean window duration on the host
    device_ms: float | None  # mean span of the GPU activity the window launched
    ops: pd.DataFrame  # aten ops inside the windows, with `window`, `depth`, `compute`
    gpu: pd.DataFrame  # GPU activity launched from inside the windows, with `window`
    on_gpu: bool
    peak_memory_bytes: int
    retained_bytes: int  # allocated at a window's end above the level before it (mean over windows)

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
        windows = ev.iloc[:0]
        where = np.zeros(len(ev), dtype=np.int64)
        count = 1 if len(ev) else 0
        cpu_ms = float((ev["end"].max() - ev["ts"].min()) / 1e3) if len(ev) else 0.0
    else:
        windows = annotation_windows(trace, name)
        where = window_of(trace, windows)
        count = len(windows)
        cpu_ms = float(windows["dur"].mean() / 1e3) if count else 0.0
    launches_any = len(trace.gpu_activity) or trace.texts.isin("cat", LAUNCH_CATEGORIES).any()
    on_gpu = (device == "cuda") if device else bool(launches_any)

    inside = np.flatnonzero(s.is_aten & (where >= 0))
    parents = s.parent[inside]
    parent_name = np.where(parents >= 0, ev["name"].to_numpy()[np.clip(parents, 0, None)], "")
    ops = rows_of(ev, inside).assign(
        window=where[inside], depth=s.depth[inside], parent=parent_name, compute=s.compute[inside]
    )

    launched_in = window_of(trace, windows, across_threads=True) if name is not None else where
    # Positions, not a copy of the launch rows: a quarter of a big trace's events are launches. The first
    # launch of a correlation id is the one its GPU work belongs to (`launches.first_launches`).
    launches = first_launches(trace)
    launches = launches[launched_in[launches] >= 0]
    launch_window = pd.Series(launched_in[launches], index=ev["correlation"].to_numpy()[launches])
    gpu = trace.gpu_activity
    if name is not None:
        gpu = rows_where(gpu, gpu["correlation"].isin(launch_window.index))
        gpu = gpu.assign(window=launch_window.reindex(gpu["correlation"].to_numpy()).to_numpy())
    else:
        gpu = gpu.assign(window=0)

    # Allocations count on any thread of the process: the backward allocates on autograd's thread.
    peak, retained = memory_levels(trace, launched_in, device_type=1 if on_gpu else 0)
    device_ms = None
    if len(gpu):
        spans = gpu.groupby("window").agg(start=("ts", "min"), stop=("end", "max"))
        device_ms = float((spans["stop"] - spans["start"]).mean() / 1e3)
    return WindowStats(
        name=name or WHOLE_TRACE,
        windows=windows,
        count=count,
        cpu_ms=cpu_ms,
        device_ms=device_ms,
        ops=ops,
        gpu=gpu,
        on_gpu=on_gpu,
        peak_memory_bytes=peak,
        retained_bytes=retained,
    )


WINDOW_COLUMNS = ["annotation", "count", "cpu (ms)", "device (ms)", "ops/window", "kernels/window", "kernel time (us)"]
STEP_COLUMNS = [POSITION, "step", "cpu (ms)", "device (ms)", "ops", "gpu activities", "kernel time (us)"]


def per_window(trace: Trace, windows: pd.DataFrame) -> pd.DataFrame:
    """One row per window: CPU ms, device span ms, aten ops, GPU activities and kernel µs it launched.

    Vectorised: one pass for all the (non-overlapping) windows together. Only aten ops and launches
    are placed in windows, and what each launch caused is found once per trace, not once per name.
    """
    n = len(windows)
    if trace.derived.aten_rows is None:
        trace.derived.aten_rows = np.flatnonzero(structure(trace).is_aten)
    aten = trace.derived.aten_rows
    where = window_of(trace, windows, rows=aten)
    ops = np.bincount(where[where >= 0], minlength=n)
    launch_rows, work = _launch_work(trace)
    launched_in = window_of(trace, windows, across_threads=True, rows=launch_rows)
    found = work["found"] & (launched_in >= 0)
    w = launched_in[found]
    first = pd.Series(work["start"][found]).groupby(w).min().reindex(range(n))
    last = pd.Series(work["stop"][found]).groupby(w).max().reindex(range(n))
    return pd.DataFrame(
        {
            "name": windows["name"].to_numpy(),
            "cpu_ms": windows["dur"].to_numpy() / 1e3,
            "device_ms": ((last - first) / 1e3).to_numpy(),
            "ops": ops[:n],
            "gpu": np.bincount(w, weights=work["n"][found], minlength=n)[:n],
            "kernel_us": np.bincount(w, weights=work["kernel_us"][found], minlength=n)[:n],
        }
    )


def _launch_work(trace: Trace) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The launches' rows and, per launch, the GPU work it caused: count, kernel µs, first start, last end
    (computed once per trace)."""
    if trace.derived.launch_work is None:
        trace.derived.launch_work = _find_launch_work(trace)
    return trace.derived.launch_work


def _find_launch_work(trace: Trace) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    ev, gpu = trace.events, trace.gpu_activity
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
    # One launch per correlation id gets its work: launches sharing an id would each count it.
    rows = first_launches(trace)
    work = launched.reindex(ev["correlation"].to_numpy()[rows])
    columns = {name: work[name].to_numpy() for name in ("n", "kernel_us", "start", "stop")}
    return rows, columns | {"found": work["n"].notna().to_numpy()}


def step_table(trace: Trace, windows: pd.DataFrame) -> pd.DataFrame:
    """One row per profiler step of `windows` (`step_breakdown.profiler_steps`), keyed by its `position`."""
    rows = per_window(trace, windows)
    table = pd.DataFrame(
        {
            POSITION: windows[POSITION].to_numpy(),
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
    marks = annotations(trace)
    # One factorization, then integer compares: comparing the string column once per name cost 90 ms a name.
    codes, uniques = pd.factorize(marks["name"].to_numpy())
    rows = []
    for name, code in zip(names, pd.Index(uniques).get_indexer(names), strict=True):
        windows = marks[codes == code] if code >= 0 else marks.iloc[:0]
        per = per_window(trace, windows.sort_values("ts", kind="stable"))
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


def memory_levels(trace: Trace, where: np.ndarray, device_type: int) -> tuple[int, int]:
    """Bytes allocated above the level just before a window: the highest inside it, and what is left at its end.

    The peak is the max over windows; what is left (memory a forward keeps for its backward: the
    output and the saved tensors) is the mean over windows. Both from the profiler's `[memory]` events.
    """
    events = trace.events
    on_device = (events["device_type"] == device_type).to_numpy()
    memory = events[trace.texts.equals("name", "[memory]") & on_device & (where >= 0)]
    if memory.empty:
        return 0, 0
    memory = memory.assign(window=where[memory.index]).sort_values("ts", kind="stable")
    grouped = memory.groupby("window")
    first = grouped.first()
    baseline = first["total_allocated"] - first["alloc_bytes"]
    peak = grouped["total_allocated"].max() - baseline
    left = grouped["total_allocated"].last() - baseline
    return int(max(0.0, float(peak.max()))), int(max(0.0, float(left.mean())))
