"""How close a forward came to the device's peak: causal-aware FLOPs, and bytes moved.

`torch.profiler`'s `with_flops` does not count SDPA, so FLOPs come from the spec. Peaks are
the vendors' dense bf16/fp16 tensor-core numbers and HBM bandwidth; elsewhere (a CPU, an
unknown GPU) the yardsticks are a large matmul and a large copy measured on the same device
in the same process, as explicit steps of the run (`peak_tflops`, `peak_gbps`), never hidden
inside a function that looks pure. Those measurements, with their spread, are
`profiling.calibration`'s: measured once per process, or injected (tests) or loaded from a file.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass

import torch

from profiling import calibration


@dataclass(frozen=True)
class GpuPeak:
    """A GPU's datasheet peaks (dense, no sparsity) and the SM count they were quoted for."""

    pattern: str  # matched as whole words in torch.cuda.get_device_name()
    tflops: dict[str, float]  # dtype -> TFLOP/s: bf16/fp16 on tensor cores, fp32 on CUDA cores
    bandwidth_gbps: float
    sm_count: int


def _peak(pattern: str, half: float, fp32: float, gbps: float, sms: int) -> GpuPeak:
    return GpuPeak(pattern, {"bfloat16": half, "float16": half, "float32": fp32}, gbps, sms)


# Longest (most specific) first: "H100 PCIe" before "H100", "L40S" is never "L4".
# T4 has no bf16 tensor cores; its fp16 peak is the honest yardstick for both.
# The RTX PRO 6000 (sm_120, ZeroGPU's Blackwell) dense fp16 figure is its sparse FP4 AI TOPS / 8.
GPU_PEAKS: tuple[GpuPeak, ...] = (
    _peak(r"RTX PRO 6000", 500.0, 126.0, 1792.0, 188),
    _peak(r"H100 PCIe", 756.0, 51.0, 2000.0, 114),
    _peak(r"A100[- ]SXM4[- ]80GB", 312.0, 19.5, 2039.0, 108),
    _peak(r"A100 80GB PCIe", 312.0, 19.5, 1935.0, 108),
    _peak(r"H200", 989.0, 67.0, 4800.0, 132),
    _peak(r"H100", 989.0, 67.0, 3350.0, 132),
    _peak(r"A100", 312.0, 19.5, 1555.0, 108),
    _peak(r"L40S", 362.0, 91.6, 864.0, 142),
    _peak(r"A10G", 70.0, 35.0, 600.0, 80),
    _peak(r"L4", 121.0, 30.3, 300.0, 58),
    _peak(r"T4", 65.0, 8.1, 320.0, 40),
)
_PATTERNS = tuple((re.compile(rf"(?<![\w]){p.pattern}(?![\w])"), p) for p in GPU_PEAKS)
VENDOR = "vendor peak"


def known_gpu(device_name: str) -> GpuPeak | None:
    """The peak table's entry for this exact GPU model, or None."""
    return next((peak for regex, peak in _PATTERNS if regex.search(device_name)), None)


def known_peak_tflops(device_name: str, dtype: str, sm_count: int | None = None) -> float | None:
    """The vendor's peak, scaled to the SMs this device has (ZeroGPU may hand out a partition)."""
    gpu = known_gpu(device_name)
    if gpu is None or dtype not in gpu.tflops:
        return None
    return gpu.tflops[dtype] * _sm_share(gpu, sm_count)


def _sm_share(gpu: GpuPeak, sm_count: int | None) -> float:
    return min(1.0, sm_count / gpu.sm_count) if sm_count else 1.0


def device_name(device: str) -> str:
    """The GPU's name on CUDA; the CPU's model name elsewhere."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        model = ""
    return model or platform.processor() or platform.machine() or "cpu"


def sm_count(device: str) -> int | None:
    return torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else None


def peak_tflops(device: str, name: str, dtype: str) -> tuple[float, str]:
    """The compute yardstick and where it came from: the vendor's figure, or a matmul measured here."""
    peak = known_peak_tflops(name, dtype, sm_count(device)) if device == "cuda" else None
    if peak is not None:
        return peak, VENDOR
    size = calibration.current(device).matmul_size
    return matmul_tflops(device, dtype), f"measured {size}² matmul"


def peak_gbps(device: str, name: str) -> tuple[float, str]:
    """The bandwidth yardstick and where it came from: the vendor's HBM figure, or a copy measured here."""
    gpu = known_gpu(name) if device == "cuda" else None
    if gpu is not None:
        return gpu.bandwidth_gbps * _sm_share(gpu, sm_count(device)), VENDOR
    return copy_gbps(device), f"measured {calibration.current(device).copy_bytes // 1024**2} MiB copy"


def copy_gbps(device: str) -> float:
    """GB/s of one large tensor copy here (read plus write): the median of this device's calibration."""
    return calibration.current(device).copy_gbps.median


def matmul_tflops(device: str, dtype: str) -> float:
    """TFLOP/s of one large square matmul here: the median of this device's calibration for `dtype`."""
    return calibration.matmul_rate(device, dtype).median


def roofline(flops: int, score_bytes: int, fused: bool, seconds: float, peak: float, source: str) -> dict:
    """Achieved TFLOP/s and its share of the yardstick `peak` (TFLOP/s, from `peak_tflops`)."""
    achieved = flops / seconds / 1e12 if seconds > 0 else 0.0
    return {
        "achieved_tflops": round(achieved, 4),
        "peak_tflops": round(peak, 3),
        "peak_source": source,
        "percent_of_peak": round(100 * achieved / peak, 2) if peak else None,
        # A materialised score matrix is written then read at least once; a fused kernel keeps it on chip.
        "score_matrix_bytes": 0 if fused else 2 * score_bytes,
    }


def memory_roofline(flops: int, bytes_moved: int, seconds: float, peak_tflops: float, peak_gbps: float) -> dict:
    """Achieved GB/s over the least traffic a forward can do, and which roof bounds it.

    A forward is memory-bound when its arithmetic intensity (FLOPs per byte moved) is below the
    ridge point, peak FLOP/s over peak bytes/s: there, bandwidth runs out before compute does.
    """
    achieved = bytes_moved / seconds / 1e9 if seconds > 0 else 0.0
    intensity = flops / bytes_moved if bytes_moved else 0.0
    ridge = peak_tflops * 1e12 / (peak_gbps * 1e9) if peak_gbps else 0.0
    return {
        "bytes_moved": bytes_moved,
        "achieved_gbps": round(achieved, 3),
        "arithmetic_intensity": round(intensity, 3),
        "ridge_point": round(ridge, 3),
        "roofline_bound": "memory" if intensity < ridge else "compute",
    }
