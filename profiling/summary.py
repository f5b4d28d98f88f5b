"""The summary dict: the public contract of `/profile` and the CLI (keys never renamed)."""

from __future__ import annotations

import platform
from typing import Any

import torch

from attention import AttentionSpec
from profiling.insights import Insight
from profiling.roofline import roofline
from profiling.windows import WindowStats

RUN_KEYS = (
    "variant",
    "backend",
    "device",
    "device_name",
    "dtype",
    "batch",
    "heads",
    "seq_len",
    "head_dim",
    "torch_version",
)
TIME_KEYS = ("forward_cpu_ms", "forward_device_ms", "self_cpu_total_ms", "self_device_total_ms")
CHECK_KEYS = ("kernels_per_forward", "ops_per_forward", "peak_memory_bytes", "max_abs_error", "insights")
SUMMARY_KEYS = RUN_KEYS + TIME_KEYS + CHECK_KEYS
ANALYZE_KEYS = ("events", "kernel_events", "kernel_time_us", "devices", "insights")


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        model = ""
    return model or platform.processor() or platform.machine() or "cpu"


def build_summary(
    spec: AttentionSpec,
    forwards: WindowStats,
    averages: Any,
    max_abs_error: float,
    insights: list[Insight],
    unprofiled_ms: float | None = None,
) -> dict[str, Any]:
    on_cuda = spec.device == "cuda"
    self_cpu_us = sum(e.self_cpu_time_total for e in averages)
    self_device_us = sum(e.self_device_time_total for e in averages)
    # Throughput from the truest time there is: the device's; on the CPU, the unprofiled one.
    seconds = (forwards.device_ms or unprofiled_ms or forwards.cpu_ms) / 1e3
    name = device_name(spec.device)
    fused = forwards.kernels_per_window <= 1 and forwards.count > 0
    return {
        "variant": spec.variant,
        "backend": spec.backend,
        "device": spec.device,
        "device_name": name,
        "dtype": spec.dtype,
        "batch": spec.batch,
        "heads": spec.heads,
        "seq_len": spec.seq_len,
        "head_dim": spec.head_dim,
        "compile": spec.compile,
        "torch_version": torch.__version__,
        "forwards": forwards.count,
        "forward_cpu_ms": round(forwards.cpu_ms, 4),
        "forward_device_ms": round(forwards.device_ms, 4) if on_cuda and forwards.device_ms is not None else None,
        "forward_unprofiled_ms": round(unprofiled_ms, 4) if unprofiled_ms is not None else None,
        "self_cpu_total_ms": round(self_cpu_us / 1e3, 4),
        "self_device_total_ms": round(self_device_us / 1e3, 4) if on_cuda else None,
        "kernels_per_forward": forwards.kernels_per_window,
        "ops_per_forward": forwards.ops_per_window,
        "peak_memory_bytes": forwards.peak_memory_bytes,
        "max_abs_error": max_abs_error,
        "flops_per_forward": spec.flops(),
        **roofline(spec.flops(), spec.score_bytes(), fused, seconds, spec.device, name, spec.dtype),
        "per_forward_ops": _counts(forwards.ops["name"], forwards.count),
        "per_forward_kernels": _counts((forwards.gpu if on_cuda else forwards.compute_ops)["name"], forwards.count),
        "copied_bytes_per_forward": next(
            (i.evidence.get("bytes_per_forward", 0) for i in insights if i.rule == "hidden_copy"), 0
        ),
        "insights": [i.text for i in insights],
    }


def _counts(names: Any, forwards: int) -> dict[str, float]:
    """Per-forward count of each name: what `/diff` compares between two runs."""
    if not forwards:
        return {}
    return {str(k): round(v / forwards, 3) for k, v in names.value_counts().items()}
