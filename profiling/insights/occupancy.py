"""Occupancy: what limits the blocks an SM holds, and what Kineto's estimate means."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiling.gpu_metrics import DeviceIndex, device_ids, device_index, valid_occupancy
from profiling.insights.attention import ATTENTION_FAMILIES
from profiling.insights.base import MAX_NAMES_IN_PROSE, MAX_NOTES, NAME_IN_LIST, Evidence, Finding, Rule, short
from profiling.kernels import decode
from profiling.occupancy import block_threads, device_limits, theoretical_occupancy
from profiling.trace import Trace

LOW_OCCUPANCY_PERCENT = 25


def occupancy(ev: Evidence) -> Finding | None:
    """Theoretical occupancy per kernel name (its first launch's shape), achieved beside it; a note for the
    first few that are low. Computed once per distinct shape and device, never once per name in Python."""
    kernels = ev.scope.gpu if len(ev.scope.gpu) else ev.trace.kernels
    kernels = kernels[(kernels["cat"] == "kernel") & kernels["registers"].notna()] if len(kernels) else kernels
    if kernels.empty:
        return None
    per_name = _per_kernel_name(kernels, ev.trace)
    rows, skipped, device_notes = _occupancy_rows(per_name, device_index(ev.trace))
    notes = []
    for row in rows:
        note = _occupancy_note(row)
        if note:
            notes.append(note)
            if len(notes) == MAX_NAMES_IN_PROSE:  # the prose names no more, so no more names are decoded
                break
    if not notes:
        return None
    evidence: dict[str, Any] = {"kernels": rows}
    if skipped:
        evidence["skipped"] = skipped[:MAX_NOTES]
        evidence["skipped_count"] = len(skipped)
    if device_notes:
        evidence["device_notes"] = device_notes[:MAX_NOTES]
    return Finding("Occupancy", "; ".join(notes) + ".", evidence)


def _per_kernel_name(kernels: pd.DataFrame, trace: Trace) -> pd.DataFrame:
    """One row per kernel name, in order of first launch: that launch's shape and device, the achieved
    occupancy weighted by duration (the plugin's kernel table, kernel_parser.py; a plain mean where the
    launches took no time; impossible values left out, as `gpu_metrics.valid_occupancy` says), and
    whether any launch went through the driver API."""
    codes, names = pd.factorize(kernels["name"].to_numpy())
    first = np.unique(codes, return_index=True)[1]
    n = len(names)
    occ = valid_occupancy(kernels["occupancy"].to_numpy())
    dur = kernels["dur"].to_numpy()
    measured = ~np.isnan(occ)
    at = codes[measured]
    count = np.bincount(at, minlength=n)
    weight = np.bincount(at, weights=dur[measured], minlength=n)
    weighted = np.bincount(at, weights=(occ * dur)[measured], minlength=n)
    plain = np.bincount(at, weights=occ[measured], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        achieved = np.where(weight > 0, weighted / weight, np.where(count > 0, plain / count, np.nan))
    driver = trace.of_category("cuda_driver")["correlation"].dropna().to_numpy()
    by_driver = np.bincount(codes, weights=kernels["correlation"].isin(driver).to_numpy(), minlength=n) > 0
    return pd.DataFrame(
        {
            "kernel": names,
            "block": kernels["block"].to_numpy()[first],
            "registers": kernels["registers"].to_numpy()[first],
            "shared_memory": np.nan_to_num(kernels["shared_memory"].to_numpy()[first], nan=0.0),
            "device": device_ids(kernels.iloc[first]),
            "achieved": np.minimum(achieved, 100.0),  # rounding only: a mean of values in 0..100
            "driver_launch": by_driver,
        }
    )


def _occupancy_rows(per_name: pd.DataFrame, index: DeviceIndex) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The insight's row per kernel name; a note per name left out (a shape no launch can have, or one
    that fits no block on the device described); and the notes on unusable `deviceProperties` fields.
    Each distinct shape on a device is computed once."""
    devices: dict[float | None, tuple[dict[str, int], list[str]]] = {}
    shapes: dict[tuple[int, float, float, float], tuple[Any, str | None]] = {}
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name, block, registers, shared, number, achieved, driver in per_name.itertuples(index=False):
        device = None if np.isnan(number) else float(number)
        if device not in devices:  # a kernel on a device the trace does not list is read against its first
            devices[device] = device_limits(index.entry(device) or index.entry(None))
        limits = devices[device][0]
        key = (id(block), registers, shared, device)  # the reader shares one object per distinct block
        if key not in shapes:
            shapes[key] = _shape_occupancy(block, registers, shared, limits)
        theory, why = shapes[key]
        if why:
            skipped.append(f"{short(name, NAME_IN_LIST)}: {why}")
        if theory is None:
            continue
        rows.append(
            {
                "kernel": name,
                "theoretical_percent": theory.percent,
                "achieved_percent": None if np.isnan(achieved) else float(achieved),
                "limiter": theory.limiter,
                "blocks_per_sm": theory.blocks_per_sm,
                "driver_launch": bool(driver),
            }
        )
    device_notes = list(dict.fromkeys(note for _, notes in devices.values() for note in notes))
    return rows, skipped, device_notes


def _shape_occupancy(block: Any, registers: float, shared: float, limits: dict[str, int]) -> tuple[Any, str | None]:
    """The theoretical occupancy of one launch shape, or None and why it was left out (None: no shape)."""
    threads, why = block_threads(block, limits["maxThreadsPerBlock"])
    if threads is None:
        return None, why
    theory = theoretical_occupancy(registers, threads, shared, limits)
    if theory.blocks_per_sm == 0:  # it ran, so the shape or the device described is not what ran
        return None, f"not one block of it fits on an SM of the device described (by {theory.limiter})"
    return theory, None


def _occupancy_note(row: dict[str, Any]) -> str | None:
    name, percent = short(row["kernel"], NAME_IN_LIST), row["theoretical_percent"]
    if row["achieved_percent"] == 0 and row["driver_launch"]:
        return (
            f"{name} reports 0% achieved occupancy, but it was launched through the driver API "
            "(cuLaunchKernel/cuLaunchKernelEx), which CUPTI does not measure: a measurement gap, not a stall"
        )
    if percent < LOW_OCCUPANCY_PERCENT and decode(row["kernel"]).family in ATTENTION_FAMILIES:
        return (
            f"{name} holds {row['blocks_per_sm']} block(s) per SM ({percent:.0f}% theoretical, limited by "
            f"{row['limiter']}): low occupancy by design, big tiles in registers hide latency"
        )
    if percent < LOW_OCCUPANCY_PERCENT:
        return f"{name} is limited to {percent:.0f}% occupancy by {row['limiter']}"
    return None


RULES: tuple[Rule, ...] = (Rule("occupancy", "registers x threads, shared memory, deviceProperties", occupancy),)
