"""/analyze_job: every rank's trace of one training job, uploaded as files or one zip; the distributed view."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import gradio as gr

from endpoints.common import app_error, app_file, progress_of, while_running

ANALYZE_JOB_OUTPUTS = 6  # summary, per-rank table, collectives table, two charts, findings


def analyze_job(traces: list[str] | str | None, progress: gr.Progress = gr.Progress()) -> Generator[tuple, None, None]:
    """The distributed view of a whole training job: one torch.profiler trace per rank, read one after another.

    Returns 6 outputs: the job summary (a dict: ranks with their file, source of the rank and error,
    world_size, missing_ranks, errors per rank, per_rank breakdown, per_step, sync_wait or sync_refused
    saying why it is absent, collectives rows, findings as records; times in µs), the per-rank table (mean
    step in µs: computation, communication not overlapped, overlap, other, overlap %, sync wait), the
    collectives table (op, calls, bytes, total and average µs, algorithmic bandwidth in GB/s), the mean step
    per rank as stacked bars and the step time per rank over the steps (Plotly, in ms), and the findings
    (straggler, exposed communication, low overlap, load imbalance) as escaped Markdown.

    Args:
        traces: the ranks' .json or .json.gz Chrome traces (at most 64), or one .zip of them, uploaded here
            first; at most 4 GiB of JSON in all. Ranks come from each trace's distributedInfo, else the
            file name, else the order.
    """
    from profiling.job.ranks import JobError
    from profiling.job.uploads import analyze_job_uploads, job_upload_files
    from profiling.uploads import analyze_time_limit_s

    given = [traces] if isinstance(traces, str) else list(traces or [])
    if not given:
        raise app_error("traces: upload the ranks' .json or .json.gz traces, or one .zip of them")
    paths = [app_file(path, "traces") for path in given]
    try:
        with job_upload_files(paths) as files:
            result = yield from while_running(
                ANALYZE_JOB_OUTPUTS, analyze_job_uploads, files, analyze_time_limit_s(), progress_of(progress)
            )
    except JobError as exc:
        raise app_error(str(exc)) from None
    if len(result.errors) == len(result.summaries):
        listed = "; ".join(f"rank {rank}: {error}" for rank, error in sorted(result.errors.items()))
        raise app_error(f"traces: none of the {len(result.summaries)} traces could be read ({listed[:2000]})")
    yield job_outputs(result)


def job_outputs(result: Any) -> tuple:
    """The handler's outputs for a `JobResult`. Files are shown by name (an upload's own, a zip entry's
    index name), never by the server's path."""
    from profiling.charts.job import rank_breakdown_chart, rank_steps_chart
    from profiling.cli_job import COLLECTIVE_COLUMNS, RANK_COLUMNS, job_record
    from profiling.markdown import escape
    from profiling.tables import rounded

    record = job_record(result)
    for rank in record["ranks"]:
        rank["file"] = Path(rank.pop("path")).name
    record["errors"] = {str(rank): error for rank, error in sorted(result.errors.items())}
    view = result.view
    files = {r["rank"]: r["file"] for r in record["ranks"]}
    per_rank = view.per_rank.assign(file=view.per_rank["rank"].map(files))
    per_rank = per_rank[[c for c in RANK_COLUMNS if c in per_rank.columns]].rename(columns=RANK_COLUMNS)
    collectives = view.collectives[list(COLLECTIVE_COLUMNS)].rename(columns=COLLECTIVE_COLUMNS)
    lines = [f"- **{escape(f.title)}**: {escape(f.detail)}" for f in view.findings]
    if not lines:
        lines = ["No finding: no straggler, exposed communication, low overlap or load imbalance."]
    if view.sync_refused:
        lines.append(f"\nSync wait is not shown: {escape(view.sync_refused)}")
    lines += [f"\nRank {rank} failed: {escape(error)}" for rank, error in sorted(result.errors.items())]
    return (
        record,
        rounded(per_rank),
        rounded(collectives),
        rank_breakdown_chart(view.per_rank),
        rank_steps_chart(view.per_step),
        "\n".join(lines),
    )
