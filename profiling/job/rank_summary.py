"""One rank's trace reduced, where it is read, to the little a job's view needs: per-step times and collectives.

Per step (the plugin's steps, `communication.step_windows`: the ProfilerSteps, else the fallback step "0"),
with kernels split as `communication.name_flags` splits them (collectives; HTA's computation: every other
kernel but Memcpy, Memset and Sync):
- overlap = |∪ comm ∩ ∪ comp| (HTA's `get_comm_comp_overlap` numerator, as `communication_stats`);
- computation = |∪ comp| − overlap and communication = |∪ comm| − overlap: the time each ran alone,
  as the TensorBoard plugin's distributed view shows them (its computation, communication, overlapping);
- other = step − |∪ comm ∪ ∪ comp| (HTA's temporal breakdown counts it idle or non-compute).
Times are µs inside the step's window, so the four add up to the step's time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.communication import communication_stats, name_flags, step_windows
from profiling.reader import Progress
from profiling.step_breakdown import adjusted_steps
from profiling.trace import Trace, load_trace

PARTS = ("computation", "communication", "overlap", "other")
# Bytes per element of the `dtype` names record_param_comms writes (c10's ScalarType names).
DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "ComplexFloat": 8, "ComplexDouble": 16,
}  # fmt: skip


@dataclass
class RankSummary:
    """What travels back from a worker: small, picklable, JSON-native values only."""

    path: str
    distributed_info: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)  # step, step_us and each of PARTS in µs
    collectives: list[dict[str, Any]] = field(default_factory=list)  # in time order: name, dur_us, bytes
    overlap_percent: float | None = None  # HTA's, over the whole trace (`communication_stats`)
    events: int = 0
    file_bytes: int = 0
    error: str | None = None

    def record(self) -> dict[str, Any]:
        return asdict(self)


def summarize_rank(path: str | Path, progress: Progress | None = None, **limits: int) -> RankSummary:
    """Read one rank's trace and summarise it; raises TraceError (a ValueError) on a bad trace.

    `limits` override fields of the reader's `Limits` (the app passes its admitted ones); `progress` hears
    the bytes read."""
    trace = load_trace(path, progress, **limits)
    info = trace.metadata.get("distributedInfo")
    stats = communication_stats(trace)
    flags = name_flags(trace.kernels) if len(trace.kernels) else (np.zeros(0, bool), np.zeros(0, bool))
    return RankSummary(
        path=str(path),
        distributed_info=_small_info(info),
        steps=step_parts(trace, flags),
        collectives=collective_list(trace, flags[0]),
        overlap_percent=stats.overlap_percent if stats else None,
        events=len(trace.events),
        file_bytes=Path(path).stat().st_size,
    )


def summarize_or_error(path: str | Path) -> RankSummary:
    """`summarize_rank`, or a summary carrying the error: one bad rank must not stop a job."""
    try:
        return summarize_rank(path)
    except Exception as exc:  # whatever one rank's file does, the other ranks go on
        return RankSummary(path=str(path), error=f"{type(exc).__name__}: {exc}")


def _small_info(info: Any) -> dict[str, Any] | None:
    # pg_config lists every process group with its ranks: keep only the fields the job reads.
    if not isinstance(info, dict):
        return None
    return {k: info[k] for k in ("rank", "world_size", "backend") if k in info}


def step_parts(trace: Trace, flags: tuple[np.ndarray, np.ndarray]) -> list[dict[str, Any]]:
    """Per step: its name, its time and PARTS, in µs (see the module's docstring); `flags` are
    `name_flags(trace.kernels)`: which kernels are collectives, which computation."""
    starts, stops = step_windows(trace)
    if not len(starts):
        return []
    kernels = trace.kernels
    ts, end = kernels["ts"].to_numpy(), kernels["end"].to_numpy()
    comm, comp = (iv.union(ts[mask], end[mask]) for mask in flags)
    overlap = iv.overlap_per_window(iv.intersect(comm, comp), starts, stops)
    comm_us = iv.overlap_per_window(comm, starts, stops)
    comp_us = iv.overlap_per_window(comp, starts, stops)
    step_us = np.clip(stops - starts, 0.0, None)
    names = _step_names(trace, len(starts))
    return [
        {
            "step": names[i],
            "step_us": float(step_us[i]),
            "computation": float(comp_us[i] - overlap[i]),
            "communication": float(comm_us[i] - overlap[i]),
            "overlap": float(overlap[i]),
            "other": float(max(step_us[i] - (comp_us[i] + comm_us[i] - overlap[i]), 0.0)),
        }
        for i in range(len(starts))
    ]


def _step_names(trace: Trace, n: int) -> list[str]:
    steps = adjusted_steps(trace)
    return [str(s) for s in steps["step"]] if len(steps) == n else ["(whole trace)"] * n


def collective_list(trace: Trace, collective: np.ndarray) -> list[dict[str, Any]]:
    """Every collective kernel (`collective`: a mask of `trace.kernels`) in start order: its name, duration
    and message bytes (None where unknown)."""
    rows = trace.kernels[collective].sort_values("ts", kind="stable")
    sizes = _message_bytes(rows)
    return [
        {"name": str(n), "dur_us": float(d) if math.isfinite(d) else 0.0, "bytes": b}
        for n, d, b in zip(rows["name"], rows["dur"].to_numpy(dtype=float), sizes, strict=True)
    ]


def _message_bytes(rows: pd.DataFrame) -> list[int | None]:
    """The larger of the in and out message (nccl-tests' size: an all-gather's output, a reduce-scatter's
    input) times the element size; None where the args give neither size, or no dtype of known size."""
    nelems = np.fmax(rows["in_msg_nelems"].to_numpy(dtype=float), rows["out_msg_nelems"].to_numpy(dtype=float))
    itemsize = [DTYPE_BYTES.get(d) if isinstance(d, str) else None for d in rows["msg_dtype"]]
    return [
        int(n * size) if size is not None and math.isfinite(n) else None
        for n, size in zip(nelems.tolist(), itemsize, strict=True)
    ]
