"""Attention Profiler: the Gradio Space. UI only: layout, event wiring and gr.Error.

Everything heavy (torch, the profiler, pandas, plotly) is imported inside the handlers,
so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import gradio as gr

try:  # ZeroGPU on Hugging Face Spaces: the GPU is attached only inside @spaces.GPU.
    import spaces

    on_gpu = spaces.GPU(duration=120)
except ImportError:

    def on_gpu(fn: Any) -> Any:
        return fn


QUEUE_SIZE = int(os.environ.get("ATTENTION_PROFILER_QUEUE", "16"))
RUN_TIME_LIMIT_S = float(os.environ.get("ATTENTION_PROFILER_TIME_LIMIT", "300"))
VARIANT_CHOICES = [
    ("naive", "naive"),
    ("in-place", "inplace"),
    ("SDPA", "sdpa"),
    ("flex_attention", "flex"),
    ("FlashAttention from the Hub", "hub_flash"),
]
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

_store = None


def store() -> Any:
    """The per-request run directories (created on first use, pruned as runs are added)."""
    global _store
    if _store is None:
        from profiling.storage import RunStore

        _store = RunStore(os.environ.get("ATTENTION_PROFILER_DIR"))
    return _store


def _app_file(path: str | None, field: str) -> str:
    """`path` if it is a file this app holds (an upload or one of its own runs), else gr.Error.

    An API caller can name any server path in a FileData; none but these may be read or shared.
    """
    from pathlib import Path

    from gradio.utils import get_upload_folder

    if not path:
        raise gr.Error(f"{field}: upload a .json or .json.gz Chrome trace", print_exception=False)
    resolved = Path(path).resolve()
    roots = [Path(get_upload_folder()).resolve(), store().root.resolve()]
    if not resolved.is_file() or not any(resolved.is_relative_to(root) for root in roots):
        raise gr.Error(f"{field}: only files uploaded to this app or produced by it can be used", print_exception=False)
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
        raise gr.Error(str(exc), print_exception=False) from None


def _insights_markdown(insights: list[Any]) -> str:
    if not insights:
        return "_No insight rule fired for this trace._"
    # Each insight reads "Title: evidence"; bold the title.
    return "\n".join(
        "- **{}**: {}".format(*i.text.split(": ", 1)) if ": " in i.text else f"- {i.text}" for i in insights
    )


@on_gpu
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
    """Profile one attention variant; returns the summary, op table, timeline, trace and more."""
    from profiling.charts import timeline
    from profiling.runner import profile_attention
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
        result.summary,
        rounded(result.op_table),
        timeline(result.trace),
        str(result.trace_path),
        rounded(result.kernel_table),
        str(result.table_path),
        _insights_markdown(result.insights),
    )


@on_gpu
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
    """Every variant/backend on one shape: the summaries (errors for those that can't run), table and chart."""
    from profiling.charts import compare_chart
    from profiling.compare import compare as compare_all
    from profiling.compare import compare_table

    spec = _spec(
        batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim, dtype=dtype, device=device, compile=compile
    )
    rows, _ = compare_all(spec, store().new_dir(), _progress(progress), time_limit_s=RUN_TIME_LIMIT_S)
    return rows, compare_table(rows), compare_chart(rows)


@on_gpu
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
    """Forward time and peak memory of each variant over a list of seq_len values."""
    from profiling.__main__ import parse_seq_lens, parse_variants
    from profiling.charts import sweep_chart
    from profiling.sweep import sweep as run_sweep

    with _user_errors():
        chosen = parse_variants(",".join(variants or []))
        lengths = parse_seq_lens(str(seq_lens))
        spec = _spec(
            variant=chosen[0][0],
            backend=chosen[0][1],
            batch=batch,
            heads=heads,
            seq_len=min(lengths),
            head_dim=head_dim,
            dtype=dtype,
            device=device,
            compile=compile,
        )
        rows = run_sweep(spec, chosen, lengths, store().new_dir(), _progress(progress), time_limit_s=RUN_TIME_LIMIT_S)
    return rows, sweep_chart(rows)


def analyze(trace: str | None, progress: gr.Progress = gr.Progress()) -> tuple:
    """Analyze an uploaded torch.profiler Chrome trace (.json or .json.gz)."""
    from profiling.analyze import analyze_file
    from profiling.charts import timeline, window_chart
    from profiling.tables import rounded

    path = _app_file(trace, "trace")
    progress(0.1, desc="reading the trace")
    with _user_errors():
        result = analyze_file(path)
    progress(0.8, desc="drawing the timeline")
    return (
        result.summary,
        rounded(result.op_table),
        rounded(result.kernel_table),
        timeline(result.trace),
        rounded(result.steps),
        rounded(result.annotations),
        _insights_markdown(result.insights),
        window_chart(result.steps),
    )


def diff(before: dict, after: dict) -> list[dict]:
    """Ops and kernels added, removed and changed per forward between two `/profile` summaries."""
    from profiling.diff import diff_summaries

    for field, summary in (("before", before), ("after", after)):
        if not isinstance(summary, dict) or "per_forward_ops" not in summary:
            raise gr.Error(f"{field}: give a summary returned by /profile or /compare", print_exception=False)
    return diff_summaries(before, after).to_dict(orient="records")


def share(trace: str | None, repo_id: str, token: str, oauth_token: gr.OAuthToken | None = None) -> tuple:
    """Upload a trace to a Hub repo you own and return its URL and a Perfetto link."""
    from profiling.share import share_trace

    secret = token or (oauth_token.token if oauth_token else "")
    if not trace:
        raise gr.Error("trace: there is no trace to share yet; profile or analyze one first", print_exception=False)
    path = _app_file(trace, "trace")
    with _user_errors():
        links = share_trace(path, repo_id, secret)
    return links, f"[Open in Perfetto]({links['perfetto_url']}) · [file]({links['url']})\n\n{links['note']}"


# ---------------------------------------------------------------- layout


def _remember(history: list[dict], summary: dict | list) -> list[dict]:
    """Keep this session's runs (newest last) for the Diff tab."""
    new = [s for s in (summary if isinstance(summary, list) else [summary]) if "error" not in s]
    return (history + new)[-20:]


def _diff_choices(history: list[dict]) -> tuple[Any, Any]:
    from profiling.compare import run_label

    labels = [f"{i + 1}. {run_label(s)} {s['dtype']} S={s['seq_len']}" for i, s in enumerate(history)]
    before = len(labels) - 2 if len(labels) > 1 else None
    after = len(labels) - 1 if labels else None
    return (
        gr.update(choices=labels, value=labels[before] if before is not None else None),
        gr.update(choices=labels, value=labels[after] if after is not None else None),
    )


def _diff_picked(history: list[dict], before: int | None, after: int | None) -> Any:
    if before is None or after is None:
        raise gr.Error("diff: profile at least two runs in this session, then pick them", print_exception=False)
    from profiling.diff import diff_summaries

    return diff_summaries(history[before], history[after])


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


def build_demo(queue_size: int = QUEUE_SIZE) -> gr.Blocks:
    """The whole app: shape controls shared by the Profile, Compare and Sweep tabs.

    `queue_size` bounds the requests waiting for the device; past it a user is told the queue is full.
    """
    import torch

    from attention import BACKENDS, DTYPES, LIMITS, PRESETS

    cuda = torch.cuda.is_available()
    hardware = torch.cuda.get_device_name() if cuda else "CPU"
    defaults = PRESETS["blog"] if cuda else PRESETS["cpu-small"]
    device_choices = ["auto", "cpu", "cuda"] if cuda else ["auto", "cpu"]

    def size(name: str, label: str) -> gr.Number:
        low, high = LIMITS[name]
        return gr.Number(value=defaults[name], label=label, info=f"{low}–{high:,}", minimum=None, precision=None)

    with gr.Blocks(title="Attention Profiler", delete_cache=(3600, 3600)) as demo:
        gr.Markdown(
            "# Attention Profiler\nWhat attention really costs, from `torch.profiler` traces: naive vs in-place vs "
            "SDPA's math, flash, efficient and cuDNN backends. After the Hugging Face blog post *Profiling in "
            f"PyTorch (Part 3): Attention is all you profile*. Running on **{hardware}**."
        )
        history = gr.State([])
        with gr.Row():
            batch, heads = size("batch", "batch"), size("heads", "heads")
            seq_len, head_dim = size("seq_len", "seq_len"), size("head_dim", "head_dim")
        with gr.Row():
            dtype = gr.Dropdown(list(DTYPES), value=defaults["dtype"], label="dtype", allow_custom_value=True)
            device = gr.Dropdown(device_choices, value="auto", label="device", allow_custom_value=True)
            compile_box = gr.Checkbox(False, label="torch.compile")
        shape = [batch, heads, seq_len, head_dim, dtype, device, compile_box]

        with gr.Tab("Profile"):
            with gr.Row():
                variant = gr.Dropdown(VARIANT_CHOICES, value="naive", label="variant", allow_custom_value=True)
                backend = gr.Dropdown(
                    list(BACKENDS), value="auto", label="SDPA backend", visible=False, allow_custom_value=True
                )
                run = gr.Button("Profile", variant="primary")
            variant.change(lambda v: gr.update(visible=v == "sdpa"), variant, backend, api_visibility="private")
            with gr.Row():
                insights = gr.Markdown(label="insights", elem_id="insights")
                summary = gr.JSON(label="summary", open=False)
            timeline_plot = gr.Plot(label="timeline", elem_id="timeline")
            gr.Markdown(
                "The timeline opens on the first forward; pan and zoom for the rest. "
                "Tables cover the 3 measured forwards."
            )
            op_table = gr.Dataframe(label="op table", elem_id="op-table")
            kernels = gr.Dataframe(label="kernel table", elem_id="kernel-table")
            gr.Markdown(PERFETTO_HELP)
            with gr.Row():
                trace_file = gr.File(label="trace", elem_id="trace-file")
                table_file = gr.File(label="table")
            _share_box(trace_file, api_name="share")
            gr.Examples(
                BLOG_EXAMPLES if cuda else CPU_EXAMPLES,
                [variant, backend, batch, heads, seq_len, head_dim, dtype],
                label="The blog's experiments" + ("" if cuda else " (CPU-sized)"),
            )
            run.click(
                profile,
                [variant, backend, *shape],
                [summary, op_table, timeline_plot, trace_file, kernels, table_file, insights],
                api_name="profile",
                concurrency_id="device",
            ).success(_remember, [history, summary], history, api_visibility="private")

        with gr.Tab("Compare"):
            compare_button = gr.Button("Compare every variant", variant="primary")
            compare_rows = gr.JSON(label="summaries", visible=False)
            compare_df = gr.Dataframe(label="side by side", wrap=True, elem_id="compare-table")
            compare_plot = gr.Plot(label="chart")
            compare_button.click(
                compare, shape, [compare_rows, compare_df, compare_plot], api_name="compare", concurrency_id="device"
            ).success(_remember, [history, compare_rows], history, api_visibility="private")

        with gr.Tab("Diff"):
            with gr.Row():
                before = gr.Dropdown(
                    [], label="before", type="index", info="runs from this session's Profile and Compare"
                )
                after = gr.Dropdown([], label="after", type="index")
                diff_button = gr.Button("Diff")
            diff_df = gr.Dataframe(label="per forward: added, removed, changed", elem_id="diff-table")
            diff_button.click(_diff_picked, [history, before, after], diff_df, api_visibility="private")
            gr.api(diff, api_name="diff")

        with gr.Tab("Sweep"):
            with gr.Row():
                sweep_variants = gr.CheckboxGroup(
                    [
                        "naive",
                        "inplace",
                        "sdpa-math",
                        "sdpa-flash",
                        "sdpa-efficient",
                        "sdpa-cudnn",
                        "flex",
                        "hub_flash",
                    ],
                    value=["naive", "sdpa-math", "sdpa-flash"],
                    label="variants",
                )
                seq_lens = gr.Textbox("128,256,512,1024", label="seq_len values", info="comma list")
                sweep_button = gr.Button("Sweep", variant="primary")
            sweep_plot = gr.Plot(label="chart")
            sweep_rows = gr.JSON(label="points")
            sweep_button.click(
                sweep,
                [sweep_variants, seq_lens, batch, heads, head_dim, dtype, device, compile_box],
                [sweep_rows, sweep_plot],
                api_name="sweep",
                concurrency_id="device",
            )

        with gr.Tab("Analyze a trace"):
            gr.Markdown(
                "Upload a Chrome trace from `torch.profiler` (`export_chrome_trace` or `tensorboard_trace_handler`), "
                "recorded on CUDA, ROCm or CPU."
            )
            upload = gr.File(label="trace (.json or .json.gz)", file_types=[".json", ".gz"], elem_id="upload")
            analyze_button = gr.Button("Analyze", variant="primary")
            analyze_insights = gr.Markdown(label="insights")
            analyze_summary = gr.JSON(label="summary")
            analyze_timeline = gr.Plot(label="timeline")
            analyze_ops = gr.Dataframe(label="op table")
            analyze_kernels = gr.Dataframe(label="kernel table")
            steps = gr.Dataframe(label="steps")
            steps_plot = gr.Plot(label="steps chart")
            annotations = gr.Dataframe(label="annotations")
            _share_box(upload, api_name=None)
            analyze_button.click(
                analyze,
                upload,
                [
                    analyze_summary,
                    analyze_ops,
                    analyze_kernels,
                    analyze_timeline,
                    steps,
                    annotations,
                    analyze_insights,
                    steps_plot,
                ],
                api_name="analyze",
                concurrency_id="analyze",
                concurrency_limit=2,
            )
        history.change(_diff_choices, history, [before, after], api_visibility="private")
    demo.queue(max_size=queue_size, default_concurrency_limit=1)
    return demo


if __name__ == "__main__":
    build_demo().launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        mcp_server=True,
        max_file_size="100mb",
    )
