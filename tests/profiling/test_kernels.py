"""The kernel-name decoder, on the names the blog shows and on real kernels from A100 traces."""

import pytest

from profiling.kernels import decode
from profiling.trace import load_trace
from tests.conftest import DATA

CASES = [
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", "gemm", True, ["tensor-core MMA s16816", "sm80"]),
    ("ampere_sgemm_128x64_tn", "gemm", False, ["FP32 math on CUDA cores", "sm80"]),
    (
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
        "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "efficient-attention",
        True,
        ["memory-efficient attention (bf16, tile 64x64)", "aligned", "register file", "sm80"],
    ),
    (
        "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
        "cutlass::bfloat16_t>, false, true, false, false, false, true, false, false>(pytorch_flash::Flash_fwd_params)",
        "flash-attention",
        True,
        ["FlashAttention-2"],
    ),
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_kernel0_0",
        "cudnn-attention",
        True,
        ["cuDNN generated fused attention (engine knob 7, tile 64x128x64)", "wgmma", "sm90: Hopper"],
    ),
    (
        "void at::native::triu_tril_kernel<bool, long, false, 2>(at::cuda::detail::TensorInfo<bool, long>)",
        "mask",
        None,
        ["tril"],
    ),
    (
        "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false, false>(...)",
        "softmax",
        None,
        ["warp-per-row softmax"],
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
        "elementwise",
        None,
        ["fill"],
    ),
    ("Memcpy DtoD (Device -> Device)", "memcpy", None, ["device-to-device copy"]),
]


@pytest.mark.parametrize(("name", "family", "tensor_cores", "phrases"), CASES)
def test_decodes_the_blogs_kernels(name, family, tensor_cores, phrases):
    info = decode(name)
    assert info.family == family
    assert info.tensor_cores is tensor_cores
    for phrase in phrases:
        assert phrase in info.summary


def test_unknown_names_decode_to_nothing():
    info = decode("my_custom_kernel")
    assert info.family == "other" and info.summary == "" and info.arch is None


def test_every_real_kernel_in_the_a100_traces_gets_a_meaning_or_an_honest_blank():
    names = set()
    for trace in ("a100_simple_add", "sampled_training_rank0", "triton_driver_launch"):
        names |= set(load_trace(DATA / f"{trace}.json.gz").gpu_activity["name"])
    decoded = {n: decode(n) for n in names}
    assert decoded["ampere_sgemm_32x32_sliced1x4_tn"].tensor_cores is False
    assert "Triton pointwise" in decoded["triton_poi_fused_add_cos_sin_0"].summary
    tf32 = next(n for n in names if n.startswith("sm80_xmma_fprop"))
    assert decoded[tf32].arch == "80"
    understood = sum(1 for info in decoded.values() if info.summary)
    assert understood / len(decoded) > 0.5
