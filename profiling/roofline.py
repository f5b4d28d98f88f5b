"""How close a forward came to the device's peak: causal-aware FLOPs and bytes.

`torch.profiler`'s `with_flops` does not count SDPA, so FLOPs come from the spec. Peaks are
the vendors' dense bf16/fp16 tensor-core numbers; elsewhere (a CPU, an unknown GPU) the
yardstick is a large matmul measured on the same device in the same process.
"""

from __future__ import annotations

import functools

import torch
import torch.utils.benchmark as benchmark

# Dense (no sparsity) TFLOP/s for bf16/fp16 on tensor cores; FP32 on CUDA cores.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},
    "H100": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
    "L4": {"bfloat16": 121.0, "float16": 121.0, "float32": 30.3},
    "A10G": {"bfloat16": 70.0, "float16": 70.0, "float32": 35.0},
    "T4": {"bfloat16": 65.0, "float16": 65.0, "float32": 8.1},
}
MATMUL_SIZE = {"cpu": 1024, "cuda": 8192}


def known_peak_tflops(device_name: str, dtype: str) -> float | None:
    for gpu, peaks in PEAK_TFLOPS.items():
        if gpu in device_name:
            # T4 has no bf16 tensor cores; its fp16 peak is the honest yardstick for both.
            return peaks.get(dtype)
    return None


@functools.lru_cache(maxsize=8)
def matmul_tflops(device: str, dtype: str) -> float:
    """TFLOP/s of one large square matmul here, measured once per process and device/dtype."""
    n = MATMUL_SIZE.get(device, 1024)
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(n, n, device=device, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, dtype=torch_dtype)
    timer = benchmark.Timer("a @ b", globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
    seconds = timer.blocked_autorange(min_run_time=0.2).median
    return 2 * n**3 / seconds / 1e12


def roofline(
    flops: int, score_bytes: int, fused: bool, seconds: float, device: str, device_name: str, dtype: str
) -> dict:
    """Achieved TFLOP/s and its share of the device's peak (known, or a measured matmul)."""
    achieved = flops / seconds / 1e12 if seconds > 0 else 0.0
    peak = known_peak_tflops(device_name, dtype) if device == "cuda" else None
    source = "vendor peak"
    if peak is None:
        peak, source = matmul_tflops(device, dtype), f"measured {MATMUL_SIZE.get(device, 1024)}² matmul"
    return {
        "achieved_tflops": round(achieved, 4),
        "peak_tflops": round(peak, 3),
        "peak_source": source,
        "percent_of_peak": round(100 * achieved / peak, 2) if peak else None,
        # A materialised score matrix is written then read at least once; a fused kernel keeps it on chip.
        "score_matrix_bytes": 0 if fused else 2 * score_bytes,
    }
