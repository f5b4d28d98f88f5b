"""The kernel-name decoder against its own table read the slow way (gaps mutation testing found).

The reference below applies the rules the module states, row by row over `PATTERNS` with plain
`re`: every matching row adds its phrase once, with unmatched groups left empty; a fallback
row counts only when no earlier row of its family matched; the first matching row names the
family, the first that knows says whether tensor cores ran.
"""

from __future__ import annotations

import re

import pytest

from profiling.kernels import PATTERNS, decode
from profiling.trace import load_trace
from tests.conftest import DATA, GPU_TRACES

NAMES = [
    "triton_poi_fused_add_0",  # a family's own row: its fallback must not add "Triton kernel"
    "triton_foo",  # only the fallback
    "cudnn_generated_fort_native_sdpa_sm90_kernel",  # the cuDNN fallback, no knob
    "void at::native::elementwise_kernel<128, 2, F>(int)",  # the generic elementwise fallback
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
    "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn",  # tile group matched, ctile not
    "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16",
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(Params)",  # optional groups
    "my_custom_kernel",
]


def reference_decode(name: str) -> tuple[str, tuple[str, ...], bool | None]:
    family, phrases, tensor_cores, families = "other", [], None, []
    for pattern in PATTERNS:
        if pattern.fallback and pattern.family in families:
            continue
        match = re.search(pattern.regex, name)
        if match is None:
            continue
        families.append(pattern.family)
        groups = {k: ("" if v is None else v) for k, v in match.groupdict().items()}
        phrase = pattern.meaning.format(**groups)
        if phrase not in phrases:
            phrases.append(phrase)
        if family == "other":
            family = pattern.family
        if tensor_cores is None:
            tensor_cores = pattern.tensor_cores
    return family, tuple(phrases), tensor_cores


def _real_names() -> list[str]:
    names: set[str] = set()
    for trace in GPU_TRACES:
        names |= set(load_trace(DATA / f"{trace}.json.gz").gpu_activity["name"])
    return sorted(names)


@pytest.mark.parametrize("name", NAMES)
def test_decode_follows_the_pattern_table(name):
    info = decode(name)
    assert (info.family, info.phrases, info.tensor_cores) == reference_decode(name)


def test_decode_of_every_real_kernel_follows_the_pattern_table():
    for name in _real_names():
        info = decode(name)
        assert (info.family, info.phrases, info.tensor_cores) == reference_decode(name), name


def test_fallbacks_and_groups_by_hand():
    # Read off PATTERNS: Triton's pointwise row matched, so its fallback row adds nothing.
    assert decode("triton_poi_fused_add_0").phrases == ("Triton pointwise kernel (torch.compile/Inductor)",)
    assert decode("triton_foo").phrases == ("Triton kernel",)
    assert decode("cudnn_generated_fort_native_sdpa_sm90_kernel").family == "cudnn-attention"
    # The tile row's other group (ctile) did not match: it is left out, not spelled "None".
    assert "threadblock tile 128x64" in decode("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn").phrases


@pytest.mark.parametrize(
    ("name", "arch"),
    [("sm_80_kernel", "80"), ("x_sm90_y", "90"), ("volta_sgemm_128x64_nn", "70"), ("hopper_x", "90"), ("k", None)],
)
def test_architecture_from_the_name(name, arch):
    assert decode(name).arch == arch
