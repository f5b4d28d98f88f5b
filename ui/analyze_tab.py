"""Analyze a trace: any uploaded torch.profiler trace, and the diff of two."""

from __future__ import annotations

from typing import Any

import gradio as gr

from endpoints import analyze, diff_traces
from traffic import refusing_urls
from ui.share import share_box


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
    upload = refusing_urls(gr.File(label="trace (.json or .json.gz)", file_types=[".json", ".gz"], elem_id="upload"))
    button = gr.Button("Analyze", variant="primary")
    with gr.Row(equal_height=False):
        gpu = gr.Markdown(elem_id="gpu-card", latex_delimiters=[])
        idle_plot = gr.Plot(label="GPU idle time", elem_id="idle-chart")
    breakdown_plot = gr.Plot(label="step time breakdown", elem_id="breakdown-chart")
    insights = gr.Markdown(label="insights", elem_id="analyze-insights", latex_delimiters=[])
    summary = gr.JSON(label="summary")
    timeline_plot = gr.Plot(label="timeline")
    ops = gr.Dataframe(label="op table")
    kernels = gr.Dataframe(label="kernel table")
    steps = gr.Dataframe(label=f"steps (the first {MAX_STEPS})")
    steps_plot = gr.Plot(label="steps chart")
    annotations = gr.Dataframe(label=f"annotations (the {MAX_ANNOTATIONS} longest in total)")
    share_box(upload, api_name=None)
    button.click(
        analyze,
        upload,
        [summary, ops, kernels, timeline_plot, steps, annotations, insights, steps_plot],
        api_name="analyze",
        concurrency_id="analyze",
        concurrency_limit=2,
    ).success(_overview, [summary, steps], [gpu, breakdown_plot, idle_plot], api_visibility="private")
    _diff_traces_box()


def _diff_traces_box() -> None:
    """Two traces of one job, before and after a change: what the change did (the plugin's Diff view)."""
    with gr.Accordion("Diff two traces", open=False):
        with gr.Row():
            before = refusing_urls(gr.File(label="before", file_types=[".json", ".gz"], elem_id="diff-before"))
            after = refusing_urls(gr.File(label="after", file_types=[".json", ".gz"], elem_id="diff-after"))
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
