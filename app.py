"""Attention Profiler: the Gradio Space. The tabs are in `ui/`, their handlers in `endpoints/`.

Everything heavy (torch, the profiler, pandas, plotly) is imported inside the handlers,
so importing this module is cheap.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

import gradio as gr

from endpoints import QUEUE_SIZE
from ui.agents import register_agent_endpoints
from ui.analyze_tab import analyze_tab
from ui.compare_tab import compare_tab
from ui.diff_tab import diff_tab
from ui.profile_tab import profile_tab
from ui.shape import shape_controls
from ui.sweep_tab import sweep_tab

# The tabs whose endpoints take the shape panel's values, by label (a tab's select event carries its label).
SHAPED_TABS = PROFILE, COMPARE, SWEEP = "Profile", "Compare", "Sweep"
PHONE_WIDTH_PX = 640  # ui/page.css's breakpoint
# On a phone the tabs must come first: the panel starts closed there (one tap opens it). In the browser,
# on load, because only the browser knows its width.
COLLAPSE_ON_PHONE = f"""() => {{
    if (window.innerWidth > {PHONE_WIDTH_PX}) return;
    const toggle = document.querySelector("#shape-panel .label-wrap");
    if (toggle && toggle.classList.contains("open")) toggle.click();
}}"""
PAGE_CSS = Path(__file__).resolve().parent / "ui" / "page.css"


def shape_panel_on(selected: gr.SelectData) -> Any:
    """The shape panel's visibility for the tab just selected: only the tabs that run attention use it."""
    return gr.update(visible=selected.value in SHAPED_TABS)


def build_demo(queue_size: int = QUEUE_SIZE) -> gr.Blocks:
    """The whole app. `queue_size` bounds the requests waiting; past it a user is told the queue is full."""
    import torch

    from attention import PRESETS
    from profiling.storage import MAX_AGE_S

    cuda = torch.cuda.is_available()
    hardware = torch.cuda.get_device_name() if cuda else "CPU"
    # Gradio's own file cache is checked and emptied on the same clock as our run directories.
    with gr.Blocks(title="Attention Profiler", delete_cache=(int(MAX_AGE_S), int(MAX_AGE_S))) as demo:
        gr.Markdown(
            "# Attention Profiler\nWhat attention really costs, from `torch.profiler` traces: naive vs in-place vs "
            "SDPA's math, flash, efficient and cuDNN backends. After the Hugging Face blog post *Profiling in "
            f"PyTorch (Part 3): Attention is all you profile*. Running on **{html.escape(hardware)}**.",
            elem_id="header",
        )
        history = gr.State([])
        # One panel, rendered once above the tabs: shown on the tabs that run attention, hidden on the others.
        with gr.Accordion("Shape and run settings", elem_id="shape-panel") as panel:
            shape = shape_controls(PRESETS["blog"] if cuda else PRESETS["cpu-small"], cuda)
        with gr.Tabs(elem_id="tabs", overflow_behavior="wrap") as tabs:
            with gr.Tab(PROFILE, id="profile"):
                profile_tab(shape, history, cuda)
            with gr.Tab(COMPARE, id="compare"):
                compare_tab(shape, history)
            with gr.Tab("Diff", id="diff"):
                diff_tab(history)
            with gr.Tab(SWEEP, id="sweep"):
                sweep_tab(shape)
            with gr.Tab("Analyze a trace", id="analyze"):
                analyze_tab()
        tabs.select(shape_panel_on, None, panel, api_visibility="private", queue=False, show_progress="hidden")
        register_agent_endpoints(shape)
        demo.load(None, js=COLLAPSE_ON_PHONE, api_visibility="private")
    demo.queue(max_size=queue_size, default_concurrency_limit=1)
    return demo


def launch(demo: gr.Blocks, **options: Any) -> Any:
    """Serve `demo` behind the fair-use middleware (one file per upload, upload quotas, a per-client
    queue cap: see `traffic.py`). `options` go to `demo.launch`, after this app's defaults."""
    from starlette.middleware import Middleware

    from profiling.reader import MAX_UPLOAD_BYTES
    from traffic import FairUse, Quotas

    fair_use = Middleware(FairUse, blocks=demo, quotas=Quotas.from_env(MAX_UPLOAD_BYTES))
    defaults = {
        "server_name": os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
        "server_port": int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        "mcp_server": True,
        "max_file_size": MAX_UPLOAD_BYTES,  # Gradio refuses a bigger upload before it is stored
        "css_paths": [PAGE_CSS],
        "app_kwargs": {"middleware": [fair_use]},
    }
    return demo.launch(**{**defaults, **options})


if __name__ == "__main__":
    from endpoints import start_worker

    start_worker()
    launch(build_demo())
