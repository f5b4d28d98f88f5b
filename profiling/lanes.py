"""Which bars the timeline draws, and in which lanes: plain data for `charts.timeline`, no plotly.

One lane per CPU thread (ops stacked by depth) and one per GPU stream; past `MAX_LANES` lanes the
quietest share one "others" lane; past the bar budget, events that share a lane, depth and time
bucket are merged into one bar.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.structure import lane_codes, structure
from profiling.trace import GPU_ACTIVITY, Trace

MAX_DEPTH = 6  # deeper CPU ops fold into the last row of their lane
MAX_LANES = 40  # lanes drawn on their own, the busiest; the rest share one "others" lane

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


def lane_labels(trace: Trace, ev: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each event's lane label, as a code into the labels: `GPU <pid> stream <tid>` or `CPU thread <tid>`.

    Kineto puts device work under the device's pid, with one tid per stream (sync events too), so
    a lane is a GPU lane when its pid is one that ran GPU activity. Labels are made once per lane,
    not per event; lanes that share a label share a lane, as CPU threads of one tid in two processes.
    """
    per_lane, _ = pd.factorize(lane_codes(trace)[ev.index.to_numpy()])
    # factorize numbers lanes in order of first appearance: where the running maximum rises, a lane begins.
    first = np.flatnonzero(np.diff(np.maximum.accumulate(per_lane), prepend=-1) > 0)
    pid, tid = ev["pid"].to_numpy()[first], ev["tid"].to_numpy()[first]
    gpu_pids = set(ev["pid"].to_numpy()[ev["cat"].isin(GPU_ACTIVITY).to_numpy()])
    on_gpu = pd.Series(pid, dtype=object).isin(gpu_pids).to_numpy()
    labels = [f"GPU {p} stream {t}" if g else f"CPU thread {t}" for p, t, g in zip(pid, tid, on_gpu, strict=True)]
    codes, names = pd.factorize(pd.Series(labels, dtype=object))
    return codes[per_lane], np.asarray(names, dtype=object)


def assign_lanes(trace: Trace, ev: pd.DataFrame) -> tuple[pd.DataFrame, Lanes]:
    """The MAX_LANES busiest lanes (by the union of their events' time) drawn alone, the rest merged into one."""
    origin, labels = lane_labels(trace, ev)
    kept = np.arange(len(labels))
    if len(labels) > MAX_LANES:
        busy = iv.busy_per_group(origin, ev["ts"].to_numpy(), ev["end"].to_numpy(), len(labels))
        kept = np.argsort(-busy, kind="stable")[:MAX_LANES]
    kept = sorted(kept, key=lambda i: (labels[i].startswith("GPU"), labels[i]))
    names, others = [str(labels[i]) for i in kept], None
    position = np.full(len(labels), len(kept), dtype=np.int64)
    position[kept] = np.arange(len(kept))
    if len(kept) < len(labels):
        others = len(kept)
        names.append(f"others ({len(labels) - len(kept):,} quieter lanes)")
    lane = position[origin]
    deepest = pd.Series(ev["depth"].to_numpy()).groupby(lane).max().reindex(range(len(names)), fill_value=0)
    return ev.assign(lane=lane, origin=origin), Lanes(names, (deepest + 1).tolist(), labels, others)


def merge(events: pd.DataFrame, max_bars: int) -> tuple[pd.DataFrame, int]:
    """Merge events per (lane, depth, time bucket) until at most `max_bars` remain."""
    if len(events) <= max_bars:
        return events.assign(merged=1), 0
    groups = events.groupby(merge_keys(events, max_bars), sort=False)
    merged = groups.agg(
        name=("name", "first"),
        cat=("cat", "first"),
        ts=("ts", "min"),
        end=("end", "max"),
        dur=("dur", "sum"),
        merged=("name", "size"),
        lane=("lane", "first"),
        depth=("depth", "first"),
        origin=("origin", "first"),
    ).reset_index(drop=True)
    return merged, int(len(events) - len(merged))


def merge_keys(events: pd.DataFrame, max_bars: int) -> np.ndarray:
    """A key per (lane, depth, time bucket), with the finest power-of-two buckets that leave at most `max_bars` keys.

    Halving power-of-two buckets is a right shift of the key, so one sort counts the keys at every
    coarseness (a groupby per try cost a pass over millions of events each).
    """
    levels = max(0, int(max_bars).bit_length() - 1)  # 2**levels buckets at the finest, no more than max_bars
    t0 = float(events["ts"].min())
    span = float(events["end"].max() - t0) or 1.0
    fraction = np.nan_to_num((events["ts"].to_numpy() - t0) / span)
    bucket = np.clip((fraction * 2**levels).astype(np.int64), 0, 2**levels - 1)
    row = events["lane"].to_numpy() * (MAX_DEPTH + 1) + events["depth"].to_numpy()
    fine = (row << levels) + bucket
    ordered = np.sort(fine)
    for shift in range(levels + 1):
        coarse = ordered >> shift
        if 1 + np.count_nonzero(coarse[1:] != coarse[:-1]) <= max_bars:
            break
    return fine >> shift


def timed_events(trace: Trace, max_bars: int) -> pd.DataFrame:
    """The duration events to draw, with their depth; indexed by their row in `trace.events`.

    Past `max_bars` the bars are merged and their hover text needs only these columns, so a big
    trace is not copied whole (every column of millions of events, then sorted) to draw 3,000 bars.
    """
    rows = trace.complete_rows
    names, categories = trace.events["name"].to_numpy()[rows], trace.complete_column("cat")
    # "Trace" is the profiler's own span over everything: it would only hide the rest.
    rows = rows[(names != "") & (categories != "Trace")]
    if len(rows) <= max_bars:
        ev = trace.events.iloc[rows]
    else:
        ev = pd.DataFrame({c: trace.events[c].to_numpy()[rows] for c in TIMELINE_COLUMNS}, index=rows)
    return ev.assign(depth=np.clip(structure(trace).depth[rows], 0, MAX_DEPTH))


def lane_rows(rows: list[int]) -> tuple[np.ndarray, int]:
    """Each lane's first row, and the rows in all (a blank row after each lane)."""
    ends = np.cumsum(np.asarray(rows, dtype=np.int64) + 1)
    return np.concatenate([[0], ends[:-1]]).astype(np.int64), int(ends[-1]) if len(ends) else 0
