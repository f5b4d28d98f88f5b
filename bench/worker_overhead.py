"""What the killable worker process costs: starts, a call's round trip, a real run, and a kill's lateness.

    python bench/worker_overhead.py [--runs 5]

Prints one line per figure: the worker beside the same work in this process, medians.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention import PRESETS, AttentionSpec
from profiling.runner import RunError, measure
from profiling.worker import Worker

KILL_LIMIT_S = 0.5


def seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_ms(fn: Callable[[], Any], times: int) -> float:
    return statistics.median(seconds(fn) for _ in range(times)) * 1e3


def kill_lateness_s(worker: Worker, ignore_sigterm: bool) -> float:
    """Seconds past KILL_LIMIT_S until a call sleeping in the child returned its time-limit error."""
    if ignore_sigterm:  # as a child inside a long native op effectively does: then only SIGKILL stops it
        worker.call(signal.signal, signal.SIGTERM, signal.SIG_IGN)  # the child runs stdlib functions by name
    start = time.perf_counter()
    try:
        worker.call(time.sleep, 30, time_limit_s=KILL_LIMIT_S)
    except RunError:
        return time.perf_counter() - start - KILL_LIMIT_S
    raise AssertionError("the time limit did not stop the call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="real runs each way (default 5)")
    args = parser.parse_args()
    worker = Worker(enabled=True)

    def start() -> None:
        worker.start()
        worker.call(os.getpid)  # the child is ready once it answers

    print(f"first start and first answer (the forkserver imports torch once): {seconds(start):.2f} s")
    worker.close()
    print(f"a replacement worker, forked from the warm forkserver, to its first answer: {seconds(start) * 1e3:.0f} ms")
    print(
        f"round trip of a trivial call: worker {median_ms(lambda: worker.call(os.getpid), 200):.3f} ms, "
        f"in-process {median_ms(os.getpid, 200):.4f} ms"
    )
    spec = AttentionSpec(variant="naive", device="cpu", **PRESETS["cpu-small"])
    with tempfile.TemporaryDirectory() as out:
        worker.call(measure, spec, out), measure(spec, out)  # both warm: kernels loaded, first_call spent
        there = [seconds(lambda: worker.call(measure, spec, out)) for _ in range(args.runs)]
        here = [seconds(lambda: measure(spec, out)) for _ in range(args.runs)]
    print(
        f"measure() of naive {spec.batch}x{spec.heads}x{spec.seq_len}x{spec.head_dim}: "
        f"worker {statistics.median(there):.3f} s, in-process {statistics.median(here):.3f} s (medians of {args.runs})"
    )
    for ignore, how in ((False, "exits on SIGTERM"), (True, "ignores SIGTERM (SIGKILL)")):
        late = statistics.median(kill_lateness_s(worker, ignore) for _ in range(3))
        print(f"time limit {KILL_LIMIT_S} s, a child that {how}: the error comes {late * 1e3:.0f} ms past the limit")
    worker.close()


if __name__ == "__main__":
    main()
