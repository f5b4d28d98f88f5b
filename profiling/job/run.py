"""Run a job: every rank summarised in parallel (Dask where installed, else a process pool), then the view.

Each worker reads one rank's trace and sends back only its `RankSummary`; the traces never travel.
Dask: `Client(address)` for `scheduler` or DASK_SCHEDULER_ADDRESS, else a LocalCluster of one
single-threaded process per core (parsing holds the GIL, so threads would not help).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiling.job.distributed import DistributedView, distributed_view
from profiling.job.rank_summary import RankSummary, summarize_or_error
from profiling.job.ranks import MAX_RANKS, JobError, JobRanks, assign_ranks

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
CONNECT_TIMEOUT = "20s"  # a scheduler that does not answer: an error soon, not Dask's default wait
TRACE_SUFFIXES = (".json", ".json.gz")
JobProgress = Callable[[float, str], None]  # progress(fraction of ranks done, message)


@dataclass
class JobResult:
    """The job: its ranks, each rank's summary (errors included), and the view over the good ones."""

    ranks: JobRanks
    summaries: dict[int, RankSummary]
    view: DistributedView
    engine: str  # "dask" or "process pool"

    @property
    def errors(self) -> dict[int, str]:
        return {rank: s.error for rank, s in self.summaries.items() if s.error is not None}


def job_files(spec: str) -> list[str]:
    """The traces of `spec`: a folder's .json/.json.gz files, or a glob's matches; sorted."""
    path = Path(spec)
    found = [str(p) for p in path.iterdir() if p.is_file()] if path.is_dir() else glob.glob(spec)
    files = sorted(f for f in found if f.endswith(TRACE_SUFFIXES))
    if not files:
        raise JobError(f"traces: no .json or .json.gz file in {spec!r:.200}")
    if len(files) > MAX_RANKS:
        raise JobError(f"traces: {len(files)} files in {spec!r:.200}; a job takes at most {MAX_RANKS} ranks")
    return files


def analyze_job(
    paths: Sequence[str | Path], scheduler: str | None = None, progress: JobProgress | None = None
) -> JobResult:
    """Summarise every rank where it is read, number the ranks, and build the distributed view."""
    files = [str(p) for p in paths]
    if not 0 < len(files) <= MAX_RANKS:  # before any worker starts
        raise JobError(f"traces: {len(files)} files; a job takes 1 to {MAX_RANKS} ranks")
    engine, summaries = _summaries(files, scheduler or os.environ.get(SCHEDULER_ENV) or None, progress)
    return job_result(files, summaries, engine)


def job_result(files: Sequence[str], summaries: dict[str, RankSummary], engine: str) -> JobResult:
    """Number the ranks of `files` (each summarised in `summaries`, by path) and build the view over the
    ranks that were read; the CLI's engines and the app's one-after-another run end here alike."""
    ranks = assign_ranks(files, [summaries[f].distributed_info for f in files])
    by_rank = {info.rank: summaries[info.path] for info in ranks.ranks}
    good = {rank: s for rank, s in by_rank.items() if s.error is None}
    return JobResult(ranks, by_rank, distributed_view(good), engine)


def _summaries(
    files: list[str], scheduler: str | None, progress: JobProgress | None
) -> tuple[str, dict[str, RankSummary]]:
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        if scheduler:
            raise JobError("scheduler: a Dask scheduler needs dask[distributed] installed") from None
        return "process pool", _collect(_pool_results(files), len(files), progress)
    return "dask", _collect(_dask_results(files, scheduler), len(files), progress)


def _collect(results: Iterator[RankSummary], total: int, progress: JobProgress | None) -> dict[str, RankSummary]:
    out: dict[str, RankSummary] = {}
    for summary in results:
        out[summary.path] = summary
        if progress is not None:
            read = f"{summary.file_bytes:,} bytes" if summary.error is None else "failed"
            progress(len(out) / total, f"{len(out)} of {total} ranks done ({Path(summary.path).name}: {read})")
    return out


def _pool_results(files: list[str]) -> Iterator[RankSummary]:
    with ProcessPoolExecutor(max_workers=min(len(files), os.cpu_count() or 1)) as pool:
        for future in as_completed([pool.submit(summarize_or_error, f) for f in files]):
            yield future.result()


def _dask_results(files: list[str], scheduler: str | None) -> Iterator[RankSummary]:
    from dask.distributed import as_completed as dask_completed

    with _client(scheduler) as client:
        # pure=False: two runs over the same paths read the files again (they may have changed).
        futures = client.map(summarize_or_error, files, pure=False)
        for future in dask_completed(futures):
            yield future.result()


@contextmanager
def _client(scheduler: str | None) -> Iterator[Any]:
    from dask.distributed import Client

    if scheduler:
        with Client(scheduler, timeout=CONNECT_TIMEOUT) as client:
            yield client
        return
    with local_cluster() as cluster, Client(cluster) as client:
        yield client


def local_cluster() -> Any:
    """This machine's Dask cluster: one single-threaded worker process per core, each with its share of the
    memory, on loopback only, no dashboard."""
    from dask.distributed import LocalCluster

    return LocalCluster(
        n_workers=os.cpu_count(),
        threads_per_worker=1,
        processes=True,
        memory_limit="auto",
        host="127.0.0.1",
        dashboard_address=None,
    )
