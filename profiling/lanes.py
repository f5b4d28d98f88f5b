"""Which bars the timeline draws, and in which lanes: plain data for `charts.timeline`, no plotly.

One lane per CPU thread (ops stacked by depth) and one per GPU stream; past `MAX_LANES` lanes the
quietest share one "others" lane; past the bar budget, events that share a lane, depth and time
bucket are merged into one bar.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.structure import lane_codes, structure
from profiling.trace import GPU_ACTIVITY, LAUNCH_CATEGORIES, Trace

MAX_DEPTH = 6  # deeper CPU ops fold into the last row of their lane
MAX_LANES = 40  # lanes drawn on their own, the busiest; the rest share one "others" lane
# Categories only a host thread records: a lane holding any of them is a CPU lane, whatever its pid.
HOST_WORK = ("cpu_op", "python_function", "user_annotation", *LAUNCH_CATEGORIES)
FOCUS_SHARE = 0.5  # of the bar budget, kept for the events of the initial view (the first forward)

TIMELINE_COLUMNS = ("name", "cat", "ts", "end", "dur", "pid", "tid")  # what merged bars are drawn from


@dataclass
class Lanes:
    """The timeline's lanes: each event's `lane` column indexes `names`, its `origin` column `labels`."""

    names: list[str]  # display order: CPU threads, GPU streams, then the "others" lane where lanes were merged
    rows: list[int]  # rows of each lane (its deepest event's depth + 1)
    labels: np.ndarray  # the label of every lane of the trace, its own lane for an event merged into "others"
    others: int | None  # the position of the "others" lane in `names`; None where every lane is drawn

    @property
    def merged(self) -> int:
        return 0 if self.others is None else len(self.labels) - self.others


def lane_labels(trace: Trace, ev: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each event's lane label, as a code into the labels, and whether each label is a GPU lane.

    Kineto puts device work under the device's pid, with one tid per stream (sync events too), so
    a lane is a GPU lane when its pid is one that ran GPU activity, unless the lane itself holds host
    work (Kineto's Python tracer writes `python_function` events under pid 0, as "thread 0 (python3)").
    It is named as the trace's metadata names it (`MetadataNames.label`). Labels are made once per lane,
    not per event; lanes that share a label share a lane, as CPU threads of one tid in two processes.
    """
    per_lane, _ = pd.factorize(lane_codes(trace)[ev.index.to_numpy()])
    # factorize numbers lanes in order of first appearance: where the running maximum rises, a lane begins.
    first = np.flatnonzero(np.diff(np.maximum.accumulate(per_lane), prepend=-1) > 0)
    pid, tid = ev["pid"].to_numpy()[first], ev["tid"].to_numpy()[first]
    gpu_pids = set(ev["pid"].to_numpy()[ev["cat"].isin(GPU_ACTIVITY).to_numpy()])
    host = pd.Series(ev["cat"].isin(HOST_WORK).to_numpy()).groupby(per_lane).any().to_numpy()
    on_gpu = pd.Series(pid, dtype=object).isin(gpu_pids).to_numpy() & ~host
    names = MetadataNames.of(trace)
    labels = [names.label(str(p), str(t), g) for p, t, g in zip(pid, tid, on_gpu, strict=True)]
    codes, distinct = pd.factorize(pd.Series(labels, dtype=object))
    gpu = pd.Series(on_gpu).groupby(codes).any().to_numpy() if len(codes) else np.zeros(0, bool)
    return codes.astype(np.int32)[per_lane], np.asarray(distinct, dtype=object), gpu  # int32: one per event


@dataclass(frozen=True)
class MetadataNames:
    """The names a trace's metadata events give its threads and processes (`Trace.lane_names`)."""

    threads: dict[tuple[str, str], str]  # (pid, tid) -> `thread_name`
    devices: dict[str, str]  # pid -> `process_labels` ("GPU 0" for Kineto's device processes)

    @classmethod
    def of(cls, trace: Trace) -> MetadataNames:
        threads, devices = {}, {}
        for (kind, pid, tid), name in trace.lane_names.items():
            if name.strip() and kind == "thread_name":
                threads[(pid, tid)] = name.strip()
            elif name.strip() and kind == "process_labels":
                devices[pid] = name.strip()
        return cls(threads, devices)

    def label(self, pid: str, tid: str, on_gpu: bool) -> str:
        """A lane's label, as Perfetto names it from the metadata: "GPU 0 · stream 7" for a device's stream
        (its `process_labels`, then its `thread_name`), the `thread_name` for a CPU thread ("thread 6608
        (python)"); from the ids where the trace names none ("GPU 0 · stream 7", "CPU thread 6608").

        A device process's `process_name` is the host's ("python3"), so a GPU lane is named by its label.
        Old traces write a stream's tid as "stream 7": it is not said twice.
        """
        thread = self.threads.get((pid, tid))
        if not on_gpu:
            return thread or f"CPU thread {tid}"
        stream = thread or (tid if tid.startswith("stream") else f"stream {tid}")
        return f"{self.devices.get(pid) or f'GPU {pid}'} · {stream}"


