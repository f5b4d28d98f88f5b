"""Refusals name the field and say why; preflight is the one step that reads the machine."""

import sys

import pytest
import torch

import attention
from attention import AttentionSpec, SpecError, backend_reasons, preflight, refusal, unsupported
from attention.prepared import Prepared
from attention.sdpa import SdpaMask, sdpa_attention
from attention.support import available_bytes, memory_budget


@pytest.mark.parametrize("backend", ["efficient", "cudnn"])
def test_cuda_only_backends_say_why_on_cpu(backend):
    spec = AttentionSpec(variant="sdpa", backend=backend, device="cpu")
    assert refusal(spec)[0] == "backend"
    reason = unsupported(spec)
    assert reason is not None and "only on CUDA" in reason and "auto, math or flash" in reason


@pytest.mark.parametrize("backend", ["auto", "math", "flash"])
def test_cpu_backends_are_supported(backend):
    assert unsupported(AttentionSpec(variant="sdpa", backend=backend, device="cpu")) is None


def test_flex_training_on_cpu_is_refused_on_mode():
    field, reason = refusal(AttentionSpec(variant="flex", mode="training", device="cpu"))
    assert field == "mode" and "no backward on CPU (eager or compiled)" in reason
    assert refusal(AttentionSpec(variant="flex", mode="training", device="cuda")) is None


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        (dict(device="cpu"), "variant", "runs only on CUDA"),
        (dict(dtype="float32"), "variant", "bfloat16 or float16"),
        (dict(mask="padding", valid_len=3), "mask", "varlen"),
        (dict(mask="causal_top_left"), "mask", "bottom right only"),
    ],
)
def test_hub_flash_refuses_what_it_cannot_do(changes, field, words):
    spec = AttentionSpec(**{"variant": "hub_flash", "dtype": "bfloat16", "device": "cuda", **changes})
    found = refusal(spec)
    assert found is not None and found[0] == field and words in found[1]


@pytest.mark.parametrize("changes", [dict(), dict(kv_heads=1, q_len=1), dict(mask="none"), dict(mode="training")])
def test_hub_flash_takes_gqa_decode_no_mask_and_training(changes):
    assert refusal(AttentionSpec(variant="hub_flash", dtype="bfloat16", device="cuda", **changes)) is None


def test_hub_flash_loader_explains_a_missing_package(monkeypatch):
    from attention import hub_flash

    hub_flash.load_hub_flash.cache_clear()
    monkeypatch.setitem(sys.modules, "kernels", None)  # as on a machine without the package
    try:
        assert "`kernels` package is not installed" in hub_flash.load_hub_flash()
    finally:
        hub_flash.load_hub_flash.cache_clear()


def test_hub_flash_window_is_flash_attn_window_size():
    spec = AttentionSpec(variant="hub_flash", mask="sliding_window", window=8, seq_len=64, device="cpu")
    # flash-attn: query p attends keys in [p - left, p + right]; the spec's window is p - window < j <= p.
    assert attention.hub_flash.hub_flash_mask(spec) == {"causal": True, "window_size": (7, 0)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA, so asking for it is valid")
def test_preflight_refuses_cuda_without_cuda():
    with pytest.raises(SpecError, match="^device: cuda was asked for, but this machine has no CUDA GPU"):
        preflight(AttentionSpec(device="cuda"))


def test_preflight_refuses_what_does_not_fit_with_both_figures():
    spec = AttentionSpec(variant="naive", batch=64, heads=64, seq_len=65536, device="cpu")
    with pytest.raises(
        SpecError, match=r"^seq_len: this run needs about [\d.]+ (GiB|TiB) on cpu but only [\d.]+ \w+ is available"
    ):
        preflight(spec)


def test_preflight_names_the_refused_field_and_returns_the_spec():
    with pytest.raises(SpecError, match="^mode: flex_attention has no backward on CPU"):
        preflight(AttentionSpec(variant="flex", mode="training", device="cpu"))
    spec = AttentionSpec(device="cpu")
    assert preflight(spec) is spec


def test_budget_is_below_what_is_free():
    assert 0 < memory_budget("cpu") < available_bytes("cpu")


@pytest.mark.parametrize(
    "changes",
    [dict(), dict(kv_heads=1, q_len=1), dict(mask="sliding_window", window=4), dict(mask="padding", valid_len=5)],
)
def test_cpu_backend_reasons_flash_takes_masks_and_gqa(changes):
    prepared = attention.prepare(AttentionSpec(variant="sdpa", seq_len=32, device="cpu", **changes))
    reasons = backend_reasons(prepared)
    assert set(reasons) == {"efficient", "cudnn"}  # on CPU, flash takes dense masks and GQA; math takes all
    assert all("only on CUDA" in r for r in reasons.values())


def test_cpu_flash_refusal_quotes_torch():
    spec = AttentionSpec(variant="sdpa", heads=4, kv_heads=2, seq_len=8, device="cpu")
    q, k, v = attention.make_inputs(spec)
    # Fewer key heads without enable_gqa: a call torch's CPU flash checks refuse, built by hand.
    spec_without_gqa = spec.replace(kv_heads=0)
    prepared = Prepared(spec_without_gqa, sdpa_attention, q, k, v, SdpaMask(None, True))
    reason = backend_reasons(prepared)["flash"]
    assert reason.startswith("torch refuses the CPU flash kernel for this call: ")
    assert "same num_heads" in reason and "Triggered internally" not in reason


def test_other_variants_have_no_backend_reasons():
    assert backend_reasons(attention.prepare(AttentionSpec(variant="naive", seq_len=8, device="cpu"))) == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_dense_mask_forces_flash_off_with_torchs_reason():
    spec = AttentionSpec(variant="sdpa", dtype="bfloat16", seq_len=256, mask="sliding_window", window=64, device="cuda")
    reasons = backend_reasons(attention.prepare(spec))
    assert "flash" in reasons and "torch gave no reason" not in reasons["flash"]
    assert "flash" not in backend_reasons(attention.prepare(spec.replace(mask="causal")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pinned_flash_refuses_a_head_dim_it_cannot_tile():
    with pytest.raises(SpecError, match="^backend: torch refuses the flash backend"):
        attention.prepare(AttentionSpec(variant="sdpa", backend="flash", head_dim=512, dtype="bfloat16", device="cuda"))
