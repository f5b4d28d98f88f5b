"""Theoretical occupancy from a kernel's launch shape and the device's limits.

The blog's worked example: 128 threads x 255 registers = 32,640 registers per block, so 2
blocks fit in 65,536 registers; 2 x 4 warps = 8 of 64 warps, about 13%. That is flash's
design (big tiles in registers), not a stall.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Ampere/Hopper defaults, used when a trace has no `deviceProperties`.
DEFAULT_DEVICE = {
    "regsPerMultiprocessor": 65536,
    "maxThreadsPerMultiprocessor": 2048,
    "sharedMemPerMultiprocessor": 167936,
    "warpSize": 32,
}
MAX_BLOCKS_PER_SM = 32


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    active_warps: int
    max_warps: int
    limiter: str  # registers, shared memory, threads or blocks

    @property
    def percent(self) -> float:
        return 100.0 * self.active_warps / self.max_warps if self.max_warps else 0.0


def theoretical_occupancy(
    registers_per_thread: float, threads_per_block: int, shared_memory: float = 0, device: dict[str, Any] | None = None
) -> Occupancy:
    """How many blocks (and warps) of this kernel one SM can hold, and what limits it."""
    props = {**DEFAULT_DEVICE, **(device or {})}
    warp = int(props["warpSize"])
    max_warps = int(props["maxThreadsPerMultiprocessor"]) // warp
    warps_per_block = max(1, math.ceil(threads_per_block / warp))
    limits = {
        "blocks": int(props.get("maxBlocksPerMultiProcessor", MAX_BLOCKS_PER_SM)),
        "threads": max_warps // warps_per_block,
    }
    if registers_per_thread > 0:
        limits["registers"] = int(props["regsPerMultiprocessor"] // (registers_per_thread * threads_per_block))
    if shared_memory > 0:
        limits["shared memory"] = int(props["sharedMemPerMultiprocessor"] // shared_memory)
    limiter = min(limits, key=lambda k: limits[k])
    blocks = max(0, limits[limiter])
    return Occupancy(blocks, blocks * warps_per_block, max_warps, limiter)