def _lane_order(label: str, gpu: bool) -> tuple[bool, list[tuple[int, str]]]:
    """CPU lanes first, then GPU lanes, each by its label with numbers in numeric order ("stream 7" before 20)."""
    return gpu, [(int(part), "") if part.isdigit() else (0, part) for part in re.split(r"(\d+)", label)]


def assign_lanes(trace: Trace, ev: pd.DataFrame) -> tuple[pd.DataFrame, Lanes]:
    """The MAX_LANES busiest lanes (by the union of their events' time) drawn alone, the rest merged into one."""
    origin, labels, gpu = lane_labels(trace, ev)
    kept = np.arange(len(labels))
    if len(labels) > MAX_LANES:
        busy = iv.busy_per_group(origin, ev["ts"].to_numpy(), ev["end"].to_numpy(), len(labels))
        kept = np.argsort(-busy, kind="stable")[:MAX_LANES]
    kept = sorted(kept, key=lambda i: _lane_order(str(labels[i]), bool(gpu[i])))
    names, others = [str(labels[i]) for i in kept], None
    position = np.full(len(labels), len(kept), dtype=np.int32)  # MAX_LANES + 1 at most
    position[kept] = np.arange(len(kept))
    if len(kept) < len(labels):
        others = len(kept)
        names.append(f"others ({len(labels) - len(kept):,} quieter lanes)")
    lane = position[origin]
    deepest = pd.Series(ev["depth"].to_numpy()).groupby(lane).max().reindex(range(len(names)), fill_value=0)
    return ev.assign(lane=lane, origin=origin), Lanes(names, (deepest + 1).tolist(), labels, others)


def merge(events: pd.DataFrame, max_bars: int, focus: tuple[float, float] | None = None) -> tuple[pd.DataFrame, int]:
    """Merge events per (lane, depth, time bucket) until at most `max_bars` remain; returns the bars, longest first
    (`longest_first`), and how many events were merged away.

    With a `focus` (start and end, µs: the initial view), the events it overlaps keep up to FOCUS_SHARE of the
    budget, bucketed over the focus alone: drawn one bar each where they fit, else merged only within buckets
    of the focus's width / 2**k, narrower than a pixel at the initial view. The rest share what is left,
    bucketed over the whole trace. Plotly cannot re-merge on zoom (the figure is drawn once), so what a
    reader zooms into first is what keeps its bars apart.
    """
    if len(events) <= max_bars:
        return longest_first(events).assign(merged=1), 0
    if focus is None:
        merged = _merged(events, max_bars, None)
        return merged, int(len(events) - len(merged))
    inside = ((events["end"] >= focus[0]) & (events["ts"] <= focus[1])).to_numpy()
    outside = events[~inside]
    budget = max_bars if outside.empty else max(1, int(max_bars * FOCUS_SHARE))
    near = events[inside]
    near = longest_first(near).assign(merged=1) if len(near) <= budget else _merged(near, budget, focus)
    far = _merged(outside, max(1, max_bars - len(near)), None) if len(outside) else outside.assign(merged=1)
    drawn = pd.concat([near, far], ignore_index=True)
    return drawn, int(len(events) - len(drawn))


def longest_first(events: pd.DataFrame) -> pd.DataFrame:
    """The events by `dur`, longest first, events of one length in their order (a stable sort): the order bars
    are drawn in, later ones on top, and within a budget the long ones are what a reader needs to see."""
    return events.sort_values("dur", ascending=False, kind="stable")


def _merged(events: pd.DataFrame, max_bars: int, span: tuple[float, float] | None) -> pd.DataFrame:
    """One bar per (lane, depth, time bucket) key of `merge_keys`, with how many events it holds: named, coloured
    and placed by its longest event (the first of them in `events`' order), spanning its events, as long as their
    durations summed, and the bars in the order of their longest events in `longest_first`.

    Grouped as the events stand, with numpy's reductions per group: sorting 3.2M events longest first and grouping
    them after held a 1 GiB trace's drawing at 0.91-1.02 s, against 0.56-0.65 s now (six draws each)."""
    codes, _ = pd.factorize(merge_keys(events, max_bars, span))
    groups = int(codes.max()) + 1
    dur = events["dur"].to_numpy()
    length = np.nan_to_num(dur, nan=-np.inf)  # an event of no length sorts last, as NaN does in `longest_first`
    longest = _per_group(np.fmax, codes, length, groups)
    at = np.flatnonzero(length == longest[codes])  # each group's longest events, in order
    first = np.full(groups, len(codes))
    np.minimum.at(first, codes[at], at)  # the first of them
    bars = pd.DataFrame({column: events[column].array.take(first) for column in ("name", "cat")})
    bars["ts"] = _per_group(np.fmin, codes, events["ts"].to_numpy(), groups)  # NaN skipped, as pandas' min does
    bars["end"] = _per_group(np.fmax, codes, events["end"].to_numpy(), groups)
    # Summed as pandas sums (compensated): a plain running sum, as `bincount` makes, drifts in the last digits
    # that the hover text rounds, 429.9 µs shown as 429.8.
    bars["dur"] = pd.Series(dur).groupby(codes, sort=True).sum().to_numpy()
    bars["merged"] = np.bincount(codes, minlength=groups)
    for column in ("lane", "depth", "origin"):  # one lane and depth per key
        bars[column] = events[column].to_numpy()[first]
    return bars.iloc[np.lexsort((first, -longest))].reset_index(drop=True)


