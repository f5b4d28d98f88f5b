"""Attention Profiler: the Gradio Space's layout and event wiring. The endpoints are in `endpoints.py`.

Everything heavy (torch, the profiler, pandas, plotly) is imported inside the handlers,
so importing this module is cheap.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from typing import Any

import gradio as gr

from endpoints import QUEUE_SIZE, analyze, app_error, compare, diff, diff_traces, profile, share, sweep
from traffic import refusing_urls

HISTORY_SIZE = 20  # runs of this session kept for the Diff tab
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


# ---------------------------------------------------------------- layout


def _remember(history: list[dict], summary: dict | list) -> list[dict]:
    """Keep this session's runs (newest last) for the Diff tab."""
    new = [s for s in (summary if isinstance(summary, list) else [summary]) if "error" not in s]
    return (history + new)[-HISTORY_SIZE:]


def _diff_choices(history: list[dict]) -> tuple[Any, Any]:
    from profiling.compare import row_label

    labels = [f"{i + 1}. {row_label(s)} {s['dtype']} S={s['seq_len']}" for i, s in enumerate(history)]
    before = labels[-2] if len(labels) > 1 else None
    after = labels[-1] if labels else None
    return gr.update(choices=labels, value=before), gr.update(choices=labels, value=after)


def _diff_picked(history: list[dict], before: int | None, after: int | None) -> Any:
    if before is None or after is None:
        raise app_error("diff: profile at least two runs in this session, then pick them")
    from profiling.diff import diff_summaries

    return diff_summaries(history[before], history[after])


def _cards(summary: dict) -> str:
    """Profile's headline metrics, drawn from the summary /profile already returned."""
    from profiling.markdown import metric_cards

    return metric_cards(summary)


def _overview(summary: dict, steps: Any) -> tuple:
    """Analyze's Overview, drawn from outputs /analyze already returned (its outputs keep their order)."""
    from profiling.charts import idle_chart, step_breakdown_chart
    from profiling.markdown import gpu_card

    return gpu_card(summary), step_breakdown_chart(steps), idle_chart(summary.get("idle_breakdown_us"))


@dataclass
class Shape:
    """The run controls shared by the Profile, Compare and Sweep tabs, in the endpoints' order."""

    batch: gr.Number
    heads: gr.Number
    seq_len: gr.Number
    head_dim: gr.Number
    dtype: gr.Dropdown
    device: gr.Dropdown
    compile: gr.Checkbox
    mode: gr.Dropdown
    kv_heads: gr.Number
    q_len: gr.Number
    mask: gr.Dropdown
    window: gr.Number
    valid_len: gr.Textbox

    def all(self) -> list[Any]:
        """What /profile and /compare take after the variant: the shape, then the run's other parameters."""
        shape = [self.batch, self.heads, self.seq_len, self.head_dim, self.dtype, self.device, self.compile]
        return [*shape, *self.extra()]

    def extra(self) -> list[Any]:
        return [self.mode, self.kv_heads, self.q_len, self.mask, self.window, self.valid_len]


def _shape_controls(defaults: dict[str, Any], cuda: bool) -> Shape:
    from attention import DTYPES, LIMITS

    def size(name: str) -> gr.Number:
        low, high = LIMITS[name]
        return gr.Number(value=defaults[name], label=name, info=f"{low}–{high:,}", minimum=None, precision=None)

    with gr.Row():
        batch, heads, seq_len, head_dim = size("batch"), size("heads"), size("seq_len"), size("head_dim")
    with gr.Row():
        dtype = gr.Dropdown(list(DTYPES), value=defaults["dtype"], label="dtype", allow_custom_value=True)
        device = gr.Dropdown(
            ["auto", "cpu", "cuda"] if cuda else ["auto", "cpu"], value="auto", label="device", allow_custom_value=True
        )
        compile_box = gr.Checkbox(False, label="torch.compile")
    return Shape(batch, heads, seq_len, head_dim, dtype, device, compile_box, *_practice_controls())


