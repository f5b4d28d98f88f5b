"""Profile: one variant on one shape, with the lessons as examples."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from endpoints import profile
from traffic import refusing_urls
from ui.diff_tab import remember
from ui.perfetto import perfetto_button
from ui.shape import Shape
from ui.share import share_box
from ui.tables import hidden_api_table, profile_tables, table_view

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
# What each example teaches, row for row (the README's lessons table): shown as the examples' last column.
BLOG_LESSONS = [
    "naive: the out-of-place masked_fill copies the scores, a hidden Memcpy",
    "in-place masked_fill_: the copy is gone, 6 → 5 kernels per forward",
    "SDPA math: ~20 kernels, an FP32 upcast, the mask rebuilt per call, _safe_softmax",
    "SDPA flash: one fused kernel, and a wrong-looking low occupancy",
    "SDPA efficient: one fused kernel, no score matrix",
    "SDPA cuDNN: one fused kernel, behind a fat CPU bar",
    "training on math: the backward's kernels and the scores kept for it",
    "training on flash: a fused backward; only the output and log-sum-exp kept",
    "GQA: 32 query heads on 8 KV heads, and who copies K and V",
    "decode: one query against 8,192 keys is bandwidth-bound",
    "sliding window: a dense mask, which flash refuses: SDPA falls back",
]
CPU_LESSONS = [
    "naive: the out-of-place masked_fill copies the scores (on a GPU, a hidden Memcpy)",
    "in-place masked_fill_: the copy is gone, one kernel fewer per forward",
    "SDPA math: many small kernels, FP32 upcasts, the mask rebuilt per call, _safe_softmax",
    "a fused backend: one kernel per forward, no score matrix",
    "training, naive: the probabilities kept for the backward",
    "training, fused: only the output and log-sum-exp kept for the backward",
    "GQA, naive: repeat_kv copies K and V to every query head",
    "GQA, SDPA math: enable_gqa still copies (repeat_interleave)",
    "decode: one query against 4,096 keys is bandwidth-bound",
    "causal_top_left: is_causal's alignment hides the newest keys from the queries",
    "sliding window: the mask reaches SDPA as a dense attn_mask",
    "padding: a dense mask per batch row (valid_len)",
]


def _cards(summary: dict) -> str:
    """Profile's headline metrics, drawn from the summary /profile already returned."""
    from profiling.markdown import metric_cards

    return metric_cards(summary)


def clear_first(trigger: Callable[..., Any], outputs: list[Any]) -> Any:
    """A private first step on `trigger` that empties `outputs`, before the real handler (chain it with
    `.then` on what this returns): a run that fails then leaves no earlier results beside its error."""

    def empty() -> Any:
        values = tuple(gr.update(value=None) for _ in outputs)
        return values if len(values) > 1 else values[0]

    return trigger(empty, None, outputs, api_visibility="private", queue=False, show_progress="hidden")


def profile_tab(shape: Shape, history: gr.State, cuda: bool) -> None:
    from attention import BACKENDS, VARIANT_CHOICES

    with gr.Row():
        variant = gr.Dropdown(VARIANT_CHOICES, value="naive", label="variant", allow_custom_value=True)
        backend = gr.Dropdown(
            list(BACKENDS), value="auto", label="SDPA backend", visible=False, allow_custom_value=True
        )
        run = gr.Button("Profile", variant="primary")
    variant.change(lambda v: gr.update(visible=v == "sdpa"), variant, backend, api_visibility="private")
    lesson = gr.Textbox(
        label="lesson", interactive=False, elem_id="lesson", placeholder="pick one of the lessons below to read it here"
    )
    cards = gr.Markdown(elem_id="metric-cards", latex_delimiters=[])
    insights = gr.Markdown(label="insights", elem_id="insights", latex_delimiters=[])
    with gr.Accordion("summary (JSON)", open=False):
        summary = gr.JSON(label="summary")
    timeline_plot = gr.Plot(label="timeline", elem_id="timeline")
    gr.Markdown(
        "The timeline opens on the first forward; pan and zoom for the rest. Tables cover the measured forwards."
    )
    # The API's tables, hidden; the page shows display-only copies (ui/tables.py).
    op_table = hidden_api_table("op table (annotations last)", "op-table-api")
    kernels = hidden_api_table("kernel table", "kernel-table-api")
    op_view, kernel_view = table_view("op table", "op-table"), table_view("kernel table", "kernel-table")
    with gr.Row():
        # Outputs only: not drop zones before a run.
        trace_file = refusing_urls(gr.File(label="trace", elem_id="trace-file", interactive=False))
        table_file = gr.File(label="table", interactive=False)
    perfetto_button(trace_file)
    share_box(trace_file, api_name="share")
    controls = {"variant": variant, "backend": backend, **vars(shape)}
    gr.Examples(
        [[*example, lesson_text] for example, lesson_text in _lessons(cuda)],
        [*(controls[name] for name in EXAMPLE_INPUTS), lesson],
        label="The lessons: the blog's experiments, then training, GQA, decode and masks"
        + ("" if cuda else " (CPU-sized)"),
        examples_per_page=len(CPU_EXAMPLES),
    )
    outputs = [summary, op_table, timeline_plot, trace_file, kernels, table_file, insights]
    views = [*op_view.outputs, *kernel_view.outputs]
    done = clear_first(run.click, [*outputs, cards, *views]).then(
        profile,
        [variant, backend, *shape.all()],
        outputs,
        api_name="profile",
        concurrency_id="device",
        show_progress_on=[cards, timeline_plot],
    )
    done.success(remember, [history, summary], history, api_visibility="private")
    done.success(_cards, summary, cards, api_visibility="private")
    done.success(profile_tables, [summary, op_table, kernels], views, api_visibility="private")


def _lessons(cuda: bool) -> list[tuple[list, str]]:
    """The examples of this machine, each with its lesson."""
    examples, lessons = (BLOG_EXAMPLES, BLOG_LESSONS) if cuda else (CPU_EXAMPLES, CPU_LESSONS)
    return list(zip(examples, lessons, strict=True))