def _per_group(reduce: np.ufunc, codes: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """`reduce` (np.fmin, np.fmax) of `values` per code, NaN where a group holds only NaN."""
    out = np.full(groups, np.nan)
    reduce.at(out, codes, values)
    return out


def merge_keys(events: pd.DataFrame, max_bars: int, span: tuple[float, float] | None = None) -> np.ndarray:
    """A key per (lane, depth, time bucket), with the finest power-of-two buckets that leave at most `max_bars` keys.

    Buckets divide `span` (start, end µs), else the events' own; an event starting before the span falls in
    its first bucket. Halving power-of-two buckets is a right shift of the key, so one sort counts the keys
    at every coarseness (a groupby per try cost a pass over millions of events each): where the keys are few (a
    bar budget's buckets for each of MAX_LANES + 1 lanes and MAX_DEPTH + 1 rows), which keys occur is counted in one
    pass instead of the sort, and halving the buckets ORs neighbouring keys (`_distinct_keys`).
    """
    levels = max(0, int(max_bars).bit_length() - 1)  # 2**levels buckets at the finest, no more than max_bars
    t0, t1 = span if span is not None else (float(events["ts"].min()), float(events["end"].max()))
    width = float(t1 - t0) or 1.0
    fraction = np.nan_to_num((events["ts"].to_numpy() - t0) / width)
    bucket = np.clip((fraction * 2**levels).astype(np.int64), 0, 2**levels - 1)
    lane = events["lane"].to_numpy().astype(np.int64)  # int64: the key is shifted left below
    row = lane * (MAX_DEPTH + 1) + events["depth"].to_numpy()
    fine = (row << levels) + bucket
    distinct = _distinct_keys(fine, levels)
    shift = next((shift for shift in range(levels + 1) if distinct(shift) <= max_bars), levels)
    return fine >> shift


MAX_COUNTED_KEYS = 1 << 24  # keys counted by presence (a 16 MiB mask at most); more are sorted


def _distinct_keys(fine: np.ndarray, levels: int) -> Callable[[int], int]:
    """How many distinct keys `fine >> shift` holds, for shift 0 to `levels`, from one pass over the keys."""
    if not len(fine):
        return lambda shift: 0
    if int(fine.min()) < 0 or int(fine.max()) >= MAX_COUNTED_KEYS:  # a hostile depth or lane: sorted, as before
        ordered = np.sort(fine)
        return lambda shift: 1 + int(np.count_nonzero((ordered[1:] >> shift) != (ordered[:-1] >> shift)))
    present = np.bincount(fine) > 0
    counts = []
    for _ in range(levels + 1):
        counts.append(int(np.count_nonzero(present)))
        present = np.append(present, False) if len(present) % 2 else present
        present = present[0::2] | present[1::2]  # keys 2k and 2k+1 become key k
    return counts.__getitem__


def timed_events(trace: Trace, max_bars: int) -> pd.DataFrame:
    """The duration events to draw, with their depth; indexed by their row in `trace.events`.

    Past `max_bars` the bars are merged and their hover text needs only these columns, so a big
    trace is not copied whole (every column of millions of events, then sorted) to draw 3,000 bars.
    """
    rows = trace.complete_rows
    # "Trace" is the profiler's own span over everything: it would only hide the rest.
    rows = rows[~trace.texts.equals("name", "", rows) & ~trace.texts.equals("cat", "Trace", rows)]
    if len(rows) <= max_bars:
        ev = trace.events.iloc[rows]
    else:
        ev = pd.DataFrame({c: _timeline_column(trace, c, rows) for c in TIMELINE_COLUMNS}, index=rows)
    return ev.assign(depth=np.clip(structure(trace).depth[rows], 0, MAX_DEPTH))


def _timeline_column(trace: Trace, column: str, rows: np.ndarray) -> np.ndarray | pd.Categorical:
    """One column of `rows`; a text column as a Categorical of the trace's codes (`Trace.texts`, made once):
    sorting, testing and merging millions of events by their text's integer code, not its string, and the
    values the same texts where read (half of a big trace's drawing was on strings)."""
    values = trace.events[column]
    if isinstance(values.dtype, np.dtype):  # a number; text is pandas' own array (as `rows_of` tells them apart)
        return values.to_numpy()[rows]
    codes, texts = trace.texts.codes(column)
    return pd.Categorical.from_codes(codes[rows], categories=pd.Index(texts, dtype=object), validate=False)


def lane_rows(rows: list[int]) -> tuple[np.ndarray, int]:
    """Each lane's first row, and the rows in all (a blank row after each lane)."""
    ends = np.cumsum(np.asarray(rows, dtype=np.int64) + 1)
    return np.concatenate([[0], ends[:-1]]).astype(np.int64), int(ends[-1]) if len(ends) else 0
