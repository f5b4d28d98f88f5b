"""Wall time of one job three ways, on the same rank traces: one process reading them in turn, the
process pool, and Dask's LocalCluster (its start-up counted); and whether the pool and Dask agree.

    python bench/job_timing.py DIR      # e.g. a folder bench/make_ranks.py wrote

A benchmark, not a test: its figures depend on the machine and on what else it runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiling.job.rank_summary import summarize_rank  # noqa: E402
from profiling.job.run import analyze_job, job_files  # noqa: E402

T = TypeVar("T")


def seconds(work: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    result = work()
    return time.perf_counter() - start, result


def main(folder: str) -> None:
    files = job_files(folder)
    one, _ = seconds(lambda: [summarize_rank(f) for f in files])
    on_dask, dask_result = seconds(lambda: analyze_job(files))
    sys.modules["dask.distributed"] = None  # type: ignore[assignment]  # import fails: the process pool runs
    on_pool, pool_result = seconds(lambda: analyze_job(files))
    same = dask_result.view.per_step.equals(pool_result.view.per_step)
    print(f"{len(files)} ranks: one process {one:.1f} s, process pool {on_pool:.1f} s, Dask {on_dask:.1f} s")
    print(f"pool and Dask agree: {same}; findings: {[f.title for f in pool_result.view.findings]}")


if __name__ == "__main__":  # the pool and Dask's workers import this module again: nothing runs at import
    main(sys.argv[1])
