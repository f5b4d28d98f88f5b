"""The app's endpoints: validation, gr.Error, ZeroGPU, and a call into `profiling`. No layout.

Their signatures are the public API and MCP schema: parameters are only ever appended, with
neutral defaults (`kv_heads` 0 = heads, `q_len` 0 = seq_len), and outputs never move.
"""

from __future__ import annotations

import contextlib
import html
import math
import os
from collections.abc import Callable, Generator, Iterator
from typing import Any

import gradio as gr

QUEUE_SIZE = int(os.environ.get("ATTENTION_PROFILER_QUEUE", "16"))
RUN_TIME_LIMIT_S = float(os.environ.get("ATTENTION_PROFILER_TIME_LIMIT", "300"))
# ZeroGPU reserves the GPU for the duration a request asks for: a run's share of the time limit and
# its unprofiled timing loops (the forward's, and in training the backward's: each at most the timing
# budget), a sweep or comparison at most the one limit they share, plus a margin for import and export.
GPU_SECONDS_PER_RUN, GPU_MARGIN_S, TIMING_LOOPS_PER_RUN = 60, 30, 2
# How many outputs each generator handler has: it yields "no change" to all of them while it waits.
PROFILE_OUTPUTS, COMPARE_OUTPUTS, SWEEP_OUTPUTS, ANALYZE_OUTPUTS, DIFF_TRACES_OUTPUTS = 7, 3, 2, 8, 2


def gpu_seconds(runs: int) -> int:
    """The GPU time to reserve for `runs` runs that share one time limit, their timing loops included."""
    from profiling.timing import timing_budget_s

    per_run = GPU_SECONDS_PER_RUN + TIMING_LOOPS_PER_RUN * timing_budget_s()
    return math.ceil(min(RUN_TIME_LIMIT_S, runs * per_run) + GPU_MARGIN_S)


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


def start_worker() -> None:
    """Start the run worker (and its forkserver, which imports torch) beside the server, so the first
    request's time limit does not pay for it."""
    import threading

    from profiling.worker import default_worker

    threading.Thread(target=default_worker().start, name="worker-start", daemon=True).start()


def app_error(message: str) -> gr.Error:
    # Messages can quote an uploaded file's name or a trace's field: shown as text, never markup.
    return gr.Error(html.escape(message, quote=False), print_exception=False)


def _app_file(path: str | None, field: str) -> str:
    """`path` if it is a file this app holds (an upload or one of its own runs), else gr.Error.

    An API caller can name any server path in a FileData; none but these may be read or shared.
    """
    from pathlib import Path

    from gradio.utils import get_upload_folder

    if not path:
        raise app_error(f"{field}: upload a .json or .json.gz Chrome trace")
    resolved = Path(path).resolve()
    uploaded = resolved.is_file() and resolved.is_relative_to(Path(get_upload_folder()).resolve())
    if not (uploaded or store().owns(resolved)):
        raise app_error(f"{field}: only files uploaded to this app or produced by it can be used")
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


def _session(request: gr.Request | None) -> str | None:
    """The caller's session, which keeps its runs apart from other sessions' in the worker."""
    return getattr(request, "session_hash", None) if request is not None else None


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
        raise app_error(str(exc)) from None


def _while_running(
    outputs: int, work: Callable[..., Any], /, *args: Any, caller: str | None = None, **kwargs: Any
) -> Generator[Any, None, Any]:
    """`work(*args, cancelled=..., **kwargs)` in a thread, on behalf of `caller` (a session: runs keep
    sessions apart, see `worker.called_by`); yields "no change" to the handler's `outputs` outputs every
    second meanwhile, and returns its result.

    Why a generator: Gradio closes a generator handler at its next yield when the client leaves
    (a plain handler runs to the end), which sets `cancelled` and kills the run's worker process.
    """
    from profiling.worker import called_by, until_closed

    tick = tuple(gr.skip() for _ in range(outputs))
    with _user_errors():
        return (yield from until_closed(called_by, caller, work, *args, tick=tick, **kwargs))


# ---------------------------------------------------------------- endpoints


