"""End-to-end latency of one /profile call vs the work it must do: the app's fixed overhead.

Starts the real app on a local port, calls /profile through gradio_client, and compares the
median latency with (forwards per call) x (unprofiled forward time) measured in the same process.

    python bench/latency.py [--seq-len 256] [--calls 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import torch
from gradio_client import Client

import app
from attention import AttentionSpec
from bench.timing import timer_ms
from profiling import runner
from profiling.run_time import timing_loop_s
from profiling.timing import timing_budget_s

PROFILED_FORWARDS = runner.WARMUP_CALLS + runner.WAIT + runner.WARMUP + runner.ACTIVE


def forwards_per_call(forward_ms: float) -> int:
    """What the runner runs: warm-up and scheduled forwards, then its unprofiled timing loop."""
    call_s = forward_ms / 1e3
    return PROFILED_FORWARDS + round(timing_loop_s(call_s, timing_budget_s()) / call_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["ATTENTION_PROFILER_DIR"] = tempfile.mkdtemp(prefix="latency-")
    demo = app.build_demo()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    client = Client(f"http://127.0.0.1:{port}/", verbose=False)
    print(f"CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; {args.calls} calls each, medians")
    print(
        f"{'run':>10} {'forward ms':>11} {'forwards':>9} {'work ms':>9} {'latency ms':>11} {'overhead ms':>12} "
        f"{'latency/work':>13}"
    )
    try:
        for variant, backend in (("naive", "auto"), ("sdpa", "flash")):
            spec = AttentionSpec(variant=variant, backend=backend, seq_len=args.seq_len, device="cpu")
            latencies = []
            for _ in range(args.calls):
                start = time.perf_counter()
                client.predict(variant, backend, 1, 4, args.seq_len, 64, "float32", "cpu", False, api_name="/profile")
                latencies.append((time.perf_counter() - start) * 1e3)
            one = timer_ms(spec)
            forwards = forwards_per_call(one)
            work = forwards * one
            latency = statistics.median(latencies)
            print(
                f"{spec.name:>10} {one:>11.3f} {forwards:>9} {work:>9.1f} {latency:>11.1f} "
                f"{latency - work:>12.1f} {latency / work:>13.1f}"
            )
    finally:
        demo.close()


if __name__ == "__main__":
    main()
