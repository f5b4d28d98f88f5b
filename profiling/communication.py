"""Collectives: how much of the step they take, and how much of their time computation hides.

Definitions:
- A collective is a kernel whose decoded family is `communication` (`kernels.decode`), or whose
  name matches `COLLECTIVE_NAMES`: NCCL and RCCL (`ncclDevKernel_*`, `ncclKernel_*`), MSCCL++,
  torch's symmetric-memory and `multimem_*` all-reduce, vLLM/SGLang/aiter custom all-reduce
  (`cross_device_reduce_*`), quick-reduce, and kernels named for an all-reduce, all-gather,
  reduce-scatter or all-to-all. That is a wider set than Holistic Trace Analysis's `^nccl.*Kernel`
  (hta/utils/utils.py, `is_comm_kernel`): HTA counts a B200's `multimem_all_reduce_kernel` as
  computation, we count it as communication.
- Share of the step: |∪ collectives ∩ steps| ÷ Σ step spans × 100, over the plugin's steps
  (`step_breakdown.adjusted_steps`: the ProfilerSteps, else its step "0" over the host's ops). A
  collective that computation overlaps still counts; the overlap below says how much of it is hidden.
  The TensorBoard plugin recommends acting on communication above 10% of the step
  (tb_plugin/torch_tb_profiler/profiler/data.py, `RunProfileData._analyze_distributed_metrics`:
  `communication_ratio > 0.1`), where its communication is what kernels, memcpys and memsets leave
  uncovered. The `communication` rule applies that 10% to this share and to the share of kernel time
  (profiling/insights/communication.py).
- Overlap: HTA's `get_comm_comp_overlap` (hta/analyzers/communication_analysis.py):
  |∪ comm ∩ ∪ comp| ÷ |∪ comm|, where comp is every other kernel except those whose name says
  Memcpy, Memset or Sync (HTA's `(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)`), over the whole trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.kernels import MAX_NAMES_DECODED, decode
from profiling.step_breakdown import adjusted_steps, steps_span
from profiling.trace import Trace, codes_of, per_trace

# Names of collectives the decoder may not know; searched case-blind. Linear in the name: literal
# alternatives, each with at most one optional character. Inductor's `triton_*` kernels are left out:
# their names list the ops they fuse, and an `all_reduce` there is the copy into the collective's buffer.
_COLLECTIVE_WORDS = (
    r"nccl|rccl|mscclpp|multimem_|symmetric_memory|cross_device_reduce|quickreduce"
    r"|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
)
COLLECTIVE_NAMES = re.compile(_COLLECTIVE_WORDS, re.IGNORECASE)
# The same words on an ASCII name lower-cased once: 5-18x faster than the case-blind search (0.4 ms on a
# 4 kB name, and an upload can hold 15,000 such names). Only ASCII: Unicode case-blindness matches more
# than `str.lower` gives (the long s, `ſ`, matches `s`).
_COLLECTIVE_LOWER = re.compile(_COLLECTIVE_WORDS)
# HTA's kernels that are neither communication nor computation (Memcpy, Memset, Sync anywhere in the name).
NOT_COMPUTATION = re.compile(r"Memcpy|Memset|Sync")
MAX_NAMES_LISTED = 5  # collectives named in a finding


def is_collective(name: str, decoded: bool = True) -> bool:
    """Whether a kernel name is a collective's: by the decoder's family (where `decoded`), else by name."""
    if name.startswith("triton_"):
        return False
    return (decoded and decode(name).family == "communication") or _named_collective(name)


def _named_collective(name: str) -> bool:
    """`COLLECTIVE_NAMES.search(name)`, in a tenth of the time on an ASCII name."""
    found = _COLLECTIVE_LOWER.search(name.lower()) if name.isascii() else COLLECTIVE_NAMES.search(name)
    return found is not None


def name_flags(kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel: whether it is a collective, and whether it is computation (HTA's); one test per distinct name."""
    codes, names = codes_of(kernels["name"])
    time = np.bincount(codes[codes >= 0], weights=np.nan_to_num(kernels["dur"].to_numpy()[codes >= 0]))
    decoded = np.zeros(len(names), dtype=bool)
    decoded[np.argsort(-time, kind="stable")[:MAX_NAMES_DECODED]] = True
    collective = np.fromiter(
        (is_collective(str(n), bool(d)) for n, d in zip(names, decoded, strict=True)), bool, len(names)
    )
    other = np.fromiter((NOT_COMPUTATION.search(str(n)) is not None for n in names), bool, len(names))
    collective, computation = np.append(collective, False), np.append(~collective & ~other, False)
    return collective[codes], computation[codes]  # code -1 (no name) reads the appended False


