"""Theoretical occupancy against an SM filled one block at a time (the gaps mutation testing found).

The reference never divides a limit: it adds blocks while every resource still has room, placing
each warp's registers on the least-used of the SM's 4 sub-partitions and rounding each allocation
up by adding whole units, as CUDA's occupancy calculator (cuda_occupancy.h) allocates them. So a
wrong floor, a lost limit, a lost rounding or a wrong default shows up as a different block count
or limiter.
"""

from __future__ import annotations

import itertools
import math

import pytest

from profiling.occupancy import DEFAULT_DEVICE, MAX_BLOCKS_PER_SM, theoretical_occupancy

# A toy SM whose limits are small and not multiples of each other, so each one can bind. Compute
# capability 7: no shared memory reserved per block, allocated in units of 256 bytes.
TOY = {
    "regsPerMultiprocessor": 4096,  # 1,024 per sub-partition: 4 warps at the smallest allocation
    "maxThreadsPerMultiprocessor": 2000,  # not a whole number of warps: 62.5
    "sharedMemPerMultiprocessor": 2048,  # 8 units of 256 bytes
    "warpSize": 32,
    "maxBlocksPerMultiProcessor": 16,
    "computeMajor": 7,
}


def _allocated(size: float, unit: int) -> int:
    """`size` rounded up to whole `unit`s, by adding units."""
    total = 0
    while total < size:
        total += unit
    return total


def fill_one_block_at_a_time(registers: float, threads: int, shared: float, device: dict | None) -> tuple[int, set]:
    """Blocks that fit on one SM, and the resources the next block would overrun."""
    props = dict(DEFAULT_DEVICE) if device is None else {**DEFAULT_DEVICE, **device}
    warp = props["warpSize"]
    warp_slots = props["maxThreadsPerMultiprocessor"] // warp  # whole warps only
    warps = max(1, -(-threads // warp))  # a partial warp still takes a warp slot
    ampere = props.get("computeMajor", 8) >= 8  # no capability given: the defaults are Ampere/Hopper's
    per_warp = _allocated(registers * warp, 256)
    per_block_shared = _allocated(shared + (1024 if ampere else 0), 128 if ampere else 256)
    sub_partitions = [0, 0, 0, 0]  # registers taken in each of the SM's 4 sub-partitions
    blocks = 0
    while True:
        n = blocks + 1
        over = set()
        if n > props.get("maxBlocksPerMultiProcessor", MAX_BLOCKS_PER_SM):
            over.add("blocks")
        if n * warps > warp_slots:
            over.add("threads")
        trial = list(sub_partitions)
        for _ in range(warps):
            trial[trial.index(min(trial))] += per_warp
        if per_warp and any(4 * used > props["regsPerMultiprocessor"] for used in trial):
            over.add("registers")
        if per_block_shared and n * per_block_shared > props["sharedMemPerMultiprocessor"]:
            over.add("shared memory")
        if over:
            return blocks, over
        blocks, sub_partitions = n, trial


# Registers so scarce that they bind at once: 1,024 per sub-partition, on Ampere's rules.
FEW_REGISTERS = {"regsPerMultiprocessor": 4096}

GRID = list(
    itertools.product(
        [0, 1, 9, 16, 64, 255],  # registers per thread (0: not reported; 9: 288 per warp, allocated 512)
        [1, 32, 33, 96, 256, 1024],  # threads per block: under a warp, a warp, a warp and one, ...
        [0, 1, 3, 55_000],  # shared memory per block (55,000: 3 blocks on 164 KiB, 2 after the reserve)
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
    # 0 registers x 1024 threads: 62 warp slots hold one block of 32 warps.
    assert theoretical_occupancy(0, 1024, device=TOY).limiter == "threads"
    # 0 registers x 32 threads: 62 blocks by warps, 16 by the block cap.
    capped = theoretical_occupancy(0, 32, device=TOY)
    assert (capped.blocks_per_sm, capped.limiter) == (16, "blocks")
    # 1 register x 64 threads: a warp takes 32 registers, allocated 256; 1,024 per sub-partition hold 4 warps,
    # 16 on the SM: 8 blocks of 2 warps (not 64, as 4,096 / 64 registers would say).
    few = theoretical_occupancy(1, 64, device=TOY)
    assert (few.blocks_per_sm, few.limiter) == (8, "registers")
    # 9 registers: 288 per warp, allocated 512: 2 warps per sub-partition, 8 on the SM, 4 blocks of 2 warps.
    assert theoretical_occupancy(9, 64, device=TOY).blocks_per_sm == 4
    # 1 byte of shared memory takes a 256-byte unit before Ampere: 2,048 bytes hold 8 blocks.
    shared = theoretical_occupancy(0, 32, shared_memory=1, device=TOY)
    assert (shared.blocks_per_sm, shared.limiter) == (8, "shared memory")
    # Ampere reserves 1 KiB per block: 55,000 + 1,024 bytes, allocated 56,064, fit twice in 167,936 (not 3 times).
    reserved = theoretical_occupancy(0, 32, shared_memory=55_000)
    assert (reserved.blocks_per_sm, reserved.limiter) == (2, "shared memory")
    # 255 registers x 1024 threads: 8,192 per warp, 2 warps per sub-partition, 8 on the SM: no block of 32 warps.
    none = theoretical_occupancy(255, 1024)
    assert (none.blocks_per_sm, none.active_warps, none.percent, none.limiter) == (0, 0, 0.0, "registers")
    # A LayerNorm of 34 registers x 128 threads on an H100: 1,088 registers per warp, allocated 1,280; 12 warps
    # per sub-partition, 48 on the SM, 12 blocks: 75%, as Kineto wrote for it (h100_owlv2_eager-attn).
    norm = theoretical_occupancy(34, 128)
    assert (norm.blocks_per_sm, norm.percent, norm.limiter) == (12, 75.0, "registers")


def test_a_device_without_warps_reports_zero_percent():
    occ = theoretical_occupancy(32, 128, device={"maxThreadsPerMultiprocessor": 16, "warpSize": 32})
    assert (occ.max_warps, occ.blocks_per_sm, occ.percent) == (0, 0, 0.0)
