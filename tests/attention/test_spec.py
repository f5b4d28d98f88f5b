"""The spec validates once, with messages that name the field and the allowed range."""

import pytest
import torch

from attention import LIMITS, AttentionSpec, SpecError, unsupported
from attention.spec import available_bytes, memory_budget


@pytest.mark.parametrize("field", list(LIMITS))
@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True, 10**9])
def test_bad_sizes_name_the_field(field, bad):
    with pytest.raises(SpecError) as err:
        AttentionSpec(device="cpu", **{field: bad})
    assert err.value.field == field
    low, high = LIMITS[field]
    assert str(err.value).startswith(f"{field}:")
    assert f"{low} to {high}" in str(err.value)


@pytest.mark.parametrize(
    ("field", "value"), [("variant", "fast"), ("backend", "xformers"), ("dtype", "float8"), ("device", "tpu")]
)
def test_unknown_choices_list_what_is_allowed(field, value):
    with pytest.raises(SpecError, match=f"^{field}: '{value}' is not one of") as err:
        AttentionSpec(**{field: value})
    assert err.value.field == field


def test_compile_must_be_a_bool():
    with pytest.raises(SpecError, match="^compile:"):
        AttentionSpec(device="cpu", compile="yes")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA, so asking for it is valid")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(SpecError, match="^device: cuda was asked for, but this machine has no CUDA GPU"):
        AttentionSpec(device="cuda")


def test_auto_device_resolves():
    assert AttentionSpec(device="auto").device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_too_large_for_memory_says_need_and_have():
    with pytest.raises(
        SpecError, match=r"^seq_len: this shape needs about [\d.]+ (GiB|TiB) on cpu but only .* available"
    ):
        AttentionSpec(variant="naive", batch=64, heads=64, seq_len=65536, device="cpu")


def test_memory_estimate_ranks_variants():
    shape = dict(batch=2, heads=4, seq_len=1024, head_dim=64, device="cpu")
    naive = AttentionSpec(variant="naive", **shape).estimated_bytes()
    inplace = AttentionSpec(variant="inplace", **shape).estimated_bytes()
    fused = AttentionSpec(variant="sdpa", backend="flash", **shape).estimated_bytes()
    assert naive - inplace == 2 * 4 * 1024 * 1024 * 4  # exactly one float32 score matrix
    assert inplace > fused
    assert AttentionSpec(**shape).estimated_bytes(seq_len=2048) > naive


def test_budget_is_below_what_is_free():
    assert 0 < memory_budget("cpu") < available_bytes("cpu")


def test_flops_are_causal():
    spec = AttentionSpec(batch=1, heads=1, seq_len=4, head_dim=2, device="cpu")
    # QK^T and PV over the 10 unmasked (query, key) pairs of a 4x4 causal mask, 2 FLOPs per MAC.
    assert spec.flops() == 2 * 2 * 10 * 2


def test_name_and_replace():
    spec = AttentionSpec(variant="sdpa", backend="math", device="cpu")
    assert spec.name == "sdpa-math"
    assert spec.replace(compile=True).name == "sdpa-math+compile"
    with pytest.raises(SpecError, match="^heads:"):
        spec.replace(heads=0)


@pytest.mark.parametrize("backend", ["efficient", "cudnn"])
def test_cuda_only_backends_say_why_on_cpu(backend):
    reason = unsupported(AttentionSpec(variant="sdpa", backend=backend, device="cpu"))
    assert reason is not None and "only on CUDA" in reason and "auto, math or flash" in reason


@pytest.mark.parametrize("backend", ["auto", "math", "flash"])
def test_cpu_backends_are_supported(backend):
    assert unsupported(AttentionSpec(variant="sdpa", backend=backend, device="cpu")) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_flash_refuses_a_head_dim_it_cannot_tile_with_torchs_reason():
    reason = unsupported(AttentionSpec(variant="sdpa", backend="flash", head_dim=512, dtype="bfloat16", device="cuda"))
    assert reason is not None and "flash" in reason and "torch gave no reason" not in reason


def test_hub_flash_says_why_it_cannot_run_on_cpu():
    reason = unsupported(AttentionSpec(variant="hub_flash", dtype="bfloat16", device="cpu"))
    assert reason == "FlashAttention from the Hub (kernels-community/flash-attn2) runs only on CUDA"


def test_hub_flash_loader_explains_a_missing_package(monkeypatch):
    import sys

    from attention import hub_flash

    hub_flash.load_hub_flash.cache_clear()
    monkeypatch.setitem(sys.modules, "kernels", None)  # as on a machine without the package
    try:
        assert "`kernels` package is not installed" in hub_flash.load_hub_flash()
    finally:
        hub_flash.load_hub_flash.cache_clear()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_hub_flash_refuses_float32_on_cuda():
    assert "bfloat16 or float16" in unsupported(AttentionSpec(variant="hub_flash", dtype="float32", device="cuda"))
