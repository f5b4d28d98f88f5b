"""The occupancy rule's launches (profiling/insights/occupancy.py): per kernel launch with CUPTI's shape, its
threads, grid, the device's limits, the SM fit and Kineto's estimate redone (profiling/occupancy.py), each
shape checked once per distinct object the reader shares."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from profiling.devices import DeviceMapping, device_ids
from profiling.gpu_metrics import valid_occupancy
from profiling.occupancy import (
    LIMITERS,
    block_threads,
    device_limits,
    grid_blocks,
    kineto_estimate,
    kineto_rounded,
    sm_fit,
)


def launches_of(shaped: pd.DataFrame, mapping: DeviceMapping) -> tuple[pd.DataFrame, list[str]]:
    """Per launch: its shape, the device's limits, the SM fit, and Kineto's estimate redone; and the notes
    on unusable limits."""
    devices = device_ids(shaped)
    codes, distinct = pd.factorize(devices, use_na_sentinel=False)
    # A kernel on a device the trace does not describe is read against its first entry, as before.
    per_device = [device_limits(mapping.entry(None if np.isnan(d) else d) or mapping.entry(None)) for d in distinct]
    keys = dict.fromkeys(key for limits, _ in per_device for key in limits)
    limits = {k: np.array([lim.get(k, np.nan) for lim, _ in per_device], dtype=np.float64)[codes] for k in keys}
    threads, why = _threads(shaped["block"].to_numpy(), codes, limits["maxThreadsPerBlock"])
    registers = shaped["registers"].to_numpy(dtype=np.float64)
    shared = np.nan_to_num(shaped["shared_memory"].to_numpy(dtype=np.float64), nan=0.0)
    blocks, warps, max_warps, limiter = sm_fit(registers, np.nan_to_num(threads, nan=1.0), shared, limits)
    grid = _per_object(shaped["grid"].to_numpy(), grid_blocks)
    estimate = kineto_estimate(blocks, threads, shared, grid, limits)
    launches = pd.DataFrame(
        {
            "name": shaped["name"].array,  # a Categorical stays one: `codes_of` reads its codes
            "dur": shaped["dur"].to_numpy(dtype=np.float64),
            "ts": shaped["ts"].to_numpy(dtype=np.float64),
            "reported": valid_occupancy(shaped["occupancy"].to_numpy()),
            "threads": threads,
            "why": why,
            "registers": registers,
            "shared": shared,
            "grid": grid,
            "sms": limits.get("numSms", np.full(len(shaped), np.nan)),
            "default_limit": limits["sharedMemPerBlock"],
            "optin_limit": limits.get("sharedMemPerBlockOptin", np.full(len(shaped), np.nan)),
            "blocks": np.where(np.isnan(threads), 0, blocks),
            "theoretical": 100.0 * blocks * warps / np.where(max_warps > 0, max_warps, np.nan),
            "limiter": np.asarray(LIMITERS, dtype=object)[limiter],
            "estimate": estimate,
            "redone": kineto_rounded(estimate),
        },
        copy=False,  # each array a column as it is: copied into one float block, they held twice their memory
    )
    device_notes = list(dict.fromkeys(note for _, notes in per_device for note in notes))
    return launches, device_notes


def _threads(blocks: np.ndarray, devices: np.ndarray, max_threads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Threads per block per launch (NaN where none) and why a shape was refused (None where it was not),
    checked once per distinct block object and device (the reader shares one object per distinct value)."""
    objects, _ = pd.factorize(np.fromiter(map(id, blocks), dtype=np.int64, count=len(blocks)))
    key, _ = pd.factorize(objects.astype(np.int64) * (int(devices.max(initial=0)) + 1) + devices)
    first = first_of_each(key)
    checked = [block_threads(blocks[i], int(max_threads[i])) for i in first]
    threads = np.array([np.nan if t is None else t for t, _ in checked], dtype=np.float64)
    return threads[key], np.array([w for _, w in checked], dtype=object)[key]


def _per_object(values: np.ndarray, read: Callable[[object], int | None]) -> np.ndarray:
    """`read(value)` per launch (NaN where None), called once per distinct object."""
    key, _ = pd.factorize(np.fromiter(map(id, values), dtype=np.int64, count=len(values)))
    out = np.array([np.nan if (v := read(values[i])) is None else v for i in first_of_each(key)], dtype=np.float64)
    return out[key]


def first_of_each(codes: np.ndarray) -> np.ndarray:
    """The position of each code's first occurrence, in code order (pd.factorize numbers them as they come)."""
    first = np.full(codes.max(initial=-1) + 1, len(codes), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(codes)))
    return first
