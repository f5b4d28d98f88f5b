"""The summaries: the public contract of `/profile`, `/compare`, `/analyze` and the CLI.

`RunSummary` and `TraceSummary` are the one definition of their keys. Keys are added, never
renamed; `SUMMARY_KEYS` and `ANALYZE_KEYS` are the ones the README promises first.
"""

from __future__ import annotations

from typing import Any, TypedDict

import pandas as pd

from attention import AttentionSpec
from profiling.attention_found import attention_keys
from profiling.backend_used import backend_used
from profiling.communication import communication_summary
from profiling.gpu_metrics import gpu_metrics
from profiling.idle_time import idle_time
from profiling.insights import copied_bytes_per_window
from profiling.kernels import decoded_kernel_time_percent
from profiling.roofline import memory_roofline, roofline
from profiling.runner import Measurement
from profiling.step_breakdown import StepBreakdown, steps_source
from profiling.timing import TimingStats
from profiling.trace import Trace
from profiling.windows import WindowStats


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
    findings: list[dict[str, Any]]  # the insights as records: rule, title, detail, evidence, gpu_time_percent
    forwards: int
    forward_unprofiled_ms: float  # the median of forward_ms_stats
    # The unprofiled wall-clock loop (profiling/timing.py): n, median, p25, p75, min, max, cv, noisy, samples.
    forward_ms_stats: dict[str, Any] | None
    flops_per_forward: int
    achieved_tflops: float
    peak_tflops: float
    peak_source: str
    percent_of_peak: float | None
    score_matrix_bytes: int
    copied_bytes_per_forward: float
    per_forward_ops: dict[str, float]
    per_forward_kernels: dict[str, float]
    # The run's other parameters, echoed.
    mode: str
    kv_heads: int
    q_len: int
    mask: str
    window: int
    valid_len: list[int]
    # Which SDPA backend ran (read from the trace), and why the others would refuse this call.
    backend_used: str | None
    backend_reasons: dict[str, str]
    # The spec's first forward in a process, before warm-up, apart from the steady state.
    first_call_ms: float
    first_call_fresh: bool
    first_call_cause: str | None
    # Training mode (null in inference).
    backward_cpu_ms: float | None
    backward_device_ms: float | None
    step_unprofiled_ms: float | None  # forward median plus backward median
    backward_ms_stats: dict[str, Any] | None  # the backward timed alone, an untimed forward before each
    backward_unprofiled_ms: float | None  # its median
    kernels_per_backward: float | None
    per_backward_kernels: dict[str, float] | None
    saved_for_backward_bytes: int | None
    peak_memory_backward_bytes: int | None
    backward_flops: int | None
    backward_tflops: float | None
    max_abs_grad_error: float | None
    decoded_kernel_time_percent: float | None  # null on CPU runs (no kernels)
    # Attention found in the trace's kernels (profiling/attention_found.py); null on CPU runs.
    attention_time_us: float | None
    attention_time_percent: float | None
    attention_kind: str | None  # fused, unfused, mixed or none
    # The memory roofline.
    bytes_moved: int
    achieved_gbps: float
    peak_gbps: float
    bandwidth_source: str
    arithmetic_intensity: float
    ridge_point: float
    roofline_bound: str


class TraceSummary(TypedDict):
    """One analysed trace (an upload, or one of our own)."""

    events: int
    kernel_events: int
    kernel_time_us: float
    devices: list[str]
    insights: list[str]
    source: str
    findings: list[dict[str, Any]]  # the insights as records: rule, title, detail, evidence, gpu_time_percent
    gpu_activity_events: int
    skipped_events: int
    profiler_steps: int  # steps in the steps table: the ProfilerSteps, or the plugin's step "0" without them
    steps_source: str | None  # "profiler_steps", "fallback" (step "0" over the host's ops), or null: no step
    annotations: int
    forwards: int
    kernels_per_forward: float | None
    ops_per_forward: float | None
    # GPU metrics by the TensorBoard plugin's definitions (profiling/gpu_metrics.py); null without evidence.
    gpu_utilization_percent: float | None
    sm_efficiency_percent: float | None
    achieved_occupancy_percent: float | None
    tensor_core_time_percent: float | None
    tensor_core_unknown_percent: float | None  # kernel time on an engine the decoder cannot tell: never read as "no"
    decoded_kernel_time_percent: float | None  # kernel time whose family the decoder knows (profiling/kernels.py)
    # Attention found in the trace's kernels (profiling/attention_found.py); null without kernels.
    attention_time_us: float | None
    attention_time_percent: float | None
    attention_kind: str | None  # fused, unfused, mixed or none
    # Collectives (profiling/communication.py): their share of kernel time and of the steps, and HTA's overlap.
    communication_time_percent: float | None
    communication_step_percent: float | None
    communication_overlap_percent: float | None
    gpu_name: str | None
    gpu_memory_bytes: int | None
    compute_capability: str | None  # null on AMD: Kineto writes HIP's major.minor there (9.4 is no Hopper)
    gpu_arch: str | None  # sm_90, gfx942, ...
    sm_count: int | None
    gpu_count: int  # GPUs that ran kernels; `gpus` lists at most gpu_metrics.MAX_LISTED_GPUS of them
    gpus: list[dict[str, Any]]
    # Steps by the plugin's rules (profiling/step_breakdown.py), idle time by HTA's (profiling/idle_time.py).
    average_step_time_us: float | None
    step_breakdown_us: dict[str, float] | None
    idle_time_us: float | None
    idle_breakdown_us: dict[str, dict[str, float]] | None


