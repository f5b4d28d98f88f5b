"""Compact endpoints for agents: /profile_summary, /compare_summary and /analyze_summary.

Each runs what /profile, /compare or /analyze runs (the same pipeline, guards, time limits, ZeroGPU
duration and cancellation) and returns one string: `json.dumps({...}, allow_nan=False)` of the summary
and its findings as records, with no tables or charts. One string because Gradio's MCP server sends
each output as `str(output)`: a dict would reach an agent as a Python repr.

A result fits in MAX_RESULT_BYTES. Where the whole would not, the findings' evidence, then their
detail, then the summary's lists and maps are left out, level by level (`LEVELS`), and `cut` says what
went; the full endpoint still has all of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

import gradio as gr

from endpoints import common
from endpoints.common import app_file, on_gpu, progress_of, session_of, spec_of, store, while_running
from endpoints.runs import _compare_seconds, _fields, _profile_seconds, document_params

MAX_RESULT_BYTES = 20_000  # of the UTF-8 JSON: what an agent's context should take for one call
UNITS = (
    "Units are in the key names: _ms milliseconds, _us microseconds, _bytes bytes, _percent percent "
    "(0 to 100), _tflops 10^12 FLOP/s, _gbps 10^9 bytes/s; null means unknown or not measured here."
)


@dataclass(frozen=True)
class Level:
    """How much of a summary a result keeps: a level is tried only where the one before did not fit."""

    items: int | None  # items kept of each list or map in the summary (None: all)
    chars: int | None  # characters kept of each string in the summary
    finding: str  # what each finding keeps: "evidence" (whole), "detail", "title", or "none" (no findings)
    detail_chars: int | None  # characters kept of a finding's detail
    keys: str  # the summary's keys kept: "all", "scalars" (no lists or maps) or "core" (CORE_KEYS)
    note: str | None  # what `cut` says was left out


LEVELS = (
    Level(None, None, "evidence", None, "all", None),
    Level(None, None, "detail", None, "all", "the findings' evidence"),
    Level(8, 120, "detail", 240, "all", "the findings' evidence and the end of their detail, of lists, maps and text"),
    Level(None, 120, "title", None, "scalars", "the findings' detail and evidence, and the summary's lists and maps"),
    Level(None, 120, "none", None, "core", "the findings and every summary key but the documented ones"),
)
# The keys the README documents (summary.SUMMARY_KEYS, ANALYZE_KEYS) and a comparison's own: what the
# last level keeps. Small by construction: a few dozen scalars per summary.
CORE_KEYS = (
    *("variant", "backend", "device", "device_name", "dtype", "batch", "heads", "seq_len", "head_dim"),
    *("mode", "kv_heads", "q_len", "mask", "window", "compile", "error", "backend_used", "torch_version"),
    *("forward_cpu_ms", "forward_device_ms", "forward_unprofiled_ms", "self_cpu_total_ms", "self_device_total_ms"),
    *("kernels_per_forward", "ops_per_forward", "peak_memory_bytes", "max_abs_error"),
    *("speedup", "speedup_status", "events", "kernel_events", "kernel_time_us", "devices"),
)
# Left out at every level: `insights` repeats `findings` as text, and a timing's raw samples (its n,
# median, p25, p75, min, max and cv stay).
DROPPED = ("insights", "findings")
RAW_SAMPLES = "samples"


def _plain(value: Any, items: int | None = None, chars: int | None = None) -> Any:
    """`value` as JSON-native data: non-finite floats as None (allow_nan=False refuses them), tuples as
    lists, numpy scalars as numbers; lists and maps cut to `items`, strings to `chars` (None: whole)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if chars is None or len(value) <= chars else value[: chars - 1] + "…"
    if isinstance(value, Mapping):
        return {str(k): _plain(v, items, chars) for k, v in list(value.items())[:items]}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v, items, chars) for v in list(value)[:items]]
    return _plain(str(value), items, chars)


def _finding(record: Mapping[str, Any], level: Level) -> dict[str, Any]:
    """One finding (an `Insight.record()`) as `level` keeps it."""
    kept = {key: record.get(key) for key in ("rule", "title", "gpu_time_percent")}
    if level.finding in ("detail", "evidence"):
        kept["detail"] = _plain(record.get("detail"), chars=level.detail_chars)
    if level.finding == "evidence":
        kept["evidence"] = record.get("evidence", {})
    return _plain(kept)


def _kept(key: str, value: Any, level: Level) -> bool:
    if key in DROPPED:
        return False
    if level.keys == "core":
        return key in CORE_KEYS
    return level.keys == "all" or not isinstance(value, (Mapping, list, tuple))


