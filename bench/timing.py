"""The unprofiled yardstick the benchmarks compare against."""

from __future__ import annotations

import torch
import torch.utils.benchmark as benchmark

import attention
from attention import AttentionSpec


def timer_ms(spec: AttentionSpec, min_run_time: float = 0.5) -> float:
    """Median ms of one forward under `torch.utils.benchmark.Timer`, no profiler, same thread count."""
    forward = attention.prepare(spec)
    timer = benchmark.Timer(
        "with torch.no_grad(): forward()",
        globals={"forward": forward, "torch": torch},
        num_threads=torch.get_num_threads(),
    )
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3
