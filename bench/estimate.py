"""The run-time estimate against real runs, on this machine's own measured peaks: whole/estimated per run.

    python bench/estimate.py            # every kind of forward the estimate models, at sizes of seconds here

A benchmark, not a test: the estimate scales this device's measured matmul and copy rates, and how close
it comes depends on the machine and its load (the suite runs on injected peaks, so it cannot judge this).
The goal is a ratio within 3x both ways, which `refuse_if_too_long` relies on.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention import AttentionSpec
from profiling import calibration
from profiling.pipeline import profile_attention
from profiling.run_time import estimate_run_time
from profiling.worker import Worker

SHAPE = dict(batch=1, heads=8, head_dim=64, device="cpu")
# Sizes where a run takes seconds here, so the estimate's fixed part does not dominate.
RUNS = {
    "naive": dict(variant="naive", seq_len=1536),
    "inplace": dict(variant="inplace", seq_len=1536),
    "math": dict(variant="sdpa", backend="math", seq_len=1536),
    "flash": dict(variant="sdpa", backend="flash", seq_len=2048),
    "flex": dict(variant="flex", seq_len=1024),
    "naive training": dict(variant="naive", seq_len=1024, mode="training"),
    "flash window": dict(variant="sdpa", seq_len=2048, mask="sliding_window", window=256),
    "flash decode": dict(variant="sdpa", backend="flash", seq_len=16384, q_len=1),
}


def main() -> None:
    calibration.use(None)  # this machine's own peaks, measured once
    print(f"{'run':>16} {'estimated s':>12} {'ran s':>8} {'ran/estimated':>14}  within 3x")
    for name, fields in RUNS.items():
        spec = AttentionSpec(**SHAPE, **fields)
        estimate = estimate_run_time(spec).seconds
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            profile_attention(spec, tmp, worker=Worker(enabled=False))  # in-process: no worker start counted
            wall = time.perf_counter() - start
        ok = estimate / 3 < wall < estimate * 3
        print(f"{name:>16} {estimate:>12.2f} {wall:>8.2f} {wall / estimate:>14.2f}  {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
