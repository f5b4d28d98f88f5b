"""Roofline numbers: vendor peaks on known GPUs, the calibration (a measured matmul and copy) elsewhere."""

import pytest

import profiling.calibration
import profiling.roofline
from profiling.roofline import (
    copy_gbps,
    known_gpu,
    known_peak_tflops,
    matmul_tflops,
    memory_roofline,
    peak_gbps,
    peak_tflops,
    roofline,
)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40S", 362.0),  # not the L4
        ("NVIDIA H100 PCIe", 756.0),  # not the SXM part
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 500.0),
    ],
)
def test_known_gpus_match_exactly(name, peak):
    assert known_peak_tflops(name, "bfloat16") == peak


def test_a_partition_gets_its_share_of_the_peak():
    # ZeroGPU may hand out 60 of an H200's 132 SMs.
    assert known_peak_tflops("NVIDIA H200", "bfloat16", sm_count=60) == pytest.approx(989.0 * 60 / 132)
    assert known_gpu("NVIDIA H200").bandwidth_gbps == 4800.0
    assert known_gpu("NVIDIA L4").pattern == "L4" and known_gpu("Intel Xeon") is None


def test_unknown_device_takes_the_calibrated_matmul(fixed_calibration):
    # The session's injected calibration stands for this machine's measurement: no test measures peaks.
    assert known_peak_tflops("AMD EPYC", "float32") is None
    calibrated = fixed_calibration.matmul("float32").median
    assert matmul_tflops("cpu", "float32") == calibrated
    peak, source = peak_tflops("cpu", "AMD EPYC", "float32")
    assert (peak, source) == (calibrated, "measured 1024² matmul")
    numbers = roofline(10**9, 2**20, fused=False, seconds=1.0, peak=peak, source=source)
    assert numbers["peak_source"].startswith("measured") and numbers["peak_tflops"] == round(calibrated, 3)
    assert numbers["achieved_tflops"] == 0.001
    assert numbers["percent_of_peak"] == pytest.approx(100 * 0.001 / calibrated, rel=0.01)
    assert numbers["score_matrix_bytes"] == 2 * 2**20


def test_unknown_device_takes_the_calibrated_copy(fixed_calibration):
    gbps, source = peak_gbps("cpu", "AMD EPYC")
    assert gbps == copy_gbps("cpu") == fixed_calibration.copy_gbps.median and source == "measured 64 MiB copy"


def test_a_known_gpu_never_reads_the_calibration(monkeypatch):
    """The vendor's figures win on a GPU in the table; only an unknown one falls back to the calibration."""

    def refuse(device: str) -> None:
        raise AssertionError(f"read the calibration of {device}")

    monkeypatch.setattr(profiling.calibration, "current", refuse)
    monkeypatch.setattr(profiling.roofline, "sm_count", lambda device: None)
    assert peak_tflops("cuda", "NVIDIA H100 80GB HBM3", "bfloat16") == (989.0, "vendor peak")
    assert peak_gbps("cuda", "NVIDIA H100 80GB HBM3") == (3350.0, "vendor peak")


def test_decode_is_memory_bound_at_the_injected_peaks(fixed_calibration):
    """Decode does ~2 FLOPs per byte it must move (the KV cache, read once). Measured live on a loaded
    machine, the matmul once slowed more than the copy and put the ridge below that (issue 19); at the
    session's injected peaks the ridge is 0.05 TFLOP/s over 10 GB/s = 5 FLOP/byte, so: memory."""
    from attention import AttentionSpec

    spec = AttentionSpec(variant="sdpa", seq_len=2048, q_len=1, kv_heads=1, batch=1, heads=4, head_dim=32)
    b, h, kv, s, d, itemsize = 1, 4, 1, 2048, 32, 4
    flops, moved = 4 * d * h * s, (2 * b * h * 1 * d + 2 * b * kv * s * d) * itemsize  # q, out; K, V
    assert (spec.flops(), spec.bytes_moved()) == (flops, moved)
    tflops, gbps = matmul_tflops("cpu", "float32"), copy_gbps("cpu")
    assert (tflops, gbps) == (fixed_calibration.matmul("float32").median, fixed_calibration.copy_gbps.median)
    numbers = memory_roofline(flops, moved, 1e-3, peak_tflops=tflops, peak_gbps=gbps)
    assert numbers["ridge_point"] == round(tflops * 1e12 / (gbps * 1e9), 3) == 5.0
    assert numbers["arithmetic_intensity"] == round(flops / moved, 3) < 2
    assert numbers["roofline_bound"] == "memory"


def test_fused_moves_no_score_matrix():
    numbers = roofline(10**12, 2**30, fused=True, seconds=0.01, peak=989.0, source="vendor peak")
    assert numbers["score_matrix_bytes"] == 0 and numbers["percent_of_peak"] == pytest.approx(100 * 100 / 989, rel=1e-3)