# The timings with their spread (issue 19): the unprofiled loop's statistics; backward's are null in inference.
TIMING_KEYS = ("forward_ms_stats", "backward_ms_stats", "forward_unprofiled_ms", "backward_unprofiled_ms")
SUMMARY_KEYS: tuple[str, ...] = (
    *("variant", "backend", "device", "device_name", "dtype", "batch", "heads", "seq_len", "head_dim"),
    *("torch_version", "forward_cpu_ms", "forward_device_ms", "self_cpu_total_ms", "self_device_total_ms"),
    *("kernels_per_forward", "ops_per_forward", "peak_memory_bytes", "max_abs_error", "insights"),
    *TIMING_KEYS,
)
ANALYZE_KEYS: tuple[str, ...] = ("events", "kernel_events", "kernel_time_us", "devices", "insights")
TIME_DIGITS = 4
RUN_FIELDS = (
    *("variant", "backend", "device", "dtype", "batch", "heads", "seq_len", "head_dim", "compile"),
    *("mode", "kv_heads", "q_len", "mask", "window", "valid_len"),
)
BACKWARD_KEYS = (
    *("backward_cpu_ms", "backward_device_ms", "step_unprofiled_ms", "kernels_per_backward", "per_backward_kernels"),
    *("peak_memory_backward_bytes", "backward_flops", "backward_tflops", "max_abs_grad_error"),
    *("saved_for_backward_bytes", "backward_ms_stats", "backward_unprofiled_ms"),
)
FIRST_CALL_NOTICE = 3.0  # a first call slower than this many steady forwards is worth a cause


def _ms(value: float | None) -> float | None:
    return round(value, TIME_DIGITS) if value is not None else None


def run_summary(
    run: Measurement,
    trace: Trace,
    forwards: WindowStats,
    backward: WindowStats | None,
    op_table: pd.DataFrame,
) -> RunSummary:
    """The summary of one of our runs, from what it measured and what its trace shows.

    `insights` is left empty: the insight rules read this summary, then fill it in.
    """
    spec = run.spec
    return RunSummary(
        **_run_keys(run),  # type: ignore[typeddict-item]
        **_forward_keys(run, trace, forwards, op_table),
        **_first_call_keys(run),
        **_backward_keys(run, forwards, backward),
        **attention_keys(trace),
        decoded_kernel_time_percent=decoded_kernel_time_percent(trace.kernels),
        insights=[],
        findings=[],
        backend_used=backend_used(forwards) if spec.variant == "sdpa" else None,
        backend_reasons=dict(run.backend_reasons),
    )


def _run_keys(run: Measurement) -> dict[str, Any]:
    spec = run.spec
    fields = spec.as_dict()
    return {
        **{key: fields[key] for key in RUN_FIELDS},
        "device_name": run.device_name,
        "torch_version": run.torch_version,
        "max_abs_error": run.max_abs_error,
        "forward_unprofiled_ms": round(run.unprofiled_ms, TIME_DIGITS),
        "forward_ms_stats": _stats(run.forward_stats),
        "flops_per_forward": spec.flops(),
        "peak_gbps": round(run.peak_gbps, 3),
        "bandwidth_source": run.bandwidth_source,
    }


def _stats(stats: TimingStats | None) -> dict[str, Any] | None:
    return stats.as_dict() if stats is not None else None


def _forward_keys(run: Measurement, trace: Trace, forwards: WindowStats, op_table: pd.DataFrame) -> dict[str, Any]:
    spec = run.spec
    on_cuda = spec.device == "cuda"
    # Throughput from the truest time there is: the device's; on the CPU, the unprofiled one.
    seconds = (forwards.device_ms if on_cuda and forwards.device_ms else run.unprofiled_ms) / 1e3
    fused = forwards.kernels_per_window <= 1 and forwards.count > 0
    device_us = float(trace.gpu_activity["dur"].sum()) if on_cuda else None
    return {
        "forwards": forwards.count,
        "forward_cpu_ms": round(forwards.cpu_ms, TIME_DIGITS),
        "forward_device_ms": _ms(forwards.device_ms) if on_cuda else None,
        # All the GPU activity (kernels, memcpy, memset) in the profiled steps.
        "self_device_total_ms": _ms(device_us / 1e3) if device_us is not None else None,
        "self_cpu_total_ms": round(float(op_table["self cpu (us)"].sum()) / 1e3, TIME_DIGITS),
        "kernels_per_forward": forwards.kernels_per_window,
        "ops_per_forward": forwards.ops_per_window,
        "peak_memory_bytes": forwards.peak_memory_bytes,
        "copied_bytes_per_forward": copied_bytes_per_window(forwards),
        "per_forward_ops": per_window_counts(forwards.ops["name"], forwards.count),
        "per_forward_kernels": per_window_counts(_kernels(forwards, on_cuda)["name"], forwards.count),
        **roofline(spec.flops(), spec.score_bytes(), fused, seconds, run.peak_tflops, run.peak_source),
        **memory_roofline(spec.flops(), spec.bytes_moved(), seconds, run.peak_tflops, run.peak_gbps),
    }


