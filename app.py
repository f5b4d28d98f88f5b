"""Attention Profiler: the Gradio Space. UI only: layout, event wiring and gr.Error.

Everything heavy (torch, the profiler, pandas, plotly) is imported inside the handlers,
so importing this module is cheap. The handlers' signatures are the API and MCP schema.
"""

from __future__ import annotations

import contextlib
import html
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

QUEUE_SIZE = int(os.environ.get("ATTENTION_PROFILER_QUEUE", "16"))
RUN_TIME_LIMIT_S = float(os.environ.get("ATTENTION_PROFILER_TIME_LIMIT", "300"))
HISTORY_SIZE = 20  # runs of this session kept for the Diff tab
# ZeroGPU reserves the GPU for the duration a request asks for: a run's share of the time limit,
# a sweep or comparison at most the one limit they share, plus a margin for import and export.
GPU_SECONDS_PER_RUN, GPU_MARGIN_S = 60, 30
PERFETTO_HELP = (
    "Open the trace at [ui.perfetto.dev](https://ui.perfetto.dev): **Open trace file**, then pick the `.json`."
)
BLOG_EXAMPLES = [
    # variant, backend, batch, heads, seq_len, head_dim, dtype
    ["naive", "auto", 8, 16, 1024, 64, "bfloat16"],
    ["inplace", "auto", 8, 16, 1024, 64, "bfloat16"],
    ["sdpa", "math", 8, 16, 1024, 64, "bfloat16"],
    ["sdpa", "flash", 8, 16, 1024, 64, "bfloat16"],
    ["sdpa", "efficient", 8, 16, 1024, 64, "bfloat16"],
    ["sdpa", "cudnn", 8, 16, 1024, 64, "bfloat16"],
]
CPU_EXAMPLES = [
    ["naive", "auto", 1, 4, 256, 64, "float32"],
    ["inplace", "auto", 1, 4, 256, 64, "float32"],
    ["sdpa", "math", 1, 4, 256, 64, "bfloat16"],
    ["sdpa", "flash", 1, 4, 256, 64, "float32"],
]


def gpu_seconds(runs: int) -> int:
    """The GPU time to reserve for `runs` runs that share one time limit."""
    return int(min(RUN_TIME_LIMIT_S, runs * GPU_SECONDS_PER_RUN) + GPU_MARGIN_S)


def _profile_seconds(*args: Any, **kwargs: Any) -> int:
    return gpu_seconds(1)


def _compare_seconds(*args: Any, **kwargs: Any) -> int:
    from attention import RUNS

    return gpu_seconds(len(RUNS))


def _sweep_seconds(variants: list[str] | None = None, seq_lens: str = "", *args: Any, **kwargs: Any) -> int:
    return gpu_seconds(max(1, len(variants or [])) * max(1, str(seq_lens).count(",") + 1))


try:  # ZeroGPU on Hugging Face Spaces: the GPU is attached only inside @spaces.GPU.
    import spaces

    def on_gpu(duration: Any) -> Any:
        return spaces.GPU(duration=duration)

except ImportError:

    def on_gpu(duration: Any) -> Any:
        return lambda fn: fn


_store = None


def store() -> Any:
    """The per-request run directories (created on first use, pruned as runs are added)."""
    global _store
    if _store is None:
        from profiling.storage import RunStore

        _store = RunStore(os.environ.get("ATTENTION_PROFILER_DIR"))
    return _store


def _error(message: str) -> gr.Error:
    # Messages can quote an uploaded file's name or a trace's field: shown as text, never markup.
    return gr.Error(html.escape(message, quote=False), print_exception=False)


def _app_file(path: str | None, field: str) -> str:
    """`path` if it is a file this app holds (an upload or one of its own runs), else gr.Error.

    An API caller can name any server path in a FileData; none but these may be read or shared.
    """
    from pathlib import Path

    from gradio.utils import get_upload_folder

    if not path:
        raise _error(f"{field}: upload a .json or .json.gz Chrome trace")
    resolved = Path(path).resolve()
    uploaded = resolved.is_file() and resolved.is_relative_to(Path(get_upload_folder()).resolve())
    if not (uploaded or store().owns(resolved)):
        raise _error(f"{field}: only files uploaded to this app or produced by it can be used")
    return str(resolved)


