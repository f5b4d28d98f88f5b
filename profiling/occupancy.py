"""Theoretical occupancy from a kernel's launch shape and the device's limits.

The blog's worked example: 128 threads x 255 registers = 32,640 registers per block, so 2
blocks fit in 65,536 registers; 2 x 4 warps = 8 of 64 warps, about 13%. That is flash's
design (big tiles in registers), not a stall.

Every limit and launch shape comes from a trace, so each is checked before any arithmetic: a
field that is not a whole number in range is replaced by the default and said so
(`device_limits`), and a block that is no launch shape gives no thread count (`block_threads`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
}
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
    for key, default in LIMIT_DEFAULTS.items():
        if device is None or key not in device:
            continue
        value = device[key]
        if whole_number(value):
            limits[key] = int(value)
        else:
            notes.append(f"deviceProperties {key} is {quoted(value)}, not a whole number from 1: {default} assumed")
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
    """How many blocks (and warps) of this kernel one SM can hold, and what limits it.

    `device` is a `deviceProperties` entry; its unusable fields are replaced by defaults (`device_limits`).
    """
    props, _ = device_limits(device)
    warp = props["warpSize"]
    max_warps = props["maxThreadsPerMultiprocessor"] // warp
    warps_per_block = max(1, math.ceil(threads_per_block / warp))
    limits = {
        "blocks": props["maxBlocksPerMultiProcessor"],
        "threads": max_warps // warps_per_block,
    }
    if registers_per_thread > 0:
        limits["registers"] = int(props["regsPerMultiprocessor"] // (registers_per_thread * threads_per_block))
    if shared_memory > 0:
        limits["shared memory"] = int(props["sharedMemPerMultiprocessor"] // shared_memory)
    limiter = min(limits, key=lambda k: limits[k])
    blocks = max(0, limits[limiter])
    return Occupancy(blocks, blocks * warps_per_block, max_warps, limiter)
