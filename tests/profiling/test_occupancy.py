"""Occupancy math against the blog's worked examples."""

import numpy as np
import pytest

from profiling.occupancy import grid_blocks, kineto_estimate, kineto_rounded, theoretical_occupancy

A100 = {
    "regsPerMultiprocessor": 65536,
    "maxThreadsPerMultiprocessor": 2048,
    "warpSize": 32,
    "sharedMemPerMultiprocessor": 167936,
}


def test_flash_tile_gives_thirteen_percent():
    occ = theoretical_occupancy(255, 128, device=A100)
    assert occ.blocks_per_sm == 2  # 128 x 255 = 32,640 registers per block
    assert (occ.active_warps, occ.max_warps) == (8, 64)
    assert occ.percent == 12.5 and occ.limiter == "registers"  # "about 13%"


def test_240_registers_by_256_threads_fit_once():
    occ = theoretical_occupancy(240, 256, device=A100)
    assert occ.blocks_per_sm == 1 and occ.limiter == "registers"


def test_shared_memory_and_threads_can_limit():
    assert theoretical_occupancy(16, 128, shared_memory=100_000, device=A100).limiter == "shared memory"
    threads = theoretical_occupancy(16, 1024, device=A100)
    assert threads.limiter == "threads" and threads.percent == 100


def test_grid_blocks_are_read_only_from_a_launch_grid():
    assert grid_blocks([16, 15, 1]) == 240 and grid_blocks([2**31 - 1]) == 2**31 - 1
    for bad in ([], [0], [2**31], [1, 65536], [1, 1, 1, 1], [1.5], [True], "x", None, [[1]]):
        assert grid_blocks(bad) is None, bad


def test_kinetos_estimate_takes_zero_blocks_above_the_default_shared_memory_limit():
    h100 = {**A100, "sharedMemPerBlock": 49152, "numSms": 132, "sharedMemPerMultiprocessor": 233472}
    # sm90_xmma: 1 block fits under the opt-in limit, but the estimate's default limit allows none: 0%.
    above = kineto_estimate(np.array([1]), np.array([384]), np.array([231424]), np.array([132]), h100)
    # Flash on 16 blocks: 2 blocks fit, but 16 / 132 of a block per SM x 128 / 2048 threads = 0.76%, written 1.
    flash = kineto_estimate(np.array([2]), np.array([128]), np.array([49152]), np.array([16]), h100)
    assert above[0] == 0 and flash[0] == pytest.approx(100 * 16 / 132 * 128 / 2048)
    assert kineto_rounded(flash)[0] == 1 and kineto_rounded(np.array([0.49, 0.5]))[0:2].tolist() == [0, 1]
