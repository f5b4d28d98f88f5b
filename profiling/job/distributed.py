"""The distributed view of a job, from its ranks' summaries: breakdown, sync wait, collectives, findings.

Sources:
- breakdown per rank and step: `rank_summary` (HTA's comm/comp overlap, the plugin's four parts);
- sync wait: the TensorBoard plugin (tb_plugin/torch_tb_profiler/profiler/loader.py,
  `_process_distributed_profiles`): the i-th collective of every rank is the same call, matched by order
  (the view is refused where the counts differ); its transfer time is the least duration over the ranks,
  and each rank's wait is its duration minus that. Absolute timestamps are never compared across ranks:
  their clocks are not synchronised;
- algorithmic bandwidth: nccl-tests' algbw, bytes ÷ time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profiling.insights.base import Finding
from profiling.job.rank_summary import PARTS, RankSummary
from profiling.kernels import decode_most, short_name_in

MAD_SCALE = 1.4826  # a normal distribution's σ ÷ its MAD
STRAGGLER_MADS = 3.0
STRAGGLER_MIN_FRACTION = 0.05  # a straggler is at least 5% above the others' median
EXPOSED_COMMUNICATION = 0.10  # the plugin's communication_ratio > 0.1, on the time nothing hides
LOW_OVERLAP = 0.50
IMBALANCE = 0.10


@dataclass
class DistributedView:
    """Tables in µs, one row per rank (or rank and step); `sync_refused` says why sync wait is absent."""

    per_step: pd.DataFrame
    per_rank: pd.DataFrame
    sync: pd.DataFrame | None
    sync_refused: str | None
    collectives: pd.DataFrame
    findings: list[Finding] = field(default_factory=list)


def distributed_view(ranks: dict[int, RankSummary]) -> DistributedView:
    """The view over the ranks that were read (`ranks`: rank -> its summary, without errors)."""
    per_step = _per_step(ranks)
    per_rank = _per_rank(per_step)
    sync, refused = sync_wait(ranks)
    if sync is not None:
        per_rank = per_rank.join(sync.set_index("rank")[["wait_us", "transfer_us"]], on="rank")
    return DistributedView(per_step, per_rank, sync, refused, collective_table(ranks), findings(per_rank))


def _per_step(ranks: dict[int, RankSummary]) -> pd.DataFrame:
    rows = [{"rank": rank, **step} for rank, summary in sorted(ranks.items()) for step in summary.steps]
    return pd.DataFrame(rows, columns=["rank", "step", "step_us", *PARTS])


def _per_rank(per_step: pd.DataFrame) -> pd.DataFrame:
    """Each rank's mean step; `overlap_percent`: the share of its collectives' time computation hides."""
    means = per_step.groupby("rank", sort=True)[["step_us", *PARTS]].mean().reset_index()
    means.insert(1, "steps", per_step.groupby("rank", sort=True).size().to_numpy())
    comm = means["communication"] + means["overlap"]
    means["overlap_percent"] = (100.0 * means["overlap"] / comm).where(comm > 0)
    return means


def sync_wait(ranks: dict[int, RankSummary]) -> tuple[pd.DataFrame | None, str | None]:
    """Per rank: collectives, their time, the transfer and the wait (µs); or None and the reason refused."""
    if len(ranks) < 2:
        return None, "sync wait needs at least two ranks"
    counts = {rank: len(s.collectives) for rank, s in ranks.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
        return None, f"the ranks ran different numbers of collectives ({listed}); they cannot be matched by order"
    order = sorted(ranks)
    durations = np.array([[c["dur_us"] for c in ranks[r].collectives] for r in order], dtype=float).reshape(
        len(order), -1
    )
    transfer = durations.min(axis=0, initial=np.inf) if durations.size else np.zeros(0)
    table = pd.DataFrame(
        {
            "rank": order,
            "collectives": durations.shape[1],
            "communication_us": durations.sum(axis=1),
            "transfer_us": np.full(len(order), transfer.sum()),
            "wait_us": (durations - transfer).sum(axis=1),
        }
    )
    return table, None


def collective_table(ranks: dict[int, RankSummary]) -> pd.DataFrame:
    """Per op (the kernel's `short_name`: no return type, templates or parameters) over all ranks: calls,
    bytes, total and average time (µs), and algorithmic bandwidth (GB/s). Names past the MAX_NAMES_DECODED
    with the most time are not decoded (`decode_most`): such an op is its whole name.

    Bytes and bandwidth count only the calls whose size the trace gives; unknown stays NaN, never 0."""
    calls = [c for summary in ranks.values() for c in summary.collectives]
    columns = ["op", "calls", "bytes", "total_us", "average_us", "algbw_GBps"]
    if not calls:
        return pd.DataFrame(columns=columns)
    names = np.array([c["name"] for c in calls], dtype=object)
    dur = np.array([c["dur_us"] for c in calls], dtype=np.float64)
    infos = decode_most(names, dur)
    frame = pd.DataFrame(
        {
            "op": [short_name_in(infos, name) for name in names],
            "dur_us": dur,
            "bytes": np.array([np.nan if c["bytes"] is None else c["bytes"] for c in calls], dtype=np.float64),
        }
    )
    sized = frame[frame["bytes"].notna()].groupby("op")
    table = frame.groupby("op").agg(calls=("dur_us", "size"), total_us=("dur_us", "sum"))
    table["bytes"] = sized["bytes"].sum().reindex(table.index)
    table["average_us"] = table["total_us"] / table["calls"]
    # Bytes per sized call over time per sized call; one byte per µs is 1e6 B/s, 1e-3 GB/s.
    per_call = sized["bytes"].mean() / sized["dur_us"].mean()
    table["algbw_GBps"] = (per_call / 1e3).reindex(table.index)
    return table.reset_index().sort_values("total_us", ascending=False, kind="stable")[columns]


def findings(per_rank: pd.DataFrame) -> list[Finding]:
    """Straggler, exposed communication, low overlap and load imbalance, each with its evidence."""
    if per_rank.empty:
        return []
    found = [*stragglers(per_rank), _exposed(per_rank), _low_overlap(per_rank), _imbalance(per_rank)]
    return [f for f in found if f is not None]


def straggler_threshold(others: np.ndarray) -> tuple[float, float]:
    """The others' median and how far above it a rank must be: max(3 × 1.4826 × MAD, 5% of the median)."""
    median = float(np.median(others))
    mad = float(np.median(np.abs(others - median)))
    return median, max(STRAGGLER_MADS * MAD_SCALE * mad, STRAGGLER_MIN_FRACTION * median)


def stragglers(per_rank: pd.DataFrame) -> list[Finding]:
    """Ranks whose mean step is slower than the other ranks' median by more than the threshold."""
    times = per_rank["step_us"].to_numpy(dtype=float)
    out = []
    for i, rank in enumerate(per_rank["rank"].tolist()):
        others = np.delete(times, i)
        if not len(others):
            continue
        median, threshold = straggler_threshold(others)
        if times[i] - median > threshold:
            out.append(_straggler(per_rank, i, int(rank), median, threshold))
    return out


def _straggler(per_rank: pd.DataFrame, i: int, rank: int, median: float, threshold: float) -> Finding:
    """The cause: the part of its own step that grew most against the other ranks' median of that part."""
    others = per_rank.drop(index=per_rank.index[i])
    excess = {part: float(per_rank[part].iloc[i] - others[part].median()) for part in PARTS}
    cause = max(excess, key=excess.__getitem__)
    step = float(per_rank["step_us"].iloc[i])
    return Finding(
        title=f"Rank {rank} is a straggler",
        detail=(
            f"its mean step takes {step:,.0f} µs, {step - median:,.0f} µs above the other ranks' median of "
            f"{median:,.0f} µs (threshold {threshold:,.0f} µs); most of the excess is {cause} "
            f"(+{excess[cause]:,.0f} µs)"
        ),
        evidence={"rank": rank, "step_us": step, "others_median_us": median, "threshold_us": threshold}
        | {"cause": cause, "excess_us": excess},
    )


def _ranks_where(per_rank: pd.DataFrame, mask: pd.Series) -> list[int]:
    return [int(r) for r in per_rank.loc[mask.fillna(False).astype(bool), "rank"]]


def _exposed(per_rank: pd.DataFrame) -> Finding | None:
    share = per_rank["communication"] / per_rank["step_us"]
    ranks = _ranks_where(per_rank, share >= EXPOSED_COMMUNICATION)
    if not ranks:
        return None
    return Finding(
        title="Exposed communication",
        detail=(
            f"collectives that no computation hides take {100 * share.max():.1f}% of the step at worst "
            f"(ranks {', '.join(map(str, ranks[:10]))}); the TensorBoard plugin flags 10%"
        ),
        evidence={
            "ranks": ranks,
            "exposed_percent": {int(r): float(100 * s) for r, s in zip(per_rank["rank"], share, strict=True)},
        },
    )


def _low_overlap(per_rank: pd.DataFrame) -> Finding | None:
    ranks = _ranks_where(per_rank, per_rank["overlap_percent"] < 100 * LOW_OVERLAP)
    if not ranks:
        return None
    worst = float(per_rank["overlap_percent"].min())
    return Finding(
        title="Low communication overlap",
        detail=f"computation hides under 50% of the collectives' time on ranks {', '.join(map(str, ranks[:10]))} "
        f"(lowest {worst:.1f}%)",
        evidence={"ranks": ranks, "overlap_percent": _by_rank(per_rank, "overlap_percent")},
    )


def _imbalance(per_rank: pd.DataFrame) -> Finding | None:
    compute = per_rank["computation"] + per_rank["overlap"]  # all of a rank's computation, hidden or not
    mean = float(compute.mean())
    if len(compute) < 2 or mean <= 0:
        return None
    spread = float(compute.max() - compute.min()) / mean
    if spread <= IMBALANCE:
        return None
    return Finding(
        title="Load imbalance",
        detail=f"computation per step ranges {compute.min():,.0f}-{compute.max():,.0f} µs over the ranks, "
        f"{100 * spread:.1f}% of its mean (rank {int(per_rank['rank'][compute.idxmax()])} computes most)",
        evidence={
            "spread_percent": 100 * spread,
            "computation_us": dict(zip(map(int, per_rank["rank"]), compute, strict=True)),
        },
    )


def _by_rank(per_rank: pd.DataFrame, column: str) -> dict[int, Any]:
    return {int(r): (None if pd.isna(v) else float(v)) for r, v in zip(per_rank["rank"], per_rank[column], strict=True)}