RUN_DOC = """
        mode: inference (forward only) or training (forward and backward).
        kv_heads: key/value heads for grouped-query attention; 0 means heads (plain multi-head).
        q_len: queries per call; 0 means seq_len. 1 with a long seq_len is KV-cache decode.
        mask: causal (bottom-right aligned), causal_top_left (is_causal's alignment), none, sliding_window, padding.
        window: for sliding_window, how many keys each query sees.
        valid_len: for padding, one length or a comma list of one per batch row."""


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
    mode: str = "inference",
    kv_heads: float = 0,
    q_len: float = 0,
    mask: str = "causal",
    window: float = 0,
    valid_len: str = "",
    progress: gr.Progress = gr.Progress(),
    request: gr.Request | None = None,
) -> Generator[tuple, None, None]:
    """Profile one attention variant with torch.profiler.

    Args:
        variant: naive, inplace, sdpa, flex or hub_flash.
        backend: the SDPA backend (auto, math, flash, efficient, cudnn); ignored by other variants.
        batch: batch size.
        heads: query heads.
        seq_len: key/value length.
        head_dim: size of each head.
        dtype: float32, bfloat16 or float16.
        device: auto, cpu or cuda.
        compile: wrap the attention in torch.compile.{RUN_DOC}

    Returns the summary, op table, timeline, trace file, kernel table, key_averages file and insights.
    """
    from profiling.charts import timeline
    from profiling.markdown import insights_markdown
    from profiling.pipeline import profile_attention
    from profiling.tables import rounded

    spec = _spec(**_fields(locals()))
    result = yield from _while_running(
        PROFILE_OUTPUTS,
        profile_attention,
        *(spec, store().new_dir(), _progress(progress), RUN_TIME_LIMIT_S),
        caller=_session(request),
    )
    yield (
        dict(result.summary),
        rounded(result.op_table),
        timeline(result.analysis),
        str(result.trace_path),
        rounded(result.kernel_table),
        str(result.table_path),
        insights_markdown(result.insights),
    )


SPEC_FIELDS = (
    *("variant", "backend", "batch", "heads", "seq_len", "head_dim", "dtype", "device", "compile"),
    *("mode", "kv_heads", "q_len", "mask", "window", "valid_len"),
)


def _fields(values: dict[str, Any]) -> dict[str, Any]:
    """The spec's fields among a handler's arguments."""
    return {name: values[name] for name in SPEC_FIELDS if name in values}