def _whole(value: Any) -> Any:
    """Numbers from the UI arrive as floats; pass whole ones on as int, the rest untouched."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _spec(**fields: Any) -> Any:
    """The AttentionSpec for UI/API values; it validates them all and names the bad field."""
    from attention import AttentionSpec

    values = {name: _whole(value) for name, value in fields.items()}
    values["backend"] = values.get("backend") or "auto"
    with _user_errors():
        return AttentionSpec(**values)


def _progress(progress: gr.Progress) -> Any:
    return lambda fraction, message: progress(fraction, desc=message)


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """Our own errors (bad spec, failed run, bad trace, failed share) reach the user as gr.Error."""
    from attention import SpecError
    from profiling.runner import RunError
    from profiling.share import ShareError
    from profiling.trace import TraceError

    try:
        yield
    except (SpecError, RunError, TraceError, ShareError) as exc:
        raise _error(str(exc)) from None


# ---------------------------------------------------------------- endpoints


@on_gpu(_profile_seconds)
def profile(
    variant: str,
    backend: str,
    batch: float,
    heads: float,
    seq_len: float,
    head_dim: float,
    dtype: str,
    device: str,
    compile: bool,
    progress: gr.Progress = gr.Progress(),
) -> tuple:
    """Profile one attention variant with torch.profiler.

    Args:
        variant: naive, inplace, sdpa, flex or hub_flash.
        backend: the SDPA backend (auto, math, flash, efficient, cudnn); ignored by other variants.
        batch: batch size.
        heads: attention heads.
        seq_len: sequence length.
        head_dim: size of each head.
        dtype: float32, bfloat16 or float16.
        device: auto, cpu or cuda.
        compile: wrap the attention in torch.compile.

    Returns the summary, op table, timeline, trace file, kernel table, key_averages file and insights.
    """
    from profiling.charts import timeline
    from profiling.markdown import insights_markdown
    from profiling.pipeline import profile_attention
    from profiling.tables import rounded

    spec = _spec(
        variant=variant,
        backend=backend,
        batch=batch,
        heads=heads,
        seq_len=seq_len,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
        compile=compile,
    )
    with _user_errors():
        result = profile_attention(spec, store().new_dir(), _progress(progress), time_limit_s=RUN_TIME_LIMIT_S)
    return (
        dict(result.summary),
        rounded(result.op_table),
        timeline(result.analysis),
        str(result.trace_path),
        rounded(result.kernel_table),
        str(result.table_path),
        insights_markdown(result.insights),
    )


@on_gpu(_compare_seconds)
def compare(
    batch: float,
    heads: float,
    seq_len: float,
    head_dim: float,
    dtype: str,
    device: str,
    compile: bool,
    progress: gr.Progress = gr.Progress(),
) -> tuple:
    """Every variant and SDPA backend on one shape, within one time limit.

    Args:
        batch: batch size.
        heads: attention heads.
        seq_len: sequence length.
        head_dim: size of each head.
        dtype: float32, bfloat16 or float16.
        device: auto, cpu or cuda.
        compile: wrap the attention in torch.compile.

    Returns the summaries (a run that cannot run here carries `error`), a table and a chart.
    """
    from profiling.charts import compare_chart
    from profiling.compare import compare as compare_all
    from profiling.compare import compare_table

    spec = _spec(
        batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim, dtype=dtype, device=device, compile=compile
    )
    rows = compare_all(spec, store().new_dir(), _progress(progress), time_limit_s=RUN_TIME_LIMIT_S)
    return rows, compare_table(rows), compare_chart(rows)


@on_gpu(_sweep_seconds)
def sweep(
    variants: list[str],
    seq_lens: str,
    batch: float,
    heads: float,
    head_dim: float,
    dtype: str,
    device: str,
    compile: bool,
    progress: gr.Progress = gr.Progress(),
) -> tuple:
    """Forward time and peak memory of each variant over a list of seq_len values, within one time limit.

    Args:
        variants: runs to sweep, e.g. ["naive", "sdpa-math", "sdpa-flash"].
        seq_lens: comma list of sequence lengths, e.g. "128,256,512".
        batch: batch size.
        heads: attention heads.
        head_dim: size of each head.
        dtype: float32, bfloat16 or float16.
        device: auto, cpu or cuda.
        compile: wrap the attention in torch.compile.

    Returns the points (status ok or stopped, with the reason) and a chart.
    """
    from attention import parse_runs, parse_seq_lens
    from profiling.charts import sweep_chart
    from profiling.sweep import sweep as run_sweep

    if not isinstance(variants, list) or not all(isinstance(v, str) for v in variants):
        raise _error('variants: give a list of run names, e.g. ["naive", "sdpa-flash"]')
    with _user_errors():
        runs, lengths = parse_runs(",".join(variants)), parse_seq_lens(str(seq_lens))
    spec = _spec(
        variant=runs[0][0],
        backend=runs[0][1],
        batch=batch,
        heads=heads,
        seq_len=min(lengths),
        head_dim=head_dim,
        dtype=dtype,
        device=device,
        compile=compile,
    )
    with _user_errors():
        rows = run_sweep(spec, runs, lengths, store().new_dir(), _progress(progress), time_limit_s=RUN_TIME_LIMIT_S)
    return rows, sweep_chart(rows)


def analyze(trace: str | None, progress: gr.Progress = gr.Progress()) -> tuple:
    """Analyze an uploaded torch.profiler Chrome trace.

    Args:
        trace: a .json or .json.gz Chrome trace from torch.profiler (CUDA, ROCm or CPU).

    Returns the summary, op table, kernel table, timeline, steps, annotations, insights and steps chart.
    """
    from profiling.analysis import analyze_file
    from profiling.charts import timeline, window_chart
    from profiling.markdown import insights_markdown
    from profiling.tables import rounded

    path = _app_file(trace, "trace")
    with _user_errors():
        result = analyze_file(path, progress=_progress(progress))
    progress(0.95, desc="drawing the timeline")
    return (
        dict(result.summary),
        rounded(result.op_table),
        rounded(result.kernel_table),
        timeline(result),
        rounded(result.steps),
        rounded(result.annotations),
        insights_markdown(result.insights),
        window_chart(result.steps),
    )


def diff(before: dict, after: dict) -> list[dict]:
    """Ops and kernels added, removed and changed per forward between two runs.

    Args:
        before: a summary returned by /profile or a row of /compare.
        after: another such summary.
    """
    from profiling.diff import DiffError, diff_summaries

    try:
        return diff_summaries(before, after).to_dict(orient="records")
    except DiffError as exc:
        raise _error(str(exc)) from None


def share(trace: str | None, repo_id: str, token: str, oauth_token: gr.OAuthToken | None = None) -> tuple:
    """Upload a trace to a public Hub dataset repo you own; returns its URL and a Perfetto link.

    Args:
        trace: a trace file produced by or uploaded to this app.
        repo_id: the repo, as owner/name.
        token: a Hugging Face token with write access (or log in on the Space).
    """
    from profiling.share import share_trace

    secret = token or (oauth_token.token if oauth_token else "")
    if not trace:
        raise _error("trace: there is no trace to share yet; profile or analyze one first")
    path = _app_file(trace, "trace")
    with _user_errors():
        links = share_trace(path, repo_id, secret)
    return links, f"[Open in Perfetto]({links['perfetto_url']}) · [file]({links['url']})\n\n{links['note']}"


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
        raise _error("diff: profile at least two runs in this session, then pick them")
    from profiling.diff import diff_summaries

    return diff_summaries(history[before], history[after])


def _overview(summary: dict, steps: Any) -> tuple:
    """Analyze's Overview, drawn from outputs /analyze already returned (its outputs keep their order)."""
    from profiling.charts import idle_chart, step_breakdown_chart
    from profiling.markdown import gpu_card

    return gpu_card(summary), step_breakdown_chart(steps), idle_chart(summary.get("idle_breakdown_us"))


