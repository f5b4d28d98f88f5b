"""The kernel-name decoder against its own table read the slow way (gaps mutation testing found).

The reference below applies the rules the module states, row by row over `PATTERNS` with plain
`re`: every matching row adds its phrase once (an empty meaning adds none), with unmatched groups
left empty; a fallback row counts only when no earlier row of its family matched; the first
matching row with a family names it, the first with a precision gives it (a `{group}` through the
aliases), the first with an engine gives it ("unknown" without); with no precision from the rows,
the first element type spelled in the name gives it, found here by trying every position.
"""

from __future__ import annotations

import re

import pytest

from profiling.kernels import PATTERNS, PRECISION_ALIASES, TYPE_PRECISION, decode, demangle
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
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(Params)",  # optional groups; f32: no engine from the name
    "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8_ISA90a",  # a Tensile type letter through the aliases
    "void k<signed char, c10::Half>(float*)",  # no row gives a precision: the first element type does
    "my_custom_kernel",
]
GPU_DATA = DATA / "gpu"


def _first_type(text: str) -> str | None:
    """The first element type spelled as a whole word, by trying every position (the slow way)."""
    word = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
    for at in range(len(text)):
        if at and (text[at - 1].isalpha() or text[at - 1] == "_"):
            continue
        found = [
            t for t in TYPE_PRECISION if text.startswith(t, at) and text[at + len(t) : at + len(t) + 1] not in word
        ]
        if found:
            return TYPE_PRECISION[max(found, key=len)]
    return None


def reference_decode(name: str) -> tuple[str, tuple[str, ...], str | None, str]:
    text = demangle(name)
    family, phrases, precision, engine, families = "other", [], None, None, []
    for pattern in PATTERNS:
        if pattern.fallback and pattern.family in families:
            continue
        match = re.search(pattern.regex, text)
        if match is None:
            continue
        groups = {k: ("" if v is None else v) for k, v in match.groupdict().items()}
        if pattern.family is not None:
            families.append(pattern.family)
            if family == "other":
                family = pattern.family
        phrase = pattern.meaning.format(**groups)
        if phrase and phrase not in phrases:
            phrases.append(phrase)
        if precision is None and pattern.precision is not None:
            given = pattern.precision
            precision = PRECISION_ALIASES.get(groups[given[1:-1]]) if given.startswith("{") else given
        if engine is None:
            engine = pattern.engine
    if precision is None:
        precision = _first_type(text)
    return family, tuple(phrases), precision, engine or "unknown"


def _real_names() -> list[str]:
    names: set[str] = set()
    paths = [DATA / f"{trace}.json.gz" for trace in GPU_TRACES] + sorted(GPU_DATA.glob("*.json.gz"))
    for path in paths:
        names |= set(load_trace(path).gpu_activity["name"])
    return sorted(names)


def _decoded(name: str) -> tuple[str, tuple[str, ...], str | None, str]:
    info = decode(name)
    return info.family, info.phrases, info.precision, info.engine


@pytest.mark.parametrize("name", NAMES)
def test_decode_follows_the_pattern_table(name):
    assert _decoded(name) == reference_decode(name)


def test_decode_of_every_real_kernel_follows_the_pattern_table():
    names = _real_names()
    assert len(names) > 200  # the A100 traces and the seven of tests/data/gpu
    for name in names:
        assert _decoded(name) == reference_decode(name), name


def test_meaning_joins_the_phrases_and_tensor_cores_follows_the_engine():
    for name in NAMES:
        info = decode(name)
        assert info.meaning == "; ".join(info.phrases)
        assert info.tensor_cores is {"tensor": True, "simt": False}.get(info.engine)


def test_fallbacks_and_groups_by_hand():
    # Read off PATTERNS: Triton's pointwise row matched, so its fallback row adds nothing; the ops row adds its own.
    assert decode("triton_poi_fused_add_0").phrases == ("Triton pointwise kernel (torch.compile/Inductor)", "fuses add")
    assert decode("triton_foo").phrases == ("Triton kernel",)
    assert decode("cudnn_generated_fort_native_sdpa_sm90_kernel").family == "cudnn-attention"
    # The tile row's other group (ctile) did not match: it is left out, not spelled "None".
    assert "threadblock tile 128x64" in decode("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn").phrases
    # Tensile's H is fp16 through the aliases; the MI row says matrix cores.
    assert (decode(NAMES[8]).precision, decode(NAMES[8]).engine) == ("fp16", "tensor")
    # fmha's dtype group reads fp32 through the aliases; without a row's precision, the first float type counts.
    assert decode("fmha_cutlassF_f32_aligned_64x64_rf_sm80(Params)").precision == "fp32"
    assert decode("void k<signed char, c10::Half>(float*)").precision == "fp16"


@pytest.mark.parametrize(
    ("name", "arch"),
    [("sm_80_kernel", "80"), ("x_sm90_y", "90"), ("volta_sgemm_128x64_nn", "70"), ("hopper_x", "90"), ("k", None)],
)
def test_architecture_from_the_name(name, arch):
    assert decode(name).arch == arch
