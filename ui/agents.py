"""The compact endpoints for agents (MCP and API only): /profile_summary, /compare_summary, /analyze_summary.

They take the shape panel's own components, so their parameters, defaults, integer ranges and enums are
/profile's and /compare's; their variant, backend and trace inputs and their one text output are hidden
twins of the Profile and Analyze tabs' ones. Each keeps its original's queue and concurrency group.
"""

from __future__ import annotations

import gradio as gr

from endpoints.compact import analyze_summary, compare_summary, profile_summary
from traffic import refusing_urls
from ui.components import TraceFile
from ui.shape import Shape


def register_agent_endpoints(shape: Shape) -> None:
    """Add the three compact endpoints to the Blocks being built, on hidden inputs beside `shape`."""
    from attention import BACKENDS, VARIANT_CHOICES

    with gr.Column(visible=False):
        variant = gr.Dropdown(VARIANT_CHOICES, value="naive", label="variant", allow_custom_value=True)
        backend = gr.Dropdown(list(BACKENDS), value="auto", label="SDPA backend", allow_custom_value=True)
        trace = refusing_urls(TraceFile(field="trace", label="trace", file_types=[".json", ".gz"]))
        result = gr.Textbox(label="result (JSON)")
        profile_button, compare_button, analyze_button = gr.Button(), gr.Button(), gr.Button()
    profile_button.click(
        profile_summary,
        [variant, backend, *shape.all()],
        result,
        api_name="profile_summary",
        concurrency_id="device",
    )
    compare_button.click(compare_summary, shape.all(), result, api_name="compare_summary", concurrency_id="device")
    analyze_button.click(
        analyze_summary,
        trace,
        result,
        api_name="analyze_summary",
        concurrency_id="analyze",
        concurrency_limit=2,
    )