@dataclass
class Shape:
    """The shape controls shared by the Profile, Compare and Sweep tabs."""

    batch: gr.Number
    heads: gr.Number
    seq_len: gr.Number
    head_dim: gr.Number
    dtype: gr.Dropdown
    device: gr.Dropdown
    compile: gr.Checkbox

    def all(self) -> list[Any]:
        return [self.batch, self.heads, self.seq_len, self.head_dim, self.dtype, self.device, self.compile]


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
    return Shape(batch, heads, seq_len, head_dim, dtype, device, compile_box)


def _share_box(trace: gr.File, api_name: str | None) -> None:
    with gr.Accordion("Share this trace (Hugging Face Hub → Perfetto link)", open=False):
        with gr.Row():
            repo = gr.Textbox(
                label="repo", placeholder="you/attention-traces", info="a public dataset repo; created if missing"
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
    with gr.Row():
        insights = gr.Markdown(label="insights", elem_id="insights", latex_delimiters=[])
        summary = gr.JSON(label="summary", open=False)
    timeline_plot = gr.Plot(label="timeline", elem_id="timeline")
    gr.Markdown(
        "The timeline opens on the first forward; pan and zoom for the rest. Tables cover the measured forwards."
    )
    op_table = gr.Dataframe(label="op table (annotations last)", elem_id="op-table")
    kernels = gr.Dataframe(label="kernel table", elem_id="kernel-table")
    gr.Markdown(PERFETTO_HELP)
    with gr.Row():
        trace_file = gr.File(label="trace", elem_id="trace-file")
        table_file = gr.File(label="table")
    _share_box(trace_file, api_name="share")
    gr.Examples(
        BLOG_EXAMPLES if cuda else CPU_EXAMPLES,
        [variant, backend, shape.batch, shape.heads, shape.seq_len, shape.head_dim, shape.dtype],
        label="The blog's experiments" + ("" if cuda else " (CPU-sized)"),
    )
    run.click(
        profile,
        [variant, backend, *shape.all()],
        [summary, op_table, timeline_plot, trace_file, kernels, table_file, insights],
        api_name="profile",
        concurrency_id="device",
    ).success(_remember, [history, summary], history, api_visibility="private")


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
    inputs = [variants, seq_lens, shape.batch, shape.heads, shape.head_dim, shape.dtype, shape.device, shape.compile]
    button.click(sweep, inputs, [points, chart], api_name="sweep", concurrency_id="device")


def _analyze_tab() -> None:
    from profiling.analysis import MAX_ANNOTATIONS, MAX_STEPS

    gr.Markdown(
        "Upload a Chrome trace from `torch.profiler` (`export_chrome_trace` or `tensorboard_trace_handler`), "
        "recorded on CUDA, ROCm or CPU."
    )
    upload = gr.File(label="trace (.json or .json.gz)", file_types=[".json", ".gz"], elem_id="upload")
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


if __name__ == "__main__":
    from profiling.reader import MAX_UPLOAD_BYTES

    build_demo().launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        mcp_server=True,
        max_file_size=MAX_UPLOAD_BYTES,  # Gradio refuses a bigger upload before it is stored
    )
