"""The endpoints that run attention: /profile, /compare and /sweep."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import gradio as gr

from endpoints import common
from endpoints.common import (
    COMPARE_OUTPUTS,
    PROFILE_OUTPUTS,
    SWEEP_OUTPUTS,
    app_error,
    gpu_seconds,
    on_gpu,
    progress_of,
    session_of,
    spec_of,
    store,
    user_errors,
    while_running,
)


def _profile_seconds(*args: Any, **kwargs: Any) -> int:
    return gpu_seconds(1)


def _compare_seconds(*args: Any, **kwargs: Any) -> int:
    from attention import RUNS

    return gpu_seconds(len(RUNS))


def _sweep_seconds(variants: list[str] | None = None, seq_lens: str = "", *args: Any, **kwargs: Any) -> int:
    return gpu_seconds(max(1, len(variants or [])) * max(1, str(seq_lens).count(",") + 1))


# Each run parameter's description, in one place: `document_params` writes the Args lines of every
# handler that takes them (Gradio reads them into the API's and the MCP tools' parameter descriptions).
PARAM_DOC = {
    "variant": "naive, inplace, sdpa, flex or hub_flash.",
    "backend": "the SDPA backend (auto, math, flash, efficient, cudnn); ignored by other variants.",
    "batch": "batch size.",
    "heads": "query heads.",
    "seq_len": "key/value length.",
    "head_dim": "size of each head.",
    "dtype": "float32, bfloat16 or float16.",
    "device": "auto (a GPU if the server has one), cpu, or cuda (GPU servers only: see the enum); a GPU adds kernels.",
    "compile": "wrap the attention in torch.compile.",
    "mode": "inference (forward only) or training (forward and backward).",
    "kv_heads": "key/value heads for grouped-query attention; 0 means heads (plain multi-head).",
    "q_len": "queries per call; 0 means seq_len. 1 with a long seq_len is KV-cache decode.",
    "mask": "causal (bottom-right aligned), causal_top_left (is_causal's alignment), none, sliding_window, padding.",
    "window": "for sliding_window, how many keys each query sees.",
    "valid_len": "for padding, one length or a comma list of one per batch row.",
}
PARAMS = "{PARAMS}"  # where a handler's docstring takes its Args lines for the parameters above


def document_params(handler: Any) -> None:
    """Write, in place of PARAMS in `handler`'s docstring, an Args line for each of its PARAM_DOC parameters."""
    import inspect

    names = [name for name in inspect.signature(handler).parameters if name in PARAM_DOC]
    lines = "\n".join(f"        {name}: {PARAM_DOC[name]}" for name in names)
    handler.__doc__ = (handler.__doc__ or "").replace(PARAMS, lines.lstrip())


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

    Returns 7 outputs: the summary (a dict: times in ms, memory in bytes, kernels_per_forward and
    ops_per_forward per forward, findings as records), the op table (times in µs), the timeline (a Plotly
    figure), the trace file (a Chrome trace JSON), the kernel table (times in µs), the key_averages file
    (text, times as torch prints them) and the insights (escaped Markdown). For agents, /profile_summary
    returns the summary and findings alone, as compact JSON.

    Args:
        {PARAMS}
    """
    from profiling.charts import timeline
    from profiling.markdown import insights_markdown
    from profiling.pipeline import profile_attention
    from profiling.progress_text import Stopwatch, refreshed
    from profiling.tables import rounded

    spec = spec_of(**_fields(locals()))
    # The page shows the stage, the seconds so far and the estimate, refreshed at each tick (progress_text.py).
    stopwatch = Stopwatch(progress_of(progress), _estimate_s(spec))
    running = while_running(
        PROFILE_OUTPUTS,
        profile_attention,
        *(spec, store().new_dir(), stopwatch, common.RUN_TIME_LIMIT_S),
        caller=session_of(request),
    )
    result = yield from refreshed(running, stopwatch.refresh)
    yield (
        dict(result.summary),
        rounded(result.op_table),
        timeline(result.analysis),
        str(result.trace_path),
        rounded(result.kernel_table),
        str(result.table_path),
        insights_markdown(result.insights),
    )


def _estimate_s(spec: Any) -> float | None:
    """The run's estimated seconds for the progress line, or None where it cannot be made (a spec the run will
    refuse, as cuda on a machine without it: the run itself then names the field)."""
    from profiling.run_time import estimate_run_time

    try:
        return estimate_run_time(spec).seconds
    except Exception:  # advisory only: the run's own checks report what is wrong
        return None


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

    Returns 3 outputs: the summaries (a list of /profile's summary dicts, one per variant and backend, each
    with speedup, the ratio of naive's median forward time to its own; a run that cannot run here carries
    `error`, the reason), the side-by-side table (times in ms, memory in MiB) and a Plotly chart. For agents,
    /compare_summary returns the summaries alone, as compact JSON.

    Args:
        {PARAMS}
    """
    from profiling.charts import compare_chart
    from profiling.compare import compare as compare_all
    from profiling.compare import compare_table

    spec = spec_of(**_fields(locals()))
    rows = yield from while_running(
        COMPARE_OUTPUTS,
        compare_all,
        *(spec, store().new_dir(), progress_of(progress)),
        time_limit_s=common.RUN_TIME_LIMIT_S,
        caller=session_of(request),
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
    Returns 2 outputs: the points (a list of dicts: run, seq_len, status ok or stopped with its reason,
    forward_ms with its p25 and p75 in ms, peak memory in bytes) and a Plotly chart.

    Args:
        variants: runs to sweep, e.g. ["naive", "sdpa-math", "sdpa-flash"].
        seq_lens: comma list of key/value lengths, e.g. "128,256,512".
        {PARAMS}
    """
    from attention import parse_runs, parse_seq_lens
    from profiling.charts import sweep_chart
    from profiling.sweep import sweep as run_sweep

    if not isinstance(variants, list) or not all(isinstance(v, str) for v in variants):
        raise app_error('variants: give a list of run names, e.g. ["naive", "sdpa-flash"]')
    with user_errors():
        runs, lengths = parse_runs(",".join(variants)), parse_seq_lens(str(seq_lens))
    fields = _fields(locals())
    spec = spec_of(**fields, variant=runs[0][0], backend=runs[0][1], seq_len=max(lengths))
    rows = yield from while_running(
        SWEEP_OUTPUTS,
        run_sweep,
        *(spec, runs, lengths, store().new_dir(), progress_of(progress)),
        time_limit_s=common.RUN_TIME_LIMIT_S,
        caller=session_of(request),
    )
    yield rows, sweep_chart(rows)


for _handler in (profile, compare, sweep):
    document_params(_handler)
