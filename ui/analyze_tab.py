"""Analyze a trace: any uploaded torch.profiler trace, the diff of two, and a whole job's (ui/job_box.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from endpoints import analyze, diff_traces
from traffic import refusing_urls
from ui.components import TraceFile
from ui.job_box import job_box
from ui.perfetto import perfetto_button
from ui.profile_tab import clear_first
from ui.share import share_box
from ui.tables import analyze_tables, hidden_api_table, table_view
from ui.views_box import views_box

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "samples"
# The sample traces (samples/README.md says where each comes from), with what each shows.
SAMPLES = {
    "h100_bert-small_sdpa-flash.json.gz": "H100 · SDPA flash in a small BERT",
    "resnet50_num_workers_4.pt.trace.json.gz": "V100 · ResNet-50 training (TensorBoard plugin's sample)",
}


def _overview(summary: dict, steps: Any) -> tuple:
    """Analyze's Overview, drawn from outputs /analyze already returned (its outputs keep their order)."""
    from profiling.charts import idle_chart, step_breakdown_chart
    from profiling.markdown import gpu_card

    return gpu_card(summary), step_breakdown_chart(steps), idle_chart(summary.get("idle_breakdown_us"))


def analyze_tab() -> None:
    from profiling.analysis import MAX_ANNOTATIONS, MAX_STEPS

    gr.Markdown(
        "Upload a Chrome trace from `torch.profiler` (`export_chrome_trace` or `tensorboard_trace_handler`), "
        "recorded on CUDA, ROCm or CPU."
    )
    upload = refusing_urls(
        TraceFile(field="trace", label="trace (.json or .json.gz)", file_types=[".json", ".gz"], elem_id="upload")
    )
    samples = gr.Examples(
        [[str(SAMPLES_DIR / name)] for name in SAMPLES],
        upload,
        label="Or a sample trace: one click analyzes it",
        example_labels=list(SAMPLES.values()),
        api_visibility="private",
        elem_id="samples",
    )
    button = gr.Button("Analyze", variant="primary")
    with gr.Row(equal_height=False):
        gpu = gr.Markdown(elem_id="gpu-card", latex_delimiters=[])
        idle_plot = gr.Plot(label="GPU idle time", elem_id="idle-chart")
    breakdown_plot = gr.Plot(label="step time breakdown", elem_id="breakdown-chart")
    insights = gr.Markdown(label="insights", elem_id="analyze-insights", latex_delimiters=[])
    summary = gr.JSON(label="summary")
    timeline_plot = gr.Plot(label="timeline", elem_id="analyze-timeline")
    # The API's tables, hidden; the page shows display-only copies (ui/tables.py).
    ops = hidden_api_table("op table", "analyze-op-table-api")
    kernels = hidden_api_table("kernel table", "analyze-kernel-table-api")
    steps = hidden_api_table(f"steps (the first {MAX_STEPS})", "steps-table-api")
    annotations = hidden_api_table(f"annotations (the {MAX_ANNOTATIONS} longest in total)", "annotations-table-api")
    op_view = table_view("op table", "analyze-op-table")
    kernel_view = table_view("kernel table", "analyze-kernel-table")
    steps_view = table_view(f"steps (the first {MAX_STEPS})", "steps-table")
    steps_plot = gr.Plot(label="steps chart")
    annotations_view = table_view(f"annotations (the {MAX_ANNOTATIONS} longest in total)", "annotations-table")
    views = [*op_view.outputs, *kernel_view.outputs, *steps_view.outputs, *annotations_view.outputs]
    perfetto_button(upload)
    share_box(upload, api_name=None)
    outputs = [summary, ops, kernels, timeline_plot, steps, annotations, insights, steps_plot]
    overview = [gpu, breakdown_plot, idle_plot]
    # The progress shows where the results will appear, the Overview first (it is drawn after /analyze).
    tables_shown = [op_view.frame, kernel_view.frame, steps_view.frame, steps_plot, annotations_view.frame]
    where = [*overview, insights, timeline_plot, *tables_shown]
    # The button is /analyze; a sample runs the same steps, privately.
    for trigger, api_name in ((button.click, "analyze"), (samples.load_input_event.then, None)):
        done = clear_first(trigger, [*outputs, *overview, *views]).then(
            analyze,
            upload,
            outputs,
            api_name=api_name,
            api_visibility="public" if api_name else "private",
            concurrency_id="analyze",
            concurrency_limit=2,
            show_progress_on=where,
        )
        done.success(_overview, [summary, steps], overview, api_visibility="private")
        tables = [summary, ops, kernels, steps, annotations]
        done.success(analyze_tables, tables, views, api_visibility="private")
    views_box(upload)
    _diff_traces_box()
    job_box()


def _diff_traces_box() -> None:
    """Two traces of one job, before and after a change: what the change did (the plugin's Diff view)."""
    with gr.Accordion("Diff two traces", open=False):
        with gr.Row():
            before = refusing_urls(
                TraceFile(field="before", label="before", file_types=[".json", ".gz"], elem_id="diff-before")
            )
            after = refusing_urls(
                TraceFile(field="after", label="after", file_types=[".json", ".gz"], elem_id="diff-after")
            )
        button = gr.Button("Diff")
        text = gr.Textbox(label="what changed", lines=12, max_lines=40, elem_id="diff-traces-text")
        found = gr.JSON(label="diff")
    button.click(
        diff_traces,
        [before, after],
        [found, text],
        api_name="diff_traces",
        concurrency_id="analyze",
        concurrency_limit=2,
    )
