"""Occupancy: what limits the blocks an SM holds, and what Kineto's estimate means.

Kineto's "est. achieved occupancy %" is no measurement but a static estimate from each launch's
shape, computed under the default 48 KiB per-block shared-memory limit (profiling/occupancy.py,
after libkineto DeviceProperties.cpp). The rule redoes it for every launch and explains only the
numbers it redoes:
- 0% for a kernel asking more shared memory per block than that default: an artefact of the
  estimate, given with the kernel's real fit under the opt-in limit (`sharedMemPerBlockOptin`);
- 0% for a grid of fewer blocks than the GPU has SMs, rounded down: the grid is the cause, said
  where such kernels hold at least REAL_TIME_PERCENT of kernel time;
- otherwise, for a kernel under LOW_OCCUPANCY_PERCENT, the limit that binds: registers, shared
  memory, block size, or a grid smaller than the SM count.
How a kernel was launched plays no part: a runtime-launched `sm90_xmma` GEMM shows 0%, a
driver-launched `fmhaSm100a` kernel 5%. ROCm traces carry no estimate (Kineto computes it from
CUPTI's kernel records only), and the rule says so rather than show nothing or 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiling.devices import DeviceMapping, describe, device_ids, is_amd, trace_mapping
from profiling.insights.base import (
    MAX_EVIDENCE_ITEMS,
    MAX_NAMES_DECODED,
    MAX_NAMES_IN_PROSE,
    MAX_NOTES,
    NAME_IN_LIST,
    Evidence,
    Finding,
    Rule,
    gpu_share,
)
from profiling.insights.base import short as cut
from profiling.insights.occupancy_launches import first_of_each, launches_of
from profiling.kernels import decode
from profiling.step_breakdown import step_at
from profiling.trace import codes_of, rows_where

LOW_OCCUPANCY_PERCENT = 25
# The kernel columns this rule reads: a million kernels' rows are taken from these alone.
KERNEL_COLUMNS = [
    *("name", "cat", "ts", "dur", "pid", "device"),
    *("registers", "shared_memory", "occupancy", "grid", "block"),
]
REAL_TIME_PERCENT = 1.0  # of kernel time: kernels holding less are not worth a sentence
LIMIT_WORDS = {"blocks": "the cap on blocks per SM", "threads": "block size"}  # else the limiter's own name


def occupancy(ev: Evidence) -> Finding | None:
    """Kineto's estimate explained by its definition, per kernel; the limit that binds where it is low."""
    gpu = ev.scope.gpu if len(ev.scope.gpu) else ev.trace.kernels
    gpu = gpu[KERNEL_COLUMNS]  # a selection, not a copy
    is_kernel = (gpu["cat"] == "kernel").to_numpy(dtype=bool) if len(gpu) else np.zeros(0, dtype=bool)
    if not is_kernel.any():
        return None
    mapping = trace_mapping(ev.trace)
    # Only the launches with CUPTI's shape are copied whole (a million rows at 1 GiB, and this rule held the
    # analysis's peak memory with every kernel copied beside them); the rest read two columns.
    shaped = rows_where(gpu, is_kernel & gpu["registers"].notna().to_numpy(dtype=bool))
    if shaped.empty:
        return _no_estimate(rows_where(gpu, is_kernel), mapping)
    kernels = rows_where(gpu[["name", "dur"]], is_kernel)
    launches, device_notes = launches_of(shaped, mapping)
    kernel_us = float(kernels["dur"].sum())
    codes, _ = codes_of(launches["name"])
    launches["code"] = codes
    first = launches.iloc[first_of_each(codes)]
    skipped, skipped_count = _skipped(first)
    rows = _per_name(launches, codes, first, kernel_us)
    artefact, tiny, explained = _artefacts(launches), _tiny_grids(launches), set()
    notes: list[str] = []
    evidence: dict[str, Any] = {"kernels": rows}
    if artefact.any():
        notes.append(_artefact_note(launches[artefact], kernel_us))
        evidence["shared_memory_artefact"] = _group_evidence(launches[artefact], kernel_us, artefact=True)
        explained |= set(launches.loc[artefact, "name"])
    if tiny.any() and _percent(launches.loc[tiny, "dur"].sum(), kernel_us) >= REAL_TIME_PERCENT:
        notes.append(_tiny_grid_note(launches[tiny], kernel_us))
        evidence["tiny_grid"] = _group_evidence(launches[tiny], kernel_us, artefact=False)
        explained |= set(launches.loc[tiny, "name"])
    limits = _binding_limit_notes([r for r in rows if r["kernel"] not in explained])
    notes += [note for _, note in limits]
    if limits:
        evidence["binding_limits"] = [row for row, _ in limits]
    about = explained | {row["kernel"] for row, _ in limits}
    if not notes:
        return None
    reported = launches["reported"].notna()
    evidence["estimate_reproduced"] = {
        "launches": int((launches["reported"] == launches["redone"]).sum()),
        "with_estimate": int(reported.sum()),
    }
    evidence |= _worst_instance(ev, launches[launches["name"].isin(about)])
    if skipped:
        evidence["skipped"] = skipped
        evidence["skipped_count"] = skipped_count
    if device_notes:
        evidence["device_notes"] = device_notes[:MAX_NOTES]
    # The share ranks findings by the GPU time at stake: an artefact of the estimate costs none, so only the
    # kernels whose occupancy is really bound (a limit, a tiny grid) count; a finding that only explains
    # artefacts is about no GPU time lost (None: listed after the costs, never dropped as under 1%).
    bound = about - (set(launches.loc[artefact, "name"]) - set(launches.loc[tiny, "name"]))
    busy = float(kernels.loc[kernels["name"].isin(bound), "dur"].sum())
    return Finding("Occupancy", "; ".join(notes) + ".", evidence, gpu_share(ev, busy) if busy > 0 else None)


