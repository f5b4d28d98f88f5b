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

    spec = spec_of(**_fields(locals()))
    result = yield from while_running(
        PROFILE_OUTPUTS,
        profile_attention,
        *(spec, store().new_dir(), progress_of(progress), common.RUN_TIME_LIMIT_S),
        caller=session_of(request),
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
    _handler.__doc__ = (_handler.__doc__ or "").replace("{RUN_DOC}", RUN_DOC)
