"""Analyze's extra views of the uploaded trace: memory, modules, grouping and tensor cores."""

from __future__ import annotations

import gradio as gr

from endpoints.views import trace_views

# The registry's names, in its order (profiling.views.VIEWS; a test checks they agree): written here so
# that building the page does not import profiling.
VIEW_NAMES = (
    "memory",
    "memory events",
    "modules",
    "ops by input shape",
    "ops by call stack",
    "kernels by launch",
    "tensor cores",
)


def views_box(upload: gr.File) -> None:
    """An accordion under Analyze: pick a view of the trace in `upload` and show it (table, chart, note)."""
    with gr.Accordion("More views (memory, modules, grouping)", open=False):
        with gr.Row():
            # Custom values pass Gradio's own check, so the endpoint's gr.Error names `view` and the choices.
            view = gr.Dropdown(
                list(VIEW_NAMES), value=VIEW_NAMES[0], label="view", elem_id="trace-view", allow_custom_value=True
            )
            button = gr.Button("Show view", elem_id="trace-view-button")
        note = gr.Markdown(elem_id="trace-view-note", latex_delimiters=[])
        chart = gr.Plot(label="memory over time", elem_id="trace-view-chart")
        table = gr.Dataframe(label="view", elem_id="trace-view-table")
        found = gr.JSON(label="view as JSON", visible=False)
    button.click(
        trace_views,
        [upload, view],
        [table, chart, note, found],
        api_name="trace_views",
        concurrency_id="analyze",
        concurrency_limit=2,
    )
