"""Compare: every variant on one shape."""

from __future__ import annotations

import gradio as gr

from endpoints import compare
from ui.diff_tab import remember
from ui.shape import Shape


def compare_tab(shape: Shape, history: gr.State) -> None:
    button = gr.Button("Compare every variant", variant="primary")
    rows = gr.JSON(label="summaries", visible=False)
    table = gr.Dataframe(label="side by side", wrap=True, elem_id="compare-table")
    chart = gr.Plot(label="chart")
    button.click(compare, shape.all(), [rows, table, chart], api_name="compare", concurrency_id="device").success(
        remember, [history, rows], history, api_visibility="private"
    )