@dataclass(frozen=True)
class CommunicationStats:
    """Collective kernels against all kernel time, the steps, and the computation beside them (times in µs)."""

    kernel_us: float  # Σ dur of every kernel
    collective_us: float  # Σ dur of the collectives
    collectives: int
    union_us: float  # |∪ collectives|, whole trace
    overlap_us: float  # |∪ collectives ∩ ∪ computation|, whole trace
    step_us: float  # Σ of the steps' spans
    in_steps_us: float  # |∪ collectives| inside the steps
    by_name: list[dict[str, Any]] = field(default_factory=list)  # the collectives with the most time
    worst: dict[str, Any] = field(default_factory=dict)  # the longest collective: name, ts, dur

    @property
    def step_percent(self) -> float | None:
        return 100.0 * self.in_steps_us / self.step_us if self.step_us > 0 else None

    @property
    def overlap_percent(self) -> float | None:
        return 100.0 * self.overlap_us / self.union_us if self.union_us > 0 else None

    @property
    def kernel_time_percent(self) -> float | None:
        return 100.0 * self.collective_us / self.kernel_us if self.kernel_us > 0 else None


def step_windows(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each of the plugin's steps (`adjusted_steps`), else one window over `steps_span`."""
    steps = adjusted_steps(trace)
    if len(steps):
        return steps["start"].to_numpy(), steps["end"].to_numpy()
    span = steps_span(trace)
    return (np.array([span[0]]), np.array([span[1]])) if span else (np.empty(0), np.empty(0))


@per_trace
def communication_stats(trace: Trace) -> CommunicationStats | None:
    """The collectives' time, share of the steps and overlap; None where the trace has no collective kernel."""
    kernels = trace.kernels
    if kernels.empty:
        return None
    collective, computation = name_flags(kernels)
    if not collective.any():
        return None
    ts, end, dur = kernels["ts"].to_numpy(), kernels["end"].to_numpy(), np.nan_to_num(kernels["dur"].to_numpy())
    comm = iv.union(ts[collective], end[collective])
    comp = iv.union(ts[computation], end[computation])
    starts, stops = step_windows(trace)
    comm_kernels = kernels[collective]
    per_name = comm_kernels.groupby("name", sort=False)["dur"].agg(["sum", "count"]).sort_values("sum", ascending=False)
    longest = int(np.argmax(np.nan_to_num(comm_kernels["dur"].to_numpy())))
    return CommunicationStats(
        kernel_us=float(dur.sum()),
        collective_us=float(dur[collective].sum()),
        collectives=int(collective.sum()),
        union_us=iv.total(comm),
        overlap_us=iv.total(iv.intersect(comm, comp)),
        step_us=float(np.clip(stops - starts, 0.0, None).sum()),
        in_steps_us=float(iv.overlap_per_window(comm, starts, stops).sum()),
        by_name=[
            {"name": str(n), "total_us": float(row["sum"]), "count": int(row["count"])}
            for n, row in per_name.head(MAX_NAMES_LISTED).iterrows()
        ],
        worst={
            "name": str(comm_kernels["name"].iloc[longest]),
            "ts": float(comm_kernels["ts"].iloc[longest]),
            "dur": float(comm_kernels["dur"].iloc[longest]),
        },
    )


def communication_summary(trace: Trace) -> dict[str, float | None]:
    """Summary keys: `communication_time_percent` (collectives' Σ dur ÷ all kernels' Σ dur × 100),
    `communication_step_percent` and `communication_overlap_percent` (as defined above); null without
    collectives (0.0 for the first where the trace has kernels but no collective)."""
    stats = communication_stats(trace)
    if stats is None:
        return {
            "communication_time_percent": 0.0 if len(trace.kernels) else None,
            "communication_step_percent": None,
            "communication_overlap_percent": None,
        }
    return {
        "communication_time_percent": stats.kernel_time_percent,
        "communication_step_percent": stats.step_percent,
        "communication_overlap_percent": stats.overlap_percent,
    }
