"""/trace_views: one extra view (memory, modules, grouping, tensor cores) of an uploaded trace."""

from __future__ import annotations

from collections.abc import Generator

import gradio as gr

from endpoints.common import app_error, app_file, progress_of, while_running

TRACE_VIEWS_OUTPUTS = 4  # table, chart, note, JSON: "no change" is yielded to each while the view is built


def trace_views(
    trace: str | None, view: str = "memory", progress: gr.Progress = gr.Progress()
) -> Generator[tuple, None, None]:
    """One extra view of an uploaded torch.profiler Chrome trace: the TensorBoard plugin's Memory and Module
    views, ops grouped by input shape or call stack, kernels grouped by launch configuration, tensor cores.

    Returns 4 outputs: the view's table (at most 1,000 rows; times in µs or ms and sizes in bytes, as each header
    says), its chart (the memory curve in MiB over ms; None for the other views), a note saying what the
    view shows or why it is empty, and the whole view as JSON (`rows` counts every row before the cap).

    Args:
        trace: a .json or .json.gz Chrome trace from torch.profiler (CUDA, ROCm or CPU).
        view: one of "memory", "memory events", "modules", "ops by input shape", "ops by call stack",
            "kernels by launch", "tensor cores".

    """
    from profiling.admission import VIEW_PEAK_PER_ROW
    from profiling.charts.memory import memory_chart
    from profiling.markdown import escape
    from profiling.tables import rounded
    from profiling.uploads import analyze_time_limit_s, analyze_upload
    from profiling.views import ViewError, check_view, view_file

    try:
        name = check_view(view)
    except ViewError as exc:
        raise app_error(str(exc)) from None
    path = app_file(trace, "trace")
    # Admitted to memory, bounded in time and killable as /analyze is: the view is built in its process.
    shown = yield from while_running(
        TRACE_VIEWS_OUTPUTS,
        analyze_upload,
        path,
        analyze_time_limit_s(),
        progress_of(progress),
        work=view_file,
        args=(name,),
        per_event=VIEW_PEAK_PER_ROW,  # ops grouped by call stack cost more an event than the analysis
    )
    note = f"**{escape(shown.title)}**\n\n{escape(shown.note)}"
    yield rounded(shown.table), memory_chart(shown), note, shown.to_dict()
