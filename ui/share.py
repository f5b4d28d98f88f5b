"""The Hub share box under a trace: a permanent Perfetto link."""

from __future__ import annotations

import os

import gradio as gr

from endpoints import share


def share_box(trace: gr.File, api_name: str | None) -> None:
    with gr.Accordion("Share this trace (Hugging Face Hub → Perfetto link)", open=False):
        with gr.Row():
            repo = gr.Textbox(
                label="repo", placeholder="you/attention-traces", info="a public dataset repo you created on the Hub"
            )
            token = gr.Textbox(label="token", type="password", info="a write token; never stored or logged")
            if os.environ.get("SPACE_ID"):
                gr.LoginButton()
        button = gr.Button("Share")
        links = gr.JSON(label="links", visible=False)
        note = gr.Markdown(label="links")
        button.click(
            share,
            [trace, repo, token],
            [links, note],
            api_name=api_name,
            concurrency_id="hub",
            api_visibility="public" if api_name else "private",
        )
