"""The endpoints that read uploaded traces: /analyze, /diff_traces, /diff and /share."""

from __future__ import annotations

from collections.abc import Generator

import gradio as gr

from endpoints.common import (
    ANALYZE_OUTPUTS,
    DIFF_TRACES_OUTPUTS,
    app_error,
    app_file,
    progress_of,
    user_errors,
    while_running,
)


def analyze(trace: str | None, progress: gr.Progress = gr.Progress()) -> Generator[tuple, None, None]:
    """Analyze an uploaded torch.profiler Chrome trace.

    Returns 8 outputs: the summary (a dict: counts, times in µs, shares in percent, findings as records),
    the op table, kernel table, steps and annotations (times in µs), the timeline (a Plotly figure), the
    insights (escaped Markdown) and the steps chart (Plotly). For agents, /analyze_summary returns the
    summary and findings alone, as compact JSON.

    Args:
        trace: a .json or .json.gz Chrome trace from torch.profiler (CUDA, ROCm or CPU), uploaded here first.
    """
    from gradio.components.plot import PlotData

    from profiling.uploads import analyze_time_limit_s, analyze_upload

    path = app_file(trace, "trace")
    shown = yield from while_running(
        ANALYZE_OUTPUTS, analyze_upload, path, analyze_time_limit_s(), progress_of(progress)
    )
    yield (
        shown.summary,
        shown.op_table,
        shown.kernel_table,
        PlotData(type="plotly", plot=shown.timeline_json),
        shown.steps,
        shown.annotations,
        shown.insights_markdown,
        PlotData(type="plotly", plot=shown.steps_chart_json),
    )


def diff_traces(
    before: str | None, after: str | None, progress: gr.Progress = gr.Progress()
) -> Generator[tuple, None, None]:
    """What changed between two uploaded torch.profiler Chrome traces of one job.

    Returns 2 outputs: the diff (a dict: ops and kernels added, removed and changed with Δ and Δ%, the step
    breakdown, the GPU metrics and the largest growths; times in µs) and the same as a plain-text table.

    Args:
        before: a .json or .json.gz Chrome trace from torch.profiler, uploaded here first.
        after: another trace of the same job, after the change.
    """
    from profiling.trace_diff import diff_uploads
    from profiling.trace_diff_text import diff_text
    from profiling.uploads import analyze_time_limit_s

    paths = app_file(before, "before"), app_file(after, "after")
    found = yield from while_running(
        DIFF_TRACES_OUTPUTS, diff_uploads, *paths, analyze_time_limit_s(), progress_of(progress)
    )
    yield found, "\n".join(diff_text(found))


def diff(before: dict, after: dict) -> list[dict]:
    """Ops and kernels added, removed and changed per forward between two runs.

    Returns a list of rows (dicts): what changed (an op, kernel or total), its count or value before and
    after, and the difference; times in ms, memory in bytes, counts per forward.

    Args:
        before: a summary returned by /profile or a row of /compare.
        after: another such summary.
    """
    from profiling.diff import DiffError, diff_summaries

    try:
        return diff_summaries(before, after).to_dict(orient="records")
    except DiffError as exc:
        raise app_error(str(exc)) from None


def share(trace: str | None, repo_id: str, token: str, oauth_token: gr.OAuthToken | None = None) -> tuple:
    """Upload a trace to a public Hub dataset repo you own.

    Returns 2 outputs: the links (a dict: url of the file on the Hub, perfetto_url that opens it in Perfetto,
    and a note) and the same as Markdown.

    Args:
        trace: a trace file produced by or uploaded to this app.
        repo_id: the repo, as owner/name.
        token: a Hugging Face token with write access (or log in on the Space).
    """
    from profiling.share import share_trace

    secret = token or (oauth_token.token if oauth_token else "")
    if not trace:
        raise app_error("trace: there is no trace to share yet; profile or analyze one first")
    path = app_file(trace, "trace")
    with user_errors():
        links = share_trace(path, repo_id, secret)
    return links, f"[Open in Perfetto]({links['perfetto_url']}) · [file]({links['url']})\n\n{links['note']}"