def _practice_controls() -> tuple[Any, ...]:
    """Training, GQA, decode and masks: neutral by default, so the blog's runs stay as they were."""
    from attention import MASKS, MODES

    with gr.Row():
        mode = gr.Dropdown(
            list(MODES),
            value="inference",
            label="mode",
            info="training adds the backward pass",
            allow_custom_value=True,
        )
        kv_heads = gr.Number(0, label="kv_heads", info="0 = heads; fewer is GQA, 1 is MQA", precision=None)
        q_len = gr.Number(0, label="q_len", info="0 = seq_len; 1 is KV-cache decode", precision=None)
        mask = gr.Dropdown(list(MASKS), value="causal", label="mask", allow_custom_value=True)
        window = gr.Number(0, label="window", info="keys each query sees", visible=False, precision=None)
        valid_len = gr.Textbox("", label="valid_len", info="one length, or one per batch row", visible=False)
    mask.change(
        lambda m: (gr.update(visible=m == "sliding_window"), gr.update(visible=m == "padding")),
        mask,
        [window, valid_len],
        api_visibility="private",
    )
    return mode, kv_heads, q_len, mask, window, valid_len


def _share_box(trace: gr.File, api_name: str | None) -> None:
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


def _profile_tab(shape: Shape, history: gr.State, cuda: bool) -> None:
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
    _share_box(trace_file, api_name="share")
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
    done.success(_remember, [history, summary], history, api_visibility="private")
    done.success(_cards, summary, cards, api_visibility="private")


def _compare_tab(shape: Shape, history: gr.State) -> None:
    button = gr.Button("Compare every variant", variant="primary")
    rows = gr.JSON(label="summaries", visible=False)
    table = gr.Dataframe(label="side by side", wrap=True, elem_id="compare-table")
    chart = gr.Plot(label="chart")
    button.click(compare, shape.all(), [rows, table, chart], api_name="compare", concurrency_id="device").success(
        _remember, [history, rows], history, api_visibility="private"
    )


def _diff_tab(history: gr.State) -> None:
    with gr.Row():
        before = gr.Dropdown([], label="before", type="index", info="runs from this session's Profile and Compare")
        after = gr.Dropdown([], label="after", type="index")
        button = gr.Button("Diff")
    table = gr.Dataframe(label="per forward: added, removed, changed", elem_id="diff-table")
    button.click(_diff_picked, [history, before, after], table, api_visibility="private")
    gr.api(diff, api_name="diff")
    history.change(_diff_choices, history, [before, after], api_visibility="private")


def _sweep_tab(shape: Shape) -> None:
    from attention import RUN_NAMES

    with gr.Row():
        variants = gr.CheckboxGroup(list(RUN_NAMES), value=["naive", "sdpa-math", "sdpa-flash"], label="variants")
        seq_lens = gr.Textbox("128,256,512,1024", label="seq_len values", info="comma list")
        button = gr.Button("Sweep", variant="primary")
    chart = gr.Plot(label="chart")
    points = gr.JSON(label="points")
    inputs = [
        *(variants, seq_lens, shape.batch, shape.heads, shape.head_dim, shape.dtype, shape.device, shape.compile),
        *shape.extra(),
    ]
    button.click(sweep, inputs, [points, chart], api_name="sweep", concurrency_id="device")


def _analyze_tab() -> None:
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
    _share_box(upload, api_name=None)
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
            f"PyTorch (Part 3): Attention is all you profile*. Running on **{html.escape(hardware)}**."
        )
        history = gr.State([])
        shape = _shape_controls(PRESETS["blog"] if cuda else PRESETS["cpu-small"], cuda)
        with gr.Tab("Profile"):
            _profile_tab(shape, history, cuda)
        with gr.Tab("Compare"):
            _compare_tab(shape, history)
        with gr.Tab("Diff"):
            _diff_tab(history)
        with gr.Tab("Sweep"):
            _sweep_tab(shape)
        with gr.Tab("Analyze a trace"):
            _analyze_tab()
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
        "app_kwargs": {"middleware": [fair_use]},
    }
    return demo.launch(**{**defaults, **options})


if __name__ == "__main__":
    from endpoints import start_worker

    start_worker()
    launch(build_demo())
