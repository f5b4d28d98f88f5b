"""`python -m profiling job DIR_OR_GLOB [--json] [--scheduler ADDRESS]`: a whole training job, headless.

Every rank's trace is summarised where it is read (Dask where installed, else a process pool), then the
distributed view is printed: per rank, its mean step split into computation, communication, overlap and
other, with its sync wait; the collectives; the findings. Text within `cli_views.WIDTH` columns, every
string from a trace through `plain`; `--json` prints every table whole. Exit 2 names the field at fault.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from profiling.cli_views import WIDTH, text_table
from profiling.terminal import plain

# Schemes a Dask scheduler listens on (distributed.comm's registry, without the optional ucx).
SCHEDULER_SCHEMES = ("tcp://", "tls://", "inproc://", "ws://", "wss://")
RANK_COLUMNS = {
    "rank": "rank",
    "file": "file",
    "steps": "steps",
    "step_us": "step (us)",
    "computation": "compute (us)",
    "communication": "comm (us)",
    "overlap": "overlap (us)",
    "other": "other (us)",
    "overlap_percent": "overlap %",
    "wait_us": "sync wait (us)",  # the columns fit 120 characters with 9-digit µs
}
COLLECTIVE_COLUMNS = {
    "op": "op",
    "calls": "calls",
    "bytes": "bytes",
    "total_us": "total (us)",
    "average_us": "average (us)",
    "algbw_GBps": "algbw (GB/s)",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The `job` subcommand on `subparsers` (the object `add_subparsers` returned)."""
    parser = subparsers.add_parser(
        "job",
        help="a whole training job: every rank's trace at once, the distributed view",
        description="Every rank's torch.profiler trace of one job (a folder or a glob of .json/.json.gz files).",
    )
    parser.add_argument("traces", help="a folder of rank traces, or a glob (quote it)")
    parser.add_argument("--json", action="store_true", help="one JSON object: every table, whole")
    parser.add_argument(
        "--scheduler", default=None, help="a running Dask scheduler (tcp://HOST:PORT); else DASK_SCHEDULER_ADDRESS"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Analyse the job and print it; 0 done (some ranks may have failed: each is listed), 2 bad input (the
    message names `traces` or `scheduler`), which includes a job none of whose traces could be read."""
    from profiling.job.ranks import JobError
    from profiling.job.run import analyze_job, job_files
    from profiling.progress import TerminalProgress

    if args.scheduler is not None and not args.scheduler.startswith(SCHEDULER_SCHEMES):
        return _error(f"scheduler: give an address such as tcp://127.0.0.1:8786, got {args.scheduler!r:.80}")
    try:
        with TerminalProgress() as progress:
            result = analyze_job(job_files(args.traces), scheduler=args.scheduler, progress=progress)
    except JobError as exc:
        return _error(str(exc))
    except OSError as exc:  # Dask's connection errors are OSErrors (and TimeoutError is one)
        return _error(f"scheduler: cannot reach {args.scheduler or 'the Dask scheduler'} ({exc})")
    if len(result.errors) == len(result.summaries):
        for rank, error in sorted(result.errors.items()):
            print(f"rank {rank}: {plain(error)}", file=sys.stderr)
        return _error(f"traces: none of the {len(result.summaries)} traces could be read")
    if args.json:
        print(json.dumps(job_record(result), indent=1, allow_nan=False))
    else:
        for line in job_text(result):
            print(line)
    return 0


def _error(message: str) -> int:
    print(f"error: {plain(message)}", file=sys.stderr)
    return 2


def _records(frame: pd.DataFrame | None) -> list[dict[str, Any]] | None:
    if frame is None:
        return None
    return [{k: _native(v) for k, v in row.items()} for row in frame.to_dict("records")]


def _native(value: Any) -> Any:
    # JSON has no NaN: unknown is null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value.item() if hasattr(value, "item") else value


def job_record(result: Any) -> dict[str, Any]:
    """The whole job as JSON-native values (`result` is a `profiling.job.run.JobResult`)."""
    from profiling.insights.base import jsonable

    view = result.view
    return {
        "engine": result.engine,
        "world_size": result.ranks.world_size,
        "missing_ranks": result.ranks.missing,
        "ranks": [{**vars(r), "error": result.summaries[r.rank].error} for r in result.ranks.ranks],
        "per_rank": _records(view.per_rank),
        "per_step": _records(view.per_step),
        "sync_wait": _records(view.sync),
        "sync_refused": view.sync_refused,
        "collectives": _records(view.collectives),
        "findings": [jsonable(vars(f)) for f in view.findings],
    }


def job_text(result: Any) -> list[str]:
    """The job as lines of at most WIDTH characters, every trace string made `plain`."""
    ranks, view = result.ranks, result.view
    world = f"world size {ranks.world_size}" if ranks.world_size is not None else "world size unknown"
    failed = f", {len(result.errors)} failed" if result.errors else ""
    lines = [f"job: {len(ranks.ranks)} rank trace{'s' * (len(ranks.ranks) != 1)}{failed} ({world}), on {result.engine}"]
    if ranks.missing:
        lines.append(_wrapped(f"missing ranks ({len(ranks.missing)}): {_ranges(ranks.missing)}"))
    lines += [_wrapped(plain(f"rank {rank} failed: {error}")) for rank, error in sorted(result.errors.items())]
    files = {r.rank: Path(r.path).name for r in ranks.ranks}
    per_rank = view.per_rank.assign(file=view.per_rank["rank"].map(files))
    lines += ["", "per rank (mean step):", *text_table(_shown(per_rank, RANK_COLUMNS), plain)]
    if view.sync_refused:
        lines.append(_wrapped(f"sync wait: not shown: {view.sync_refused}"))
    elif view.sync is not None:
        matched, transfer = int(view.sync["collectives"].iloc[0]), float(view.sync["transfer_us"].iloc[0])
        lines.append(
            _wrapped(
                f"sync wait: each rank's total over the whole trace, not per step: {matched} collectives matched "
                f"by order, {transfer:,.0f} µs of transfer (the fastest rank's time for each)"
            )
        )
    lines += ["", "collectives (all ranks):", *text_table(_shown(view.collectives, COLLECTIVE_COLUMNS), plain)]
    lines += ["", f"findings ({len(view.findings)}):" if view.findings else "findings: none"]
    lines += [_wrapped(plain(f"  - {f.title}: {f.detail}")) for f in view.findings]
    return lines


def _shown(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """The columns printed, renamed; times to whole µs (text_table shows 3 decimals for any fraction), so the
    table fits WIDTH."""
    shown = frame[[c for c in columns if c in frame.columns]].rename(columns=columns)
    for name in shown.columns:
        if name.endswith("(us)"):
            shown[name] = shown[name].astype(float).round(0)
    return shown


def _wrapped(text: str) -> str:
    import textwrap

    return textwrap.fill(text, WIDTH, subsequent_indent="    ")


def _ranges(numbers: list[int]) -> str:
    """`2-127` rather than 126 numbers."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
