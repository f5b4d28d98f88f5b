"""Occupancy math against the blog's worked examples."""

from profiling.occupancy import theoretical_occupancy

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
