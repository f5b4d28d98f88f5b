"""Profile: one variant on one shape, with the lessons as examples."""

from __future__ import annotations

import gradio as gr

from endpoints import profile
from traffic import refusing_urls
from ui.diff_tab import remember
from ui.shape import Shape
from ui.share import share_box

PERFETTO_HELP = (
    "Open the trace at [ui.perfetto.dev](https://ui.perfetto.dev): **Open trace file**, then pick the `.json`."
)

# Inputs of the Profile examples, in this order: one example per lesson of the README's table.
EXAMPLE_INPUTS = (
    *("variant", "backend", "batch", "heads", "seq_len", "head_dim", "dtype"),
    *("mode", "kv_heads", "q_len", "mask", "window", "valid_len"),
)
BLOG_EXAMPLES = [
    ["naive", "auto", 8, 16, 1024, 64, "bfloat16", "inference", 0, 0, "causal", 0, ""],
    ["inplace", "auto", 8, 16, 1024, 64, "bfloat16", "inference", 0, 0, "causal", 0, ""],
    ["sdpa", "math", 8, 16, 1024, 64, "bfloat16", "inference", 0, 0, "causal", 0, ""],
    ["sdpa", "flash", 8, 16, 1024, 64, "bfloat16", "inference", 0, 0, "causal", 0, ""],
    ["sdpa", "efficient", 8, 16, 1024, 64, "bfloat16", "inference", 0, 0, "causal", 0, ""],
    ["sdpa", "cudnn", 8, 16, 1024, 64, "bfloat16", "inference", 0, 0, "causal", 0, ""],
    ["sdpa", "math", 8, 16, 1024, 64, "bfloat16", "training", 0, 0, "causal", 0, ""],
    ["sdpa", "flash", 8, 16, 1024, 64, "bfloat16", "training", 0, 0, "causal", 0, ""],
    ["sdpa", "auto", 8, 32, 1024, 128, "bfloat16", "inference", 8, 0, "causal", 0, ""],
    ["sdpa", "auto", 8, 32, 8192, 128, "bfloat16", "inference", 8, 1, "causal", 0, ""],
    ["sdpa", "auto", 8, 16, 1024, 64, "bfloat16", "inference", 0, 0, "sliding_window", 256, ""],
]
CPU_EXAMPLES = [
    ["naive", "auto", 1, 4, 256, 64, "float32", "inference", 0, 0, "causal", 0, ""],
    ["inplace", "auto", 1, 4, 256, 64, "float32", "inference", 0, 0, "causal", 0, ""],
    ["sdpa", "math", 1, 4, 256, 64, "bfloat16", "inference", 0, 0, "causal", 0, ""],
    ["sdpa", "flash", 1, 4, 256, 64, "float32", "inference", 0, 0, "causal", 0, ""],
    ["naive", "auto", 1, 4, 512, 64, "float32", "training", 0, 0, "causal", 0, ""],
    ["sdpa", "flash", 1, 4, 512, 64, "float32", "training", 0, 0, "causal", 0, ""],
    ["naive", "auto", 1, 8, 256, 64, "float32", "inference", 2, 0, "causal", 0, ""],
    ["sdpa", "math", 1, 8, 256, 64, "float32", "inference", 2, 0, "causal", 0, ""],
    ["sdpa", "flash", 1, 8, 4096, 64, "float32", "inference", 2, 1, "causal", 0, ""],
    ["sdpa", "auto", 1, 4, 256, 64, "float32", "inference", 0, 16, "causal_top_left", 0, ""],
    ["sdpa", "auto", 1, 4, 256, 64, "float32", "inference", 0, 0, "sliding_window", 64, ""],
    ["sdpa", "auto", 2, 4, 256, 64, "float32", "inference", 0, 0, "padding", 0, "100,256"],
]


def _cards(summary: dict) -> str:
    """Profile's headline metrics, drawn from the summary /profile already returned."""
    from profiling.markdown import metric_cards

    return metric_cards(summary)


def profile_tab(shape: Shape, history: gr.State, cuda: bool) -> None:
    from attention import BACKENDS, VARIANT_CHOICES

    with gr.Row():
        variant = gr.Dropdown(VARIANT_CHOICES, value="naive", label="variant", allow_custom_value=True)
        backend = gr.Dropdown(
            list(BACKENDS), value="auto", label="SDPA backend", visible=False, allow_custom_value=True
        )
        run = gr.Button("Profile", variant="primary")
    variant.change(lambda v: gr.update(visible=v == "sdpa"), variant, backend, api_visibility="private")
    cards = gr.Markdown(elem_id="metric-cards", latex_delimiters=[])
    insights = gr.Markdown(label="insights", elem_id="insights", latex_delimiters=[])
    with gr.Accordion("summary (JSON)", open=False):
        summary = gr.JSON(label="summary")
    timeline_plot = gr.Plot(label="timeline", elem_id="timeline")
    gr.Markdown(
        "The timeline opens on the first forward; pan and zoom for the rest. Tables cover the measured forwards."
    )
    op_table = gr.Dataframe(label="op table (annotations last)", elem_id="op-table")
    kernels = gr.Dataframe(label="kernel table", elem_id="kernel-table")
    gr.Markdown(PERFETTO_HELP)
    with gr.Row():
        trace_file = refusing_urls(gr.File(label="trace", elem_id="trace-file"))
        table_file = gr.File(label="table")
    share_box(trace_file, api_name="share")
    controls = {"variant": variant, "backend": backend, **vars(shape)}
    gr.Examples(
        BLOG_EXAMPLES if cuda else CPU_EXAMPLES,
        [controls[name] for name in EXAMPLE_INPUTS],
        label="The lessons: the blog's experiments, then training, GQA, decode and masks"
        + ("" if cuda else " (CPU-sized)"),
    )
    done = run.click(
        profile,
        [variant, backend, *shape.all()],
        [summary, op_table, timeline_plot, trace_file, kernels, table_file, insights],
        api_name="profile",
        concurrency_id="device",
    )
    done.success(remember, [history, summary], history, api_visibility="private")
    done.success(_cards, summary, cards, api_visibility="private")