@on_gpu(_compare_seconds)
def compare(
    batch: float,
    heads: float,
    seq_len: float,
    head_dim: float,
    dtype: str,
    device: str,
    compile: bool,
    mode: str = "inference",
    kv_heads: float = 0,
    q_len: float = 0,
    mask: str = "causal",
    window: float = 0,
    valid_len: str = "",
    progress: gr.Progress = gr.Progress(),
    request: gr.Request | None = None,
) -> Generator[tuple, None, None]:
    """Every variant and SDPA backend on one shape, within one time limit.

    Args:
        batch: batch size.
        heads: query heads.
        seq_len: key/value length.
        head_dim: size of each head.
        dtype: float32, bfloat16 or float16.
        device: auto, cpu or cuda.
        compile: wrap the attention in torch.compile.{RUN_DOC}

    Returns the summaries (a run that cannot run here carries `error`), a table and a chart.
    """
    from profiling.charts import compare_chart
    from profiling.compare import compare as compare_all
    from profiling.compare import compare_table

    spec = _spec(**_fields(locals()))
    rows = yield from _while_running(
        COMPARE_OUTPUTS,
        compare_all,
        *(spec, store().new_dir(), _progress(progress)),
        time_limit_s=RUN_TIME_LIMIT_S,
        caller=_session(request),
    )
    yield rows, compare_table(rows), compare_chart(rows)


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
    mode: str = "inference",
    kv_heads: float = 0,
    q_len: float = 0,
    mask: str = "causal",
    window: float = 0,
    valid_len: str = "",
    progress: gr.Progress = gr.Progress(),
    request: gr.Request | None = None,
) -> Generator[tuple, None, None]:
    """Forward time and peak memory of each variant over a list of seq_len values, within one time limit.

    The other parameters hold for the whole sweep: a decode sweep is q_len=1 over a list of KV lengths.

    Args:
        variants: runs to sweep, e.g. ["naive", "sdpa-math", "sdpa-flash"].
        seq_lens: comma list of key/value lengths, e.g. "128,256,512".
        batch: batch size.
        heads: query heads.
        head_dim: size of each head.
        dtype: float32, bfloat16 or float16.
        device: auto, cpu or cuda.
        compile: wrap the attention in torch.compile.{RUN_DOC}

    Returns the points (status ok or stopped, with the reason) and a chart.
    """
    from attention import parse_runs, parse_seq_lens
    from profiling.charts import sweep_chart
    from profiling.sweep import sweep as run_sweep

    if not isinstance(variants, list) or not all(isinstance(v, str) for v in variants):
        raise app_error('variants: give a list of run names, e.g. ["naive", "sdpa-flash"]')
    with _user_errors():
        runs, lengths = parse_runs(",".join(variants)), parse_seq_lens(str(seq_lens))
    fields = _fields(locals())
    spec = _spec(**fields, variant=runs[0][0], backend=runs[0][1], seq_len=max(lengths))
    rows = yield from _while_running(
        SWEEP_OUTPUTS,
        run_sweep,
        *(spec, runs, lengths, store().new_dir(), _progress(progress)),
        time_limit_s=RUN_TIME_LIMIT_S,
        caller=_session(request),
    )
    yield rows, sweep_chart(rows)


for _handler in (profile, compare, sweep):
    _handler.__doc__ = (_handler.__doc__ or "").replace("{RUN_DOC}", RUN_DOC)


def analyze(trace: str | None, progress: gr.Progress = gr.Progress()) -> Generator[tuple, None, None]:
    """Analyze an uploaded torch.profiler Chrome trace.

    Args:
        trace: a .json or .json.gz Chrome trace from torch.profiler (CUDA, ROCm or CPU).

    Returns the summary, op table, kernel table, timeline, steps, annotations, insights and steps chart.
    """
    from gradio.components.plot import PlotData

    from profiling.uploads import analyze_time_limit_s, analyze_upload

    path = _app_file(trace, "trace")
    shown = yield from _while_running(
        ANALYZE_OUTPUTS, analyze_upload, path, analyze_time_limit_s(), _progress(progress)
    )
    yield (
        shown.summary,
        shown.op_table,
        shown.kernel_table,
        PlotData(type="plotly", plot=shown.timeline_json),
        shown.steps,
        shown.annotations,
        shown.insights_markdown,
        PlotData(type="plotly", plot=shown.steps_chart_json),
    )


def diff_traces(
    before: str | None, after: str | None, progress: gr.Progress = gr.Progress()
) -> Generator[tuple, None, None]:
    """What changed between two uploaded torch.profiler Chrome traces of one job.

    Args:
        before: a .json or .json.gz Chrome trace from torch.profiler.
        after: another trace of the same job, after the change.

    Returns the diff (ops and kernels added, removed and changed with Δ and Δ%, the step breakdown, the GPU
    metrics and the largest growths; times in µs) and the same as a plain-text table.
    """
    from profiling.trace_diff import diff_text, diff_uploads
    from profiling.uploads import analyze_time_limit_s

    paths = _app_file(before, "before"), _app_file(after, "after")
    found = yield from _while_running(
        DIFF_TRACES_OUTPUTS, diff_uploads, *paths, analyze_time_limit_s(), _progress(progress)
    )
    yield found, "\n".join(diff_text(found))


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
        raise app_error(str(exc)) from None


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
        raise app_error("trace: there is no trace to share yet; profile or analyze one first")
    path = _app_file(trace, "trace")
    with _user_errors():
        links = share_trace(path, repo_id, secret)
    return links, f"[Open in Perfetto]({links['perfetto_url']}) · [file]({links['url']})\n\n{links['note']}"
