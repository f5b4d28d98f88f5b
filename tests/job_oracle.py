"""Plain loops over a rank's raw JSON events: the job tests' own reference, sharing no code with `profiling/`.

Steps as the TensorBoard plugin draws them (event_parser.py, `_find_device_steps`): a ProfilerStep reaches
the end of the GPU work its launches caused, and starts no earlier than the previous step's end. Kernels
are collectives by name (`gpu_oracle.is_collective`), computation where neither that nor Memcpy, Memset or
Sync (HTA's); per step, overlap = |comm ∩ comp|, computation and communication the rest of each, other the
step's remainder.
"""

from __future__ import annotations

import statistics
from typing import Any

from tests.gpu_oracle import RawTrace, end, intersection, is_collective, length, union

GPU = ("kernel", "gpu_memcpy", "gpu_memset")


def is_computation(name: str) -> bool:
    return not is_collective(name) and not any(word in name for word in ("Memcpy", "Memset", "Sync"))


def step_windows(raw: RawTrace) -> list[tuple[str, float, float]]:
    """(name, start, end) of each ProfilerStep, in time order, reaching the GPU work launched inside it."""
    steps = sorted(raw.steps(), key=lambda e: e["ts"])
    launch = {}
    for e in raw.launches:
        launch.setdefault(e["args"].get("correlation"), e)
    last_gpu = [float("-inf")] * len(steps)
    for g in raw.gpu:
        host = launch.get(g["args"].get("correlation"))
        for i, step in enumerate(steps):
            if host is not None and step["ts"] <= host["ts"] and end(host) <= end(step):
                last_gpu[i] = max(last_gpu[i], end(g))
                break
    out, previous = [], steps[0]["ts"] if steps else 0.0
    for step, gpu_end in zip(steps, last_gpu, strict=True):
        start = max(step["ts"], previous)
        previous = max(previous, end(step), gpu_end)
        out.append((step["name"], start, previous))
    return out


def clipped(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def step_parts(raw: RawTrace) -> list[dict[str, Any]]:
    comm = union((k["ts"], end(k)) for k in raw.kernels if is_collective(k["name"]))
    comp = union((k["ts"], end(k)) for k in raw.kernels if is_computation(k["name"]))
    rows = []
    for name, lo, hi in step_windows(raw):
        c, p = clipped(comm, lo, hi), clipped(comp, lo, hi)
        both = intersection(c, p)
        rows.append(
            {
                "step": name,
                "step_us": hi - lo,
                "computation": length(p) - both,
                "communication": length(c) - both,
                "overlap": both,
                "other": hi - lo - (length(p) + length(c) - both),
            }
        )
    return rows


def collective_durations(raw: RawTrace) -> list[float]:
    return [k["dur"] for k in sorted(raw.kernels, key=lambda k: k["ts"]) if is_collective(k["name"])]


def sync_wait(durations: dict[int, list[float]]) -> dict[int, float]:
    """The plugin's rule: per collective, transfer = the least duration over ranks; wait = duration − transfer."""
    ranks = sorted(durations)
    total = dict.fromkeys(ranks, 0.0)
    for i in range(len(durations[ranks[0]])):
        transfer = min(durations[r][i] for r in ranks)
        for r in ranks:
            total[r] += durations[r][i] - transfer
    return total


def stragglers(step_means: dict[int, float]) -> list[int]:
    """Ranks above the others' median by more than max(3 × 1.4826 × MAD, 5% of that median)."""
    out = []
    for rank, value in step_means.items():
        others = [v for r, v in step_means.items() if r != rank]
        median = statistics.median(others)
        mad = statistics.median(abs(v - median) for v in others)
        if value - median > max(3 * 1.4826 * mad, 0.05 * median):
            out.append(rank)
    return out
