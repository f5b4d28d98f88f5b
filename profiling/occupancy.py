"""Theoretical occupancy from a kernel's launch shape and the device's limits, and Kineto's estimate.

The blog's worked example: 128 threads x 255 registers = 32,640 registers per block, so 2
blocks fit in 65,536 registers; 2 x 4 warps = 8 of 64 warps, about 13%. That is flash's
design (big tiles in registers), not a stall.

The fit follows CUDA's occupancy calculator (cuda_occupancy.h, `cudaOccMaxActiveBlocksPerMultiprocessor`)
for compute capability 8 and later: registers are given to each warp in units of 256 and split
among the SM's 4 sub-partitions; each block's shared memory is rounded up to 128 bytes after the
1 KiB the driver reserves per block since Ampere. Without that rounding a LayerNorm of 34 registers
reads 94% where Kineto wrote 75%.

Kineto's "est. achieved occupancy %" is no measurement. libkineto (src/DeviceProperties.cpp,
`kernelOccupancy`) asks that calculator for the active blocks per SM with `FUNC_SHMEM_LIMIT_DEFAULT`,
i.e. the default 48 KiB per-block shared-memory limit, takes the smaller of that and grid / SMs,
and multiplies by threads per block / max threads per SM, rounded to a whole percent. So a kernel
asking more than 48 KiB of shared memory per block (an opted-in GEMM tile) gets 0 blocks, hence
0%, however it ran; and a grid of a few blocks on 132 SMs rounds to 0%. `kineto_estimate` redoes it.

Every limit and launch shape comes from a trace, so each is checked before any arithmetic: a
field that is not a whole number in range is replaced by the default and said so
(`device_limits`), and a block that is no launch shape gives no thread count (`block_threads`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# Ampere/Hopper defaults, used when a trace has no `deviceProperties` (or an unusable field).
DEFAULT_DEVICE = {
    "regsPerMultiprocessor": 65536,
    "maxThreadsPerMultiprocessor": 2048,
    "sharedMemPerMultiprocessor": 167936,
    "warpSize": 32,
}
MAX_BLOCKS_PER_SM = 32
# CUDA's limit since compute capability 2.0, and HIP's; `maxThreadsPerBlock` where a trace gives it.
MAX_THREADS_PER_BLOCK = 1024
# deviceProperties fields are C ints (cudaDeviceProp): from 1 to 2^31 - 1 for every limit read here.
LARGEST_LIMIT = 2**31 - 1
LIMIT_DEFAULTS = {
    **DEFAULT_DEVICE,
    "maxBlocksPerMultiProcessor": MAX_BLOCKS_PER_SM,
    "maxThreadsPerBlock": MAX_THREADS_PER_BLOCK,
    "sharedMemPerBlock": 49152,  # the default per-block limit on every CUDA GPU; more needs an opt-in
}
# Limits with no default: without them there is no estimate to redo (SM count), no opt-in fit, and the
# calculator's pre-Ampere rules (no reserved shared memory, 256-byte units) cannot be told apart.
OPTIONAL_LIMITS = ("numSms", "sharedMemPerBlockOptin", "computeMajor")
REGISTER_UNIT = 256  # registers per warp are allocated in units of 256 (cudaOccRegAllocationGranularity)
SUB_PARTITIONS = 4  # an SM's registers are split among 4 schedulers (cudaOccSubPartitionsPerMultiprocessor)
SHARED_UNIT = 128  # shared memory per block is allocated in units of 128 bytes (cudaOccSMemAllocationGranularity)
SHARED_UNIT_BEFORE_AMPERE = 256
RESERVED_SHARED = 1024  # bytes the driver reserves per block since Ampere (cudaOccSMemPerBlock)
LIMITERS = ("blocks", "threads", "registers", "shared memory")  # ties go to the first
# The most blocks one grid can hold along each axis (CUDA's limits: 2^31 - 1, 65,535, 65,535).
MAX_GRID = (LARGEST_LIMIT, 65535, 65535)
QUOTED = 40  # characters of a bad value quoted in a note


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    active_warps: int
    max_warps: int
    limiter: str  # registers, shared memory, threads or blocks

    @property
    def percent(self) -> float:
        return 100.0 * self.active_warps / self.max_warps if self.max_warps else 0.0


def whole_number(value: object, largest: float = LARGEST_LIMIT, smallest: int = 1) -> bool:
    """A JSON number (not a bool) with a whole value from `smallest` to `largest`."""
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        return False
    return smallest <= value <= largest and value == int(value)  # type: ignore[operator, call-overload]


def quoted(value: object) -> str:
    """A bad value for a note: a container by its size (its repr could be megabytes), else its repr, cut."""
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__} of {len(value)}"
    text = repr(value[: QUOTED + 1] if isinstance(value, str) else value)
    return text if len(text) <= QUOTED else text[: QUOTED - 1] + "…"


def device_limits(device: Mapping[str, Any] | None) -> tuple[dict[str, int], list[str]]:
    """The SM limits occupancy reads, from a `deviceProperties` entry; a default for each missing field,
    and for each field that is not a whole number from 1 to 2^31 - 1, with a note naming it."""
    limits = dict(LIMIT_DEFAULTS)
    notes: list[str] = []
    for key in (*LIMIT_DEFAULTS, *OPTIONAL_LIMITS):
        if device is None or key not in device:
            continue
        value = device[key]
        if whole_number(value):
            limits[key] = int(value)
        else:
            assumed = f"{LIMIT_DEFAULTS[key]} assumed" if key in LIMIT_DEFAULTS else "left out"
            notes.append(f"deviceProperties {key} is {quoted(value)}, not a whole number from 1: {assumed}")
    return limits, notes


def block_threads(block: object, max_threads: int = MAX_THREADS_PER_BLOCK) -> tuple[int | None, str | None]:
    """Threads per block from a kernel's `block` arg: (threads, None); (None, None) when the trace gives no
    shape; (None, why) when it gives one no launch can have (not 1 to 3 whole numbers, or over `max_threads`)."""
    if block is None:
        return None, None
    if not (isinstance(block, list) and 1 <= len(block) <= 3 and all(whole_number(b, max_threads) for b in block)):
        return None, f"block {quoted(block)} is not 1 to 3 whole numbers from 1 to {max_threads}"
    threads = math.prod(int(b) for b in block)
    if threads > max_threads:
        return None, f"block {block} has {threads} threads, over the {max_threads} a block can have"
    return threads, None


def theoretical_occupancy(
    registers_per_thread: float, threads_per_block: int, shared_memory: float = 0, device: dict[str, Any] | None = None
) -> Occupancy:
    """How many blocks (and warps) of this kernel one SM can hold, and what limits it (`sm_fit`).

    `device` is a `deviceProperties` entry; its unusable fields are replaced by defaults (`device_limits`).
    """
    props, _ = device_limits(device)
    blocks, warps, max_warps, limiter = sm_fit(
        np.array([registers_per_thread], dtype=np.float64),
        np.array([threads_per_block]),
        np.array([shared_memory]),
        props,
    )
    return Occupancy(int(blocks[0]), int(blocks[0] * warps[0]), int(max_warps[0]), LIMITERS[int(limiter[0])])


def sm_fit(
    registers: np.ndarray, threads: np.ndarray, shared: np.ndarray, limits: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per launch: blocks that fit on one SM, warps per block, warp slots per SM, and the index in LIMITERS of
    the limit that binds. `limits` holds a number or an array per launch for each key of `device_limits`.

    Every kernel that ran fitted its per-block shared-memory limit, the opt-in one where it asked more
    than 48 KiB, so only the SM's own capacity is checked here (`kineto_estimate` applies the default).
    """
    lim = {key: np.asarray(value, dtype=np.float64) for key, value in limits.items()}
    warp = lim["warpSize"]
    warps = np.maximum(1, np.ceil(threads / warp))
    max_warps = lim["maxThreadsPerMultiprocessor"] // warp
    per_warp = np.ceil(np.maximum(registers, 0) * warp / REGISTER_UNIT) * REGISTER_UNIT
    major = lim.get("computeMajor", np.nan)
    ampere = ~(major < 8)  # an unknown capability takes the defaults' (Ampere/Hopper) rules
    allocated = _round_up(
        np.maximum(shared, 0) + np.where(ampere, RESERVED_SHARED, 0),
        np.where(ampere, SHARED_UNIT, SHARED_UNIT_BEFORE_AMPERE),
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        by_registers = (lim["regsPerMultiprocessor"] // SUB_PARTITIONS // per_warp) * SUB_PARTITIONS // warps
        candidates = np.stack(
            np.broadcast_arrays(
                lim["maxBlocksPerMultiProcessor"],
                max_warps // warps,
                np.where(per_warp > 0, by_registers, np.inf),
                np.where(allocated > 0, lim["sharedMemPerMultiprocessor"] // allocated, np.inf),
            )
        )
    limiter = np.argmin(candidates, axis=0)
    blocks = np.maximum(0, np.take_along_axis(candidates, limiter[None], axis=0)[0]).astype(np.int64)
    return blocks, warps.astype(np.int64), np.broadcast_to(max_warps, blocks.shape).astype(np.int64), limiter


def _round_up(value: np.ndarray, unit: np.ndarray) -> np.ndarray:
    return np.ceil(value / unit) * unit


def kineto_estimate(
    blocks_per_sm: np.ndarray,
    threads: np.ndarray,
    shared: np.ndarray,
    grid_blocks: np.ndarray,
    limits: Mapping[str, Any],
) -> np.ndarray:
    """Kineto's est. achieved occupancy in %, before it rounds to a whole percent (libkineto
    DeviceProperties.cpp, `kernelOccupancy`): the calculator's blocks per SM under the DEFAULT per-block
    shared-memory limit (0 for a kernel asking more), capped by grid / SMs, x threads / max threads per SM.
    NaN where the SM count is not known."""
    lim = {key: np.asarray(value, dtype=np.float64) for key, value in limits.items()}
    sms = lim.get("numSms", np.nan)
    by_default = np.where(shared > lim["sharedMemPerBlock"], 0, blocks_per_sm)
    with np.errstate(divide="ignore", invalid="ignore"):
        return 100.0 * np.minimum(by_default, grid_blocks / sms) * threads / lim["maxThreadsPerMultiprocessor"]


def kineto_rounded(estimate: np.ndarray) -> np.ndarray:
    """The whole percent Kineto writes: `(int) (0.5 + occupancy * 100.0)` (libkineto output_json.cpp)."""
    return np.floor(0.5 + estimate)


def grid_blocks(grid: object) -> int | None:
    """Blocks in a launch's `grid` arg: 1 to 3 whole numbers within CUDA's grid limits; None for anything else."""
    if not (isinstance(grid, list) and 1 <= len(grid) <= 3):
        return None
    if not all(whole_number(g, top) for g, top in zip(grid, MAX_GRID, strict=False)):
        return None
    return math.prod(int(g) for g in grid)