def compact(summary: Mapping[str, Any], level: Level = LEVELS[0]) -> dict[str, Any]:
    """A summary as `level` keeps it: {"summary": its values, "findings": its findings as records}."""
    values = {key: _without_samples(value) for key, value in summary.items() if _kept(key, value, level)}
    findings = [] if level.finding == "none" else [_finding(f, level) for f in summary.get("findings") or []]
    return {
        "summary": {key: _plain(value, level.items, level.chars) for key, value in values.items()},
        "findings": findings,
    }


def _without_samples(value: Any) -> Any:
    return {k: v for k, v in value.items() if k != RAW_SAMPLES} if isinstance(value, Mapping) else value


def fitted(build: Callable[[Level], dict[str, Any]], limit: int = MAX_RESULT_BYTES) -> str:
    """The JSON of `build(level)` at the first level under `limit` bytes, with `cut` saying what was left
    out (null: nothing; the full endpoint has everything). The last level is small by construction."""
    for level in LEVELS:
        cut = f"left out to fit {limit:,} bytes: {level.note}" if level.note else None
        text = json.dumps({**build(level), "units": UNITS, "cut": cut}, allow_nan=False, ensure_ascii=False)
        if len(text.encode()) < limit:
            break
    return text


def summary_json(summary: Mapping[str, Any]) -> str:
    """A run's or a trace's summary and findings as compact JSON (see the module's docstring)."""
    return fitted(lambda level: compact(summary, level))


def compare_json(rows: list[Mapping[str, Any]], lesson: str) -> str:
    """The comparison's rows (each a compact summary and its findings) and its lesson, as compact JSON."""
    return fitted(lambda level: {"lesson": lesson, "runs": [compact(row, level) for row in rows]})


@on_gpu(_profile_seconds)
def profile_summary(
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
) -> Generator[Any, None, None]:
    """Profile one attention variant with torch.profiler, as /profile does; returns its summary as compact JSON.

    Returns one JSON string under 20,000 bytes: {"summary": {...}, "findings": [{rule, title, detail, evidence,
    gpu_time_percent}], "units": text, "cut": null or what was left out to fit}. The summary has
    kernels_per_forward, ops_per_forward, forward_cpu_ms, forward_device_ms (null on CPU), forward_ms_stats
    (the unprofiled loop: n, median, p25, p75 in ms), peak_memory_bytes, max_abs_error and more.

    Args:
        {PARAMS}

    """
    from profiling.pipeline import profile_attention

    spec = spec_of(**_fields(locals()))
    result = yield from while_running(
        1,
        profile_attention,
        *(spec, store().new_dir(), progress_of(progress), common.RUN_TIME_LIMIT_S),
        caller=session_of(request),
    )
    yield summary_json(dict(result.summary))


@on_gpu(_compare_seconds)
def compare_summary(
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
) -> Generator[Any, None, None]:
    """Every variant and SDPA backend on one shape within one time limit, as /compare does, as compact JSON.

    Returns one JSON string under 20,000 bytes: {"lesson": text, "runs": [{"summary": {...}, "findings":
    [...]}], "units": text, "cut": null or what was left out to fit}. A run that cannot run here has an `error`
    (why) in its summary; the others carry speedup (x, median naive time / median run time), speedup_ci and
    speedup_status (faster, slower, within noise, no samples).

    Args:
        {PARAMS}

    """
    from profiling.compare import compare as compare_all
    from profiling.compare import compare_lesson

    spec = spec_of(**_fields(locals()))
    rows = yield from while_running(
        1,
        compare_all,
        *(spec, store().new_dir(), progress_of(progress)),
        time_limit_s=common.RUN_TIME_LIMIT_S,
        caller=session_of(request),
    )
    yield compare_json(rows, compare_lesson(rows))


def analyze_summary(trace: str | None, progress: gr.Progress = gr.Progress()) -> Generator[Any, None, None]:
    """Analyze an uploaded torch.profiler Chrome trace, as /analyze does; returns its summary as compact JSON.

    Returns one JSON string under 20,000 bytes: {"summary": {...}, "findings": [{rule, title, detail, evidence,
    gpu_time_percent}], "units": text, "cut": null or what was left out to fit}. The summary has events,
    kernel_events, kernel_time_us, devices, gpu_utilization_percent, step_breakdown_us, idle_time_us and more
    (null where the trace has no evidence).

    Args:
        trace: a .json or .json.gz Chrome trace from torch.profiler (CUDA, ROCm or CPU), uploaded here first.

    """
    from profiling.uploads import analyze_time_limit_s, analyze_upload

    path = app_file(trace, "trace")
    shown = yield from while_running(1, analyze_upload, path, analyze_time_limit_s(), progress_of(progress))
    yield summary_json(shown.summary)


for _handler in (profile_summary, compare_summary):
    document_params(_handler)
