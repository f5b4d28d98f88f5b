"""Sweep: forward time and memory of several runs over seq_len."""

from __future__ import annotations

import gradio as gr

from endpoints import sweep
from ui.shape import Shape


def sweep_tab(shape: Shape) -> None:
    from attention import RUN_NAMES

    with gr.Row():
        variants = gr.CheckboxGroup(list(RUN_NAMES), value=["naive", "sdpa-math", "sdpa-flash"], label="variants")
        seq_lens = gr.Textbox("128,256,512,1024", label="seq_len values", info="comma list")
        button = gr.Button("Sweep", variant="primary")
    chart = gr.Plot(label="chart", elem_id="sweep-chart")
    points = gr.JSON(label="points")
    inputs = [
        *(variants, seq_lens, shape.batch, shape.heads, shape.head_dim, shape.dtype, shape.device, shape.compile),
        *shape.extra(),
    ]
    button.click(sweep, inputs, [points, chart], api_name="sweep", concurrency_id="device")
