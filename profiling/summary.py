"""The summaries: the public contract of `/profile`, `/compare`, `/analyze` and the CLI.

`RunSummary` and `TraceSummary` are the one definition of their keys. Keys are added, never
renamed; `SUMMARY_KEYS` and `ANALYZE_KEYS` are the ones the README promises first.
"""

from __future__ import annotations

from typing import Any, TypedDict

import pandas as pd

from profiling.gpu_metrics import gpu_metrics
from profiling.idle_time import idle_time
from profiling.insights import Insight
from profiling.roofline import roofline
from profiling.runner import Measurement
from profiling.step_breakdown import StepBreakdown
from profiling.trace import Trace
from profiling.windows import WindowStats

HIDDEN_COPY = "hidden_copy"  # the insight rule whose evidence gives copied_bytes_per_forward


class RunSummary(TypedDict):
    """One profiled run."""

    variant: str
    backend: str
    device: str
    device_name: str
    dtype: str
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    torch_version: str
    forward_cpu_ms: float
    forward_device_ms: float | None  # null on CPU
    self_cpu_total_ms: float
    self_device_total_ms: float | None  # null on CPU
    kernels_per_forward: float
    ops_per_forward: float
    peak_memory_bytes: int
    max_abs_error: float
    insights: list[str]
    compile: bool
    forwards: int
    forward_unprofiled_ms: float
    flops_per_forward: int
    achieved_tflops: float
    peak_tflops: float
    peak_source: str
    percent_of_peak: float | None
    score_matrix_bytes: int
    copied_bytes_per_forward: float
    per_forward_ops: dict[str, float]
    per_forward_kernels: dict[str, float]


class TraceSummary(TypedDict):
    """One analysed trace (an upload, or one of our own)."""

    events: int
    kernel_events: int
    kernel_time_us: float
    devices: list[str]
    insights: list[str]
    source: str
    gpu_activity_events: int
    skipped_events: int
    profiler_steps: int
    annotations: int
    forwards: int
    kernels_per_forward: float | None
    ops_per_forward: float | None
    # GPU metrics by the TensorBoard plugin's definitions (profiling/gpu_metrics.py); null without evidence.
    gpu_utilization_percent: float | None
    sm_efficiency_percent: float | None
    achieved_occupancy_percent: float | None
    tensor_core_time_percent: float | None
    gpu_name: str | None
    gpu_memory_bytes: int | None
    compute_capability: str | None
    sm_count: int | None
    gpus: list[dict[str, Any]]
    # Steps by the plugin's rules (profiling/step_breakdown.py), idle time by HTA's (profiling/idle_time.py).
    average_step_time_us: float | None
    step_breakdown_us: dict[str, float] | None
    idle_time_us: float | None
    idle_breakdown_us: dict[str, dict[str, float]] | None


SUMMARY_KEYS: tuple[str, ...] = (
    *("variant", "backend", "device", "device_name", "dtype", "batch", "heads", "seq_len", "head_dim"),
    *("torch_version", "forward_cpu_ms", "forward_device_ms", "self_cpu_total_ms", "self_device_total_ms"),
    *("kernels_per_forward", "ops_per_forward", "peak_memory_bytes", "max_abs_error", "insights"),
)
ANALYZE_KEYS: tuple[str, ...] = ("events", "kernel_events", "kernel_time_us", "devices", "insights")
TIME_DIGITS = 4


def _ms(value: float | None) -> float | None:
    return round(value, TIME_DIGITS) if value is not None else None


def run_summary(
    run: Measurement, trace: Trace, forwards: WindowStats, op_table: pd.DataFrame, insights: list[Insight]
) -> RunSummary:
    """The summary of one of our runs, from what it measured and what its trace shows.

    `self_device_total_ms` is all the GPU activity (kernels, memcpy, memset) in the profiled steps.
    """
    spec = run.spec
    on_cuda = spec.device == "cuda"
    # Throughput from the truest time there is: the device's; on the CPU, the unprofiled one.
    seconds = (forwards.device_ms if on_cuda and forwards.device_ms else run.unprofiled_ms) / 1e3
    fused = forwards.kernels_per_window <= 1 and forwards.count > 0
    device_us = float(trace.gpu_activity["dur"].sum()) if on_cuda else None
    return RunSummary(
        variant=spec.variant,
        backend=spec.backend,
        device=spec.device,
        device_name=run.device_name,
        dtype=spec.dtype,
        batch=spec.batch,
        heads=spec.heads,
        seq_len=spec.seq_len,
        head_dim=spec.head_dim,
        torch_version=run.torch_version,
        forward_cpu_ms=round(forwards.cpu_ms, TIME_DIGITS),
        forward_device_ms=_ms(forwards.device_ms) if on_cuda else None,
        self_cpu_total_ms=round(float(op_table["self cpu (us)"].sum()) / 1e3, TIME_DIGITS),
        self_device_total_ms=_ms(device_us / 1e3) if device_us is not None else None,
        kernels_per_forward=forwards.kernels_per_window,
        ops_per_forward=forwards.ops_per_window,
        peak_memory_bytes=forwards.peak_memory_bytes,
        max_abs_error=run.max_abs_error,
        insights=[i.text for i in insights],
        compile=spec.compile,
        forwards=forwards.count,
        forward_unprofiled_ms=round(run.unprofiled_ms, TIME_DIGITS),
        flops_per_forward=spec.flops(),
        **roofline(spec.flops(), spec.score_bytes(), fused, seconds, run.peak_tflops, run.peak_source),
        copied_bytes_per_forward=next(
            (i.evidence.get("bytes_per_forward", 0) for i in insights if i.rule == HIDDEN_COPY), 0
        ),
        per_forward_ops=per_window_counts(forwards.ops["name"], forwards.count),
        per_forward_kernels=per_window_counts(
            (forwards.gpu if on_cuda else forwards.compute_ops)["name"], forwards.count
        ),
    )


def trace_summary(
    trace: Trace,
    forwards: WindowStats | None,
    steps: int,
    annotations: int,
    insights: list[Insight],
    breakdown: StepBreakdown,
) -> TraceSummary:
    """The summary of any trace: what it holds, its GPU metrics, steps and idle time, and its forwards."""
    kernels = trace.kernels
    return TraceSummary(
        events=len(trace.events),
        kernel_events=len(kernels),
        kernel_time_us=float(kernels["dur"].sum()),
        devices=trace.devices,
        insights=[i.text for i in insights],
        source=trace.source,
        gpu_activity_events=len(trace.gpu_activity),
        skipped_events=int(trace.skipped),
        profiler_steps=steps,
        annotations=annotations,
        forwards=forwards.count if forwards else 0,
        kernels_per_forward=forwards.kernels_per_window if forwards else None,
        ops_per_forward=forwards.ops_per_window if forwards else None,
        **gpu_metrics(trace),
        average_step_time_us=breakdown.average_step_time_us,
        step_breakdown_us=breakdown.breakdown_us or None,
        **idle_time(trace),
    )


def per_window_counts(names: pd.Series, windows: int) -> dict[str, float]:
    """Per-window count of each name: what `/diff` compares between two runs."""
    if not windows:
        return {}
    return {str(k): round(v / windows, 3) for k, v in names.value_counts().items()}
