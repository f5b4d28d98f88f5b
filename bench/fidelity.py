"""Are the reported times true? Profiled per-forward time vs an unprofiled timing, side by side.

For each CPU variant, in one process and with the same thread count:
  timer     torch.utils.benchmark.Timer median of the same call, no profiler
  app       forward_cpu_ms that /profile reports (record_shapes and profile_memory on)
  bare      the same profile with record_shapes and profile_memory off
  unprof    forward_unprofiled_ms that /profile also reports (the runner's own timing, no profiler)
Ratios near 1.00 mean the profiler's numbers can be trusted; the goal is within ±10% at >= 1 ms.

    python bench/fidelity.py [--seq-len 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import attention
from attention import AttentionSpec
from bench.timing import timer_ms
from profiling.pipeline import profile_attention

VARIANTS = (("naive", "auto"), ("inplace", "auto"), ("sdpa", "math"), ("sdpa", "flash"))


def bare_profile_ms(spec: AttentionSpec) -> float:
    """The runner's schedule with the two expensive options off: what they cost, measured."""
    forward = attention.prepare(spec)
    with torch.no_grad():
        for _ in range(3):
            forward()
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3)) as prof:
            for _ in range(5):
                with record_function("attn_fwd"):
                    forward()
                prof.step()
    windows = [e for e in prof.events() if e.name == "attn_fwd"]
    return statistics.mean(e.cpu_time_total for e in windows) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds per variant; medians are printed")
    args = parser.parse_args()
    print(
        f"CPU, {torch.get_num_threads()} threads, torch {torch.__version__}, 2x8x{args.seq_len}x64 float32, "
        f"median of {args.repeats} interleaved rounds (min-max of the app/timer ratio in brackets)"
    )
    print(f"{'run':>11} {'timer ms':>9} {'app ms':>8} {'app/timer':>18} {'bare/timer':>11} {'unprof/timer':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for variant, backend in VARIANTS:
            spec = AttentionSpec(variant=variant, backend=backend, batch=2, heads=8, seq_len=args.seq_len, device="cpu")
            rounds = []
            for _ in range(args.repeats):  # interleaved, so drift on a noisy machine hits every column alike
                timer = timer_ms(spec)
                summary = profile_attention(spec, tmp).summary
                rounds.append(
                    (timer, summary["forward_cpu_ms"], bare_profile_ms(spec), summary["forward_unprofiled_ms"])
                )
            timer, app, bare, unprof = (statistics.median(column) for column in zip(*rounds, strict=True))
            ratios = [r[1] / r[0] for r in rounds]
            spread = f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
            print(
                f"{spec.name:>11} {timer:>9.3f} {app:>8.3f} {spread:>18} {bare / timer:>11.2f} {unprof / timer:>13.2f}"
            )


if __name__ == "__main__":
    main()
