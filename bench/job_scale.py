"""A job as it grows: 8, 16, 32 … ranks on this machine's LocalCluster, with each worker's peak memory against
its limit; then the same first 8 ranks on a scheduler and two workers started by hand, which must agree.

    python bench/job_scale.py DIR [--sizes 8,16,32,64]     # DIR: ranks bench/make_ranks.py wrote

The cluster starts once (its start-up is printed apart); each size then runs `analyze_job` on it through its
address, as `--scheduler` would. Worker peaks are their processes' VmHWM (`ru_maxrss`), read after each
size, so they only grow. A benchmark, not a test: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiling.job.run import JobResult, analyze_job, job_files, local_cluster  # noqa: E402

LOOPBACK = "127.0.0.1"
# A scheduler writes its address file in about a second here; past this it is stuck or gone.
SCHEDULER_START_S = 60.0


def peak_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def scaling(files: list[str], sizes: list[int]) -> JobResult:
    """Each size on one LocalCluster: seconds, ranks/s, s per rank, and each worker's peak against its limit."""
    from dask.distributed import Client

    started = time.perf_counter()
    with local_cluster() as cluster, Client(cluster) as client:
        print(f"LocalCluster start-up: {time.perf_counter() - started:.1f} s")
        limits = {w: info["memory_limit"] for w, info in client.scheduler_info()["workers"].items()}
        result = None
        for size in sizes:
            start = time.perf_counter()
            result = analyze_job(files[:size], scheduler=cluster.scheduler_address)
            seconds = time.perf_counter() - start
            peaks = client.run(peak_bytes)
            worst = max(peaks[w] / limits[w] for w in peaks)
            print(
                f"{size:3d} ranks: {seconds:6.1f} s, {size / seconds:.2f} ranks/s, {seconds / size:.2f} s a rank; "
                f"worker peaks {', '.join(f'{p / 2**30:.2f}' for p in peaks.values())} GiB "
                f"of {next(iter(limits.values())) / 2**30:.1f} GiB each ({100 * worst:.0f}% of the limit at most); "
                f"errors {len(result.errors)}"
            )
    assert result is not None
    return result


def by_hand(files: list[str]) -> JobResult:
    """The job on `dask scheduler` and two `dask worker`s started here, on loopback; killed by pid after."""
    with tempfile.TemporaryDirectory() as scratch:
        address_file = Path(scratch) / "scheduler.json"
        scheduler = ["dask", "scheduler", "--host", LOOPBACK, "--port", "0", "--no-dashboard"]
        worker = ["dask", "worker", "--scheduler-file", str(address_file), "--host", LOOPBACK, "--nthreads", "1"]
        # The processes import `profiling` to run the tasks: they start in the repository, as a deployment would.
        options = {"cwd": ROOT, "env": {**os.environ, "PYTHONPATH": str(ROOT)}, "start_new_session": True}
        processes = [subprocess.Popen([*scheduler, "--scheduler-file", str(address_file)], **options)]
        try:
            _wait_for(address_file, processes[0])
            processes += [subprocess.Popen(worker, **options) for _ in range(2)]
            address = json.loads(address_file.read_text())["address"]
            start = time.perf_counter()
            result = analyze_job(files, scheduler=address)
            print(f"two workers started by hand: {len(files)} ranks in {time.perf_counter() - start:.1f} s")
            return result
        finally:
            for process in processes:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)


def _wait_for(address_file: Path, scheduler: subprocess.Popen[bytes], timeout_s: float = SCHEDULER_START_S) -> None:
    """Until the scheduler writes its address; a scheduler that exits or stays silent past `timeout_s` is an error."""
    deadline = time.monotonic() + timeout_s
    while not address_file.exists():
        if scheduler.poll() is not None:
            raise RuntimeError(f"dask scheduler exited with {scheduler.returncode} before writing {address_file.name}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"dask scheduler wrote no {address_file.name} within {timeout_s:.0f} s")
        time.sleep(0.2)


def same_view(a: JobResult, b: JobResult) -> bool:
    tables = ("per_step", "per_rank", "collectives")
    return all(getattr(a.view, t).equals(getattr(b.view, t)) for t in tables) and [
        f.title for f in a.view.findings
    ] == [f.title for f in b.view.findings]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--sizes", default="8,16,32,64")
    options = parser.parse_args(argv)
    files = job_files(options.folder)
    sizes = [int(s) for s in options.sizes.split(",") if int(s) <= len(files)]
    first = scaling(files, sizes[:1])  # the first size alone, to compare with the hand-started cluster
    print(f"hand-started cluster gives the same view: {same_view(first, by_hand(files[: sizes[0]]))}")
    scaling(files, sizes)


if __name__ == "__main__":  # Dask's workers import this module again: nothing runs at import
    main()