def _no_estimate(kernels: pd.DataFrame, mapping: DeviceMapping) -> Finding | None:
    """On AMD, the absence of an estimate said once; elsewhere (a trace without CUPTI's fields) nothing."""
    devices = device_ids(kernels)
    known = devices[~np.isnan(devices)]
    entry = mapping.entry(float(known.min()) if len(known) else None)
    if not entry or not is_amd(entry):
        return None
    gpu = describe(entry)
    where = f"{gpu['gpu_name'] or 'an AMD GPU'}" + (f" ({gpu['gpu_arch']})" if gpu["gpu_arch"] else "")
    return Finding(
        "Occupancy: no estimate in a ROCm trace",
        f"the {len(kernels):,} kernels on {where} carry no est. achieved occupancy, blocks per SM or registers: "
        "Kineto computes those from CUPTI's kernel records, on NVIDIA GPUs only, so here they are unknown, not 0.",
        {"kernels_without_estimate": len(kernels), "gpu_name": gpu["gpu_name"], "gpu_arch": gpu["gpu_arch"]},
    )


def _skipped(first: pd.DataFrame) -> tuple[list[str], int]:
    """The first MAX_NOTES notes, and their count, on kernel names whose first launch (`first`) gives no usable
    block, or fits no block on its device (it ran, so the shape or the device described is not what ran)."""
    refused = first["why"].notna().to_numpy()
    unfit = ~refused & first["threads"].notna().to_numpy() & (first["blocks"].to_numpy() == 0)
    left_out = first[refused | unfit].iloc[:MAX_NOTES]
    notes = [
        f"{cut(name, NAME_IN_LIST)}: "
        + (why or f"not one block of it fits on an SM of the device described (by {limiter})")
        for name, why, limiter in left_out[["name", "why", "limiter"]].itertuples(index=False)
    ]
    return notes, int(refused.sum() + unfit.sum())