def _kernels(windows: WindowStats, on_cuda: bool) -> pd.DataFrame:
    """What counts as a kernel: GPU activity on CUDA, the leaf compute ops on the CPU."""
    return windows.gpu if on_cuda else windows.compute_ops


def _first_call_keys(run: Measurement) -> dict[str, Any]:
    spec = run.spec
    cold = run.first_call_ms > FIRST_CALL_NOTICE * run.unprofiled_ms
    return {
        "first_call_ms": round(run.first_call_ms, TIME_DIGITS),
        "first_call_fresh": run.first_call_fresh,
        "first_call_cause": first_call_cause(spec) if cold else None,
    }


def first_call_cause(spec: AttentionSpec) -> str:
    """What a cold first call pays for, from what the run does (the trace and timing say how much)."""
    if spec.compile:
        return "torch.compile: Dynamo traces the function and Inductor generates and compiles its kernels"
    if spec.device == "cuda" and spec.variant == "sdpa" and spec.backend == "cudnn":
        return "cuDNN builds its execution plan for this shape on the first call"
    if spec.device == "cuda":
        return "lazy initialisation: CUDA loads the kernels' modules and the caching allocator grows its pools"
    return "allocation: the first call's tensors are fresh pages the kernel has to fault in"


def _backward_keys(run: Measurement, forwards: WindowStats, backward: WindowStats | None) -> dict[str, Any]:
    spec = run.spec
    if not spec.training or backward is None:
        return dict.fromkeys(BACKWARD_KEYS)
    on_cuda = spec.device == "cuda"
    # The device's time where there is one; on the CPU, the backward timed alone without the profiler.
    unprofiled = run.backward_stats.median if run.backward_stats else None
    ms = (backward.device_ms if on_cuda else None) or unprofiled
    return {
        # What the forward left allocated for the backward: the output and the tensors autograd saved.
        "saved_for_backward_bytes": forwards.retained_bytes,
        "backward_cpu_ms": round(backward.cpu_ms, TIME_DIGITS),
        "backward_device_ms": _ms(backward.device_ms) if on_cuda else None,
        "step_unprofiled_ms": _ms(run.step_unprofiled_ms),
        "backward_ms_stats": _stats(run.backward_stats),
        "backward_unprofiled_ms": _ms(unprofiled),
        "kernels_per_backward": backward.kernels_per_window,
        "per_backward_kernels": per_window_counts(_kernels(backward, on_cuda)["name"], backward.count),
        "peak_memory_backward_bytes": backward.peak_memory_bytes,
        "backward_flops": spec.backward_flops(),
        "backward_tflops": round(spec.backward_flops() / ms / 1e9, 4) if ms and ms > 0 else None,
        "max_abs_grad_error": run.max_abs_grad_error,
    }


def trace_summary(
    trace: Trace, forwards: WindowStats | None, steps: int, annotations: int, breakdown: StepBreakdown
) -> TraceSummary:
    """The summary of any trace: what it holds, its GPU metrics, steps and idle time, and its forwards."""
    kernels = trace.kernels
    return TraceSummary(
        events=len(trace.events),
        kernel_events=len(kernels),
        kernel_time_us=float(kernels["dur"].sum()),
        devices=trace.devices,
        insights=[],  # filled in by the insight rules
        findings=[],
        source=trace.source,
        gpu_activity_events=len(trace.gpu_activity),
        skipped_events=int(trace.skipped),
        profiler_steps=steps,
        steps_source=steps_source(trace),
        annotations=annotations,
        forwards=forwards.count if forwards else 0,
        kernels_per_forward=forwards.kernels_per_window if forwards else None,
        ops_per_forward=forwards.ops_per_window if forwards else None,
        **gpu_metrics(trace),
        decoded_kernel_time_percent=decoded_kernel_time_percent(kernels),
        **attention_keys(trace),
        **communication_summary(trace),
        average_step_time_us=breakdown.average_step_time_us,
        step_breakdown_us=breakdown.breakdown_us or None,
        **idle_time(trace),
    )


def per_window_counts(names: pd.Series, windows: int) -> dict[str, float]:
    """Per-window count of each name: what `/diff` compares between two runs."""
    if not windows:
        return {}
    counts = names.value_counts()  # a categorical's counts hold every name of the trace, 0 where not in a window
    return {str(k): round(v / windows, 3) for k, v in counts[counts > 0].items()}
