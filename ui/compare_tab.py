"""Compare: every variant on one shape."""

from __future__ import annotations

import gradio as gr

from endpoints import compare
from ui.diff_tab import remember
from ui.shape import Shape
from ui.tables import compare_view, hidden_api_table, table_view


def compare_tab(shape: Shape, history: gr.State) -> None:
    button = gr.Button("Compare every variant", variant="primary")
    rows = gr.JSON(label="summaries", visible=False)
    table = hidden_api_table("side by side", "compare-table-api")  # the API's; the page shows `view`
    view = table_view("side by side", "compare-table")
    chart = gr.Plot(label="chart", elem_id="compare-chart")
    done = button.click(compare, shape.all(), [rows, table, chart], api_name="compare", concurrency_id="device")
    done.success(remember, [history, rows], history, api_visibility="private")
    done.success(compare_view, table, view.outputs, api_visibility="private")
