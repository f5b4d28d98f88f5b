"""Theoretical occupancy against an SM filled one block at a time (the gaps mutation testing found).

The reference never divides: it adds blocks while every resource still has room, so a wrong
floor, a lost limit or a wrong default shows up as a different block count or limiter.
"""

from __future__ import annotations

import itertools
import math

import pytest

from profiling.occupancy import DEFAULT_DEVICE, MAX_BLOCKS_PER_SM, theoretical_occupancy

# A toy SM whose limits are small and not multiples of each other, so each one can bind.
TOY = {
    "regsPerMultiprocessor": 4096,
    "maxThreadsPerMultiprocessor": 2000,  # not a whole number of warps: 62.5
    "sharedMemPerMultiprocessor": 8,
    "warpSize": 32,
    "maxBlocksPerMultiProcessor": 16,
}


def fill_one_block_at_a_time(registers: float, threads: int, shared: float, device: dict | None) -> tuple[int, set]:
    """Blocks that fit on one SM, and the resources the next block would overrun."""
    props = dict(DEFAULT_DEVICE) if device is None else {**DEFAULT_DEVICE, **device}
    warp_slots = props["maxThreadsPerMultiprocessor"] // props["warpSize"]  # whole warps only
    warps = max(1, -(-threads // props["warpSize"]))  # a partial warp still takes a warp slot
    blocks = 0
    while True:
        n = blocks + 1
        over = set()
        if n > props.get("maxBlocksPerMultiProcessor", MAX_BLOCKS_PER_SM):
            over.add("blocks")
        if n * warps > warp_slots:
            over.add("threads")
        if registers > 0 and n * registers * threads > props["regsPerMultiprocessor"]:
            over.add("registers")
        if shared > 0 and n * shared > props["sharedMemPerMultiprocessor"]:
            over.add("shared memory")
        if over:
            return blocks, over
        blocks = n


# Registers so scarce that even one per thread binds.
FEW_REGISTERS = {"regsPerMultiprocessor": 256}

GRID = list(
    itertools.product(
        [0, 1, 16, 64, 255],  # registers per thread (0: not reported)
        [1, 32, 33, 96, 256, 1024],  # threads per block: under a warp, a warp, a warp and one, ...
        [0, 1, 3, 48_000],  # shared memory per block
        [None, TOY, FEW_REGISTERS],
    )
)


@pytest.mark.parametrize(("registers", "threads", "shared", "device"), GRID)
def test_blocks_warps_and_limiter_match_filling_the_sm(registers, threads, shared, device):
    occ = theoretical_occupancy(registers, threads, shared, device)
    blocks, over = fill_one_block_at_a_time(registers, threads, shared, device)
    props = {**DEFAULT_DEVICE, **(device or {})}
    warps = max(1, math.ceil(threads / props["warpSize"]))
    assert occ.blocks_per_sm == blocks and type(occ.blocks_per_sm) is int
    assert occ.active_warps == blocks * warps
    assert occ.max_warps == props["maxThreadsPerMultiprocessor"] // props["warpSize"]
    assert type(occ.max_warps) is int
    assert occ.limiter in over  # the resource that stops the next block (ties: any of them)
    assert occ.percent == pytest.approx(100 * blocks * warps / occ.max_warps)


def test_hand_derived_limits_on_the_toy_sm():
    # 1 register x 1024 threads: 4096 / 1024 = 4 blocks by registers; 62 warp slots / 32 = 1 by threads.
    assert theoretical_occupancy(1, 1024, device=TOY).limiter == "threads"
    # 1 register x 64 threads: 64 blocks by registers, 31 by threads, 16 by the block cap.
    capped = theoretical_occupancy(1, 64, device=TOY)
    assert (capped.blocks_per_sm, capped.limiter) == (16, "blocks")
    # 1 register x 128 threads: 256 registers hold 2 blocks (threads would allow 16, the cap 32).
    few = theoretical_occupancy(1, 128, device=FEW_REGISTERS)
    assert (few.blocks_per_sm, few.limiter) == (2, "registers")
    # 1 byte of shared memory per block: 8 bytes hold 8 blocks.
    shared = theoretical_occupancy(0, 32, shared_memory=1, device=TOY)
    assert (shared.blocks_per_sm, shared.limiter) == (8, "shared memory")
    # 255 registers x 1024 threads need 261,120 registers: not one block fits on an A100's 65,536.
    none = theoretical_occupancy(255, 1024)
    assert (none.blocks_per_sm, none.active_warps, none.percent, none.limiter) == (0, 0, 0.0, "registers")


def test_a_device_without_warps_reports_zero_percent():
    occ = theoretical_occupancy(32, 128, device={"maxThreadsPerMultiprocessor": 16, "warpSize": 32})
    assert (occ.max_warps, occ.blocks_per_sm, occ.percent) == (0, 0, 0.0)
