"""Independent reference computations from a trace's raw JSON: plain loops, no pandas, no project code.

Tests compare the analysis against these. They follow the definitions (README, torch's
`key_averages`, the TensorBoard plugin), written the slow, obvious way.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

# Old (2021) Kineto spellings, so the reference reads the plugin's sample traces too.
OLD_SPELLINGS = {
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Runtime": "cuda_runtime",
    "Driver": "cuda_driver",
    "Operator": "cpu_op",
}
GPU = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCHES = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")
SLACK_US = 1e-3
# README: a name over 4 kB is cut at load to its first 4,095 characters and "…".
NAME_CHARS = 4096


def raw_events(path: str | Path) -> list[dict]:
    """The trace's complete ("X") events with a name, categories in today's spelling."""
    data = Path(path).read_bytes()
    document = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    events = document["traceEvents"] if isinstance(document, dict) else document
    out = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or not e.get("name"):
            continue
        e = dict(e)
        if isinstance(e["name"], str) and len(e["name"]) > NAME_CHARS:
            e["name"] = e["name"][: NAME_CHARS - 1] + "…"
        e["cat"] = OLD_SPELLINGS.get(e.get("cat"), e.get("cat"))
        if e["cat"] == "cpu_op" and e["name"].startswith("ProfilerStep#"):
            e["cat"] = "user_annotation"
        out.append(e)
    return out


def end(e: dict) -> float:
    return e["ts"] + e["dur"]


def adopts(parent: dict, child: dict) -> bool:
    """torch's `EventList._populate_cpu_children` (torch/autograd/profiler_util.py): an open event adopts
    one that starts before it ends and ends by its end (here with 1 ns to spare on the end). A
    zero-length event adopts nothing: one that starts where it ends is a sibling."""
    return parent["dur"] > 0 and child["ts"] < end(parent) and end(child) <= end(parent) + SLACK_US


def nest(events: list[dict]) -> dict[int, int | None]:
    """Parent (by id) of each event within its (pid, tid) lane: the innermost open event that adopts it."""
    lanes: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        lanes[(str(e.get("pid")), str(e.get("tid")))].append(e)
    parent: dict[int, int | None] = {}
    for lane in lanes.values():
        open_events: list[dict] = []
        # torch's order: by start, the one ending later first; file order among equals (a stable sort).
        for e in sorted(lane, key=lambda e: (e["ts"], -end(e))):
            while open_events and not adopts(open_events[-1], e):
                open_events.pop()
            parent[id(e)] = id(open_events[-1]) if open_events else None
            open_events.append(e)
    return parent


def op_table(path: str | Path, kinds: tuple[str, ...] = ("cpu_op",)) -> dict[str, dict[str, float]]:
    """{name: calls, self_cpu, total_cpu, self_device, total_device} with same-name only children merged."""
    events = raw_events(path)
    by_id = {id(e): e for e in events}
    parent = nest(events)
    children: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if parent[id(e)] is not None:
            children[parent[id(e)]].append(e)
    device_by_correlation: dict[int, float] = defaultdict(float)
    for e in events:
        if e["cat"] in GPU:
            device_by_correlation[e.get("args", {}).get("correlation")] += e["dur"]

    def launched(e: dict) -> float:  # device time of the launches directly under e
        return sum(
            device_by_correlation.get(c.get("args", {}).get("correlation"), 0.0)
            for c in children[id(e)]
            if c["cat"] in LAUNCHES
        )

    def total_device(e: dict) -> float:
        return launched(e) + sum(total_device(c) for c in children[id(e)])

    def merged(e: dict) -> bool:
        p = parent[id(e)]
        return p is not None and by_id[p]["name"] == e["name"] and len(children[p]) == 1

    def top(e: dict) -> dict:
        while merged(e):
            e = by_id[parent[id(e)]]
        return e

    table: dict[str, dict[str, float]] = {}
    for e in events:
        if e["cat"] not in kinds:
            continue
        row = table.setdefault(
            top(e)["name"], {"calls": 0, "self_cpu": 0.0, "total_cpu": 0.0, "self_device": 0.0, "total_device": 0.0}
        )
        self_cpu = max(0.0, e["dur"] - sum(c["dur"] for c in children[id(e)]))
        row["self_cpu"] += self_cpu
        row["self_device"] += launched(e)
        if not merged(e):
            row["calls"] += 1
            row["total_cpu"] += e["dur"]
            row["total_device"] += total_device(e)
    return table


def windows(path: str | Path, name: str) -> list[dict]:
    """The annotation events called `name`, in time order."""
    return sorted((e for e in raw_events(path) if e["cat"] == "user_annotation" and e["name"] == name), key=end)


def inside(e: dict, window: dict) -> bool:
    return window["ts"] <= e["ts"] and end(e) <= end(window) + SLACK_US


def launched_in(path: str | Path, name: str) -> list[list[dict]]:
    """Per window of `name`: the GPU activity whose launch lies inside it, on any thread of its process."""
    events = raw_events(path)
    spans = windows(path, name)
    correlation_window: dict[int, int] = {}
    for e in events:
        if e["cat"] in LAUNCHES:
            for k, w in enumerate(spans):
                if str(e.get("pid")) == str(w.get("pid")) and inside(e, w):
                    correlation_window[e.get("args", {}).get("correlation")] = k
    out: list[list[dict]] = [[] for _ in spans]
    for e in events:
        if e["cat"] in GPU:
            k = correlation_window.get(e.get("args", {}).get("correlation"))
            if k is not None:
                out[k].append(e)
    return out


def aten_ops_in(path: str | Path, name: str) -> list[list[dict]]:
    """Per window of `name`: the `aten::` ops inside it on the window's own thread."""
    events = raw_events(path)
    out = []
    for w in windows(path, name):
        out.append(
            [
                e
                for e in events
                if e["cat"] == "cpu_op"
                and e["name"].startswith("aten::")
                and (e.get("pid"), e.get("tid")) == (w.get("pid"), w.get("tid"))
                and inside(e, w)
            ]
        )
    return out


def memory_peak(path: str | Path, name: str, device_type: int = 0) -> int:
    """Highest `Total Allocated` inside a window above the level just before its first allocation."""
    raw = raw_events_all(path)
    best = 0
    for w in windows(path, name):
        inner = [
            e
            for e in raw
            if e.get("name") == "[memory]"
            and e.get("args", {}).get("Device Type") == device_type
            and str(e.get("pid")) == str(w.get("pid"))
            and str(e.get("tid")) == str(w.get("tid"))
            and w["ts"] <= e["ts"] <= end(w) + SLACK_US
        ]
        if not inner:
            continue
        inner.sort(key=lambda e: e["ts"])
        base = inner[0]["args"]["Total Allocated"] - inner[0]["args"]["Bytes"]
        best = max(best, max(e["args"]["Total Allocated"] for e in inner) - base)
    return int(best)


def raw_events_all(path: str | Path) -> list[dict]:
    data = Path(path).read_bytes()
    document = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return [e for e in (document["traceEvents"] if isinstance(document, dict) else document) if isinstance(e, dict)]
