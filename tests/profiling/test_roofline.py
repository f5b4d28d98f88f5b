"""Roofline numbers: vendor peaks on known GPUs, a measured matmul elsewhere."""

import pytest

from profiling.roofline import known_gpu, known_peak_tflops, matmul_tflops, peak_tflops, roofline


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


def test_unknown_device_is_measured_here():
    assert known_peak_tflops("AMD EPYC", "float32") is None
    measured = matmul_tflops("cpu", "float32")
    peak, source = peak_tflops("cpu", "AMD EPYC", "float32")
    assert peak == measured
    numbers = roofline(10**9, 2**20, fused=False, seconds=1.0, peak=peak, source=source)
    assert numbers["peak_source"].startswith("measured") and numbers["peak_tflops"] == round(measured, 3)
    assert numbers["achieved_tflops"] == 0.001
    assert numbers["percent_of_peak"] == pytest.approx(100 * 0.001 / measured, rel=0.01)
    assert numbers["score_matrix_bytes"] == 2 * 2**20


def test_fused_moves_no_score_matrix():
    numbers = roofline(10**12, 2**30, fused=True, seconds=0.01, peak=989.0, source="vendor peak")
    assert numbers["score_matrix_bytes"] == 0 and numbers["percent_of_peak"] == pytest.approx(100 * 100 / 989, rel=1e-3)