def _per_name(launches: pd.DataFrame, codes: np.ndarray, first: pd.DataFrame, kernel_us: float) -> list[dict[str, Any]]:
    """One row per kernel name (its first launch's shape), for the MAX_NAMES_DECODED names with the most
    kernel time, most first; names whose first launch fits no block are left out. The achieved occupancy
    is weighted by duration (the plugin's kernel table, kernel_parser.py), a plain mean where the launches
    took no time, None where none was reported."""
    n = len(first)
    occ, dur = launches["reported"].to_numpy(), launches["dur"].to_numpy()
    measured = ~np.isnan(occ)
    at = codes[measured]
    count = np.bincount(at, minlength=n)
    weight = np.bincount(at, weights=dur[measured], minlength=n)
    weighted = np.bincount(at, weights=(occ * dur)[measured], minlength=n)
    plain = np.bincount(at, weights=occ[measured], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        achieved = np.where(weight > 0, weighted / weight, np.where(count > 0, plain / count, np.nan))
    time = np.bincount(codes, weights=dur, minlength=n)
    usable = np.flatnonzero(first["threads"].notna().to_numpy() & (first["blocks"].to_numpy() > 0))
    kept = usable[np.argsort(-time[usable], kind="stable")][:MAX_NAMES_DECODED]
    return [
        {
            "kernel": row.name,
            "theoretical_percent": float(row.theoretical),
            "achieved_percent": None if np.isnan(a) else min(float(a), 100.0),  # rounding only: a mean of 0..100
            "limiter": row.limiter,
            "blocks_per_sm": int(row.blocks),
            "shared_memory_bytes": int(row.shared),
            "grid_blocks": _int(row.grid),
            "sm_count": _int(row.sms),
            "estimate_percent": None if np.isnan(row.estimate) else float(row.estimate),
            "time_percent": _percent(t, kernel_us),
        }
        for row, a, t in zip(first.iloc[kept].itertuples(index=False), achieved[kept], time[kept], strict=True)
    ]


def _artefacts(launches: pd.DataFrame) -> pd.Series:
    """Launches whose 0% the estimate's default shared-memory limit explains: more shared memory per block
    than that limit, a shape that fits under the opt-in one, and Kineto's 0% redone."""
    over_optin = launches["shared"] > launches["optin_limit"]  # NaN (no opt-in limit given) compares False
    fits = (launches["blocks"] > 0) & ~over_optin
    return (
        (launches["reported"] == 0)
        & (launches["redone"] == 0)
        & (launches["shared"] > launches["default_limit"])
        & fits
    )


def _tiny_grids(launches: pd.DataFrame) -> pd.Series:
    """Launches whose 0% is their grid's: fewer blocks than SMs, within the default shared-memory limit, and
    Kineto's 0% redone (grid / SMs x threads / max threads under half a percent)."""
    within = launches["shared"] <= launches["default_limit"]
    small = launches["grid"] < launches["sms"]
    return (launches["reported"] == 0) & (launches["redone"] == 0) & small & within & (launches["blocks"] > 0)


def _by_name(subset: pd.DataFrame) -> pd.DataFrame:
    """Per kernel name in `subset`: its longest launch's fields and its total time, the most time first."""
    order = np.argsort(-subset["dur"].to_numpy(), kind="stable")
    longest = subset.iloc[order].drop_duplicates("code")  # `code` numbers the names: no string hashing
    time = np.bincount(subset["code"].to_numpy(), weights=subset["dur"].to_numpy())
    longest = longest.assign(time=time[longest["code"].to_numpy()])
    return longest.sort_values("time", ascending=False, kind="stable").set_index("name")


def _who(per: pd.DataFrame) -> str:
    others = len(per) - 1
    return cut(per.index[0], NAME_IN_LIST) + (f" and {others} other kernel(s)" if others else "")


def _artefact_note(subset: pd.DataFrame, kernel_us: float) -> str:
    per = _by_name(subset)
    top = per.iloc[0]
    optin = f"the opt-in limit ({top.optin_limit:,.0f} B)" if not np.isnan(top.optin_limit) else "an opt-in limit"
    named = per.iloc[:MAX_NAMES_IN_PROSE]
    asks = "; ".join(f"{cut(n, NAME_IN_LIST)}: {b:,.0f} B" for n, b in zip(named.index, named["shared"], strict=True))
    return (
        f"{_who(per)} ({_percent(per['time'].sum(), kernel_us):.1f}% of kernel time) show 0% est. achieved "
        f"occupancy only because Kineto estimates it under the default per-block shared-memory limit "
        f"({top.default_limit:,.0f} B) and they ask for more ({asks} per block): an artefact of the estimate, not a "
        f"measurement. Under {optin}, {cut(per.index[0], NAME_IN_LIST)} fits {top.blocks:.0f} block(s) per SM, "
        f"{top.theoretical:.1f}% theoretical occupancy, limited by {_words(top.limiter)}"
    )


def _group_evidence(subset: pd.DataFrame, kernel_us: float, artefact: bool) -> dict[str, Any]:
    """A group's share of kernel time and its kernels with the most time (evidence lists hold no more), with
    each one's fit under the opt-in shared-memory limit where the group is the estimate's artefact."""
    per = _by_name(subset)
    top = per.iloc[:MAX_EVIDENCE_ITEMS]
    kernels = []
    for name, r in zip(top.index, top.itertuples(index=False), strict=True):
        entry = {"kernel": name, "grid_blocks": _int(r.grid), "sm_count": _int(r.sms)}
        if artefact:
            entry |= {"shared_memory_bytes": _int(r.shared), "optin_blocks_per_sm": int(r.blocks)}
            entry |= {"optin_theoretical_percent": float(r.theoretical), "limiter": r.limiter}
        kernels.append(entry | {"time_percent": _percent(r.time, kernel_us)})
    limits = {
        "default_limit_bytes": _int(top["default_limit"].iloc[0]),
        "optin_limit_bytes": _int(top["optin_limit"].iloc[0]),
    }
    return {"time_percent": _percent(per["time"].sum(), kernel_us), **(limits if artefact else {}), "kernels": kernels}


def _tiny_grid_note(subset: pd.DataFrame, kernel_us: float) -> str:
    per = _by_name(subset)
    lo, hi, sms = int(subset["grid"].min()), int(subset["grid"].max()), int(subset["sms"].max())
    blocks = f"{lo} block(s)" if lo == hi else f"{lo} to {hi} blocks"
    return (
        f"{_who(per)} ({_percent(per['time'].sum(), kernel_us):.1f}% of kernel time) launch {blocks} on a GPU of "
        f"{sms} SMs, so Kineto's estimate (at most grid / SMs blocks per SM) rounds to 0%: most SMs have no block "
        "to run, and the cause is the grid, not the kernel's registers or shared memory"
    )


def _binding_limit_notes(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """(row, note) for the first MAX_NAMES_IN_PROSE kernels holding REAL_TIME_PERCENT of kernel time whose
    theoretical occupancy, or whose estimate for want of blocks, is under LOW_OCCUPANCY_PERCENT."""
    notes = []
    for row in rows:
        if row["time_percent"] < REAL_TIME_PERCENT or len(notes) == MAX_NAMES_IN_PROSE:
            break
        note = _binding_limit(row)
        if note:
            notes.append((row, note))
    return notes


def _binding_limit(row: dict[str, Any]) -> str | None:
    name, percent, limiter = cut(row["kernel"], NAME_IN_LIST), row["theoretical_percent"], _words(row["limiter"])
    grid, sms, estimate = row["grid_blocks"], row["sm_count"], row["estimate_percent"]
    short_grid = grid is not None and sms is not None and estimate is not None and grid < sms
    grid_clause = (
        f"; its grid of {grid} block(s) on {sms} SMs leaves SMs idle, so Kineto's estimate is {estimate:.1f}%"
        if short_grid
        else ""
    )
    # Fused attention families end in "-attention" (profiling/kernels.py): their big register tiles are chosen.
    if percent < LOW_OCCUPANCY_PERCENT and decode(row["kernel"]).family.endswith("-attention"):
        return (
            f"{name} holds {row['blocks_per_sm']} block(s) per SM ({percent:.1f}% theoretical, limited by {limiter}): "
            "low occupancy by design, big tiles in registers hide latency" + grid_clause
        )
    if percent < LOW_OCCUPANCY_PERCENT:
        return f"{name} is limited to {percent:.1f}% occupancy by {limiter}" + grid_clause
    if short_grid and estimate < LOW_OCCUPANCY_PERCENT:
        return (
            f"{name}'s grid of {grid} block(s) is smaller than the GPU's {sms} SMs, so Kineto's estimate is "
            f"{estimate:.1f}% (an SM could hold {percent:.1f}%)"
        )
    return None


def _worst_instance(ev: Evidence, subset: pd.DataFrame) -> dict[str, Any]:
    """The longest launch the finding talks about, to find in Perfetto: its kernel, µs, absolute ts and step."""
    if subset.empty:
        return {}
    worst = subset.loc[subset["dur"].idxmax()]
    return {
        "worst_kernel": worst["name"],
        "worst_us": float(worst["dur"]),
        "ts_us": float(worst["ts"]) + ev.trace.ts_base_us,
        "step": step_at(ev.trace, worst["ts"], device_side=True),
    }


def _words(limiter: str) -> str:
    return LIMIT_WORDS.get(limiter, limiter)


def _percent(part: float, whole: float) -> float:
    return 100.0 * float(part) / whole if whole > 0 else 0.0


def _int(value: float) -> int | None:
    return None if value is None or np.isnan(value) else int(value)


RULES: tuple[Rule, ...] = (
    Rule(
        "occupancy",
        "registers x threads, shared memory and grid vs deviceProperties; Kineto's estimate redone",
        occupancy,
    ),
)
