"""Roofline numbers: vendor peaks on known GPUs, a measured matmul elsewhere."""

import pytest

from profiling.roofline import known_peak_tflops, matmul_tflops, roofline


@pytest.mark.parametrize(
    ("name", "peak"), [("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L4", 121.0)]
)
def test_known_gpus(name, peak):
    assert known_peak_tflops(name, "bfloat16") == peak


def test_unknown_device_is_measured_here():
    assert known_peak_tflops("AMD EPYC", "float32") is None
    measured = matmul_tflops("cpu", "float32")
    numbers = roofline(10**9, 2**20, fused=False, seconds=1.0, device="cpu", device_name="AMD EPYC", dtype="float32")
    assert numbers["peak_source"].startswith("measured") and numbers["peak_tflops"] == round(measured, 3)
    assert numbers["achieved_tflops"] == 0.001
    assert numbers["percent_of_peak"] == pytest.approx(100 * 0.001 / measured, rel=0.01)
    assert numbers["score_matrix_bytes"] == 2 * 2**20


def test_fused_moves_no_score_matrix():
    numbers = roofline(
        10**12, 2**30, fused=True, seconds=0.01, device="cuda", device_name="NVIDIA H200", dtype="bfloat16"
    )
    assert numbers["score_matrix_bytes"] == 0 and numbers["percent_of_peak"] == pytest.approx(100 * 100 / 989, rel=1e-3)
