"""Can this spec run here? Predicates that return the reason it cannot, or None."""

from __future__ import annotations

import warnings

import torch

from attention.spec import AttentionSpec

CPU_ONLY_REASONS = {
    "efficient": "the efficient (xformers/cutlass) SDPA backend runs only on CUDA; on cpu choose auto, math or flash",
    "cudnn": "the cuDNN SDPA backend runs only on CUDA; on cpu choose auto, math or flash",
}

_CUDA_CHECKS = {
    "flash": "can_use_flash_attention",
    "efficient": "can_use_efficient_attention",
    "cudnn": "can_use_cudnn_attention",
}


def _sdpa_params(spec: AttentionSpec) -> torch.backends.cuda.SDPAParams:
    shape = (spec.batch, spec.heads, spec.seq_len, spec.head_dim)
    # torch's checks read shape, dtype, device and strides; empty tensors cost no compute.
    q, k, v = (torch.empty(shape, dtype=spec.torch_dtype, device="cuda") for _ in range(3))
    try:  # torch >= 2.5 added enable_gqa
        return torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, True, False)
    except TypeError:
        return torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, True)


def cuda_backend_reason(spec: AttentionSpec) -> str | None:
    """Ask torch itself (with debug=True) why a CUDA backend refuses this shape or dtype."""
    check = getattr(torch.backends.cuda, _CUDA_CHECKS[spec.backend], None)
    if check is None:
        return f"this torch ({torch.__version__}) has no {spec.backend} SDPA backend"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = check(_sdpa_params(spec), debug=True)
    if ok:
        return None
    reasons = [str(w.message).strip() for w in caught]
    detail = "; ".join(r for r in reasons if r) or "torch gave no reason"
    return f"torch refuses the {spec.backend} backend for this shape/dtype: {detail}"


def flex_reason(spec: AttentionSpec) -> str | None:
    try:
        import torch.nn.attention.flex_attention
    except ImportError:
        return f"this torch ({torch.__version__}) has no flex_attention"
    return None


def hub_flash_reason(spec: AttentionSpec) -> str | None:
    if spec.device != "cuda":
        return "FlashAttention from the Hub (kernels-community/flash-attn2) runs only on CUDA"
    if spec.dtype == "float32":
        return "FlashAttention from the Hub needs bfloat16 or float16 inputs, not float32"
    from attention.hub_flash import load_hub_flash

    loaded = load_hub_flash()
    return loaded if isinstance(loaded, str) else None


def unsupported(spec: AttentionSpec) -> str | None:
    """Why `spec` cannot run on its device, or None if it can."""
    if spec.variant == "flex":
        return flex_reason(spec)
    if spec.variant == "hub_flash":
        return hub_flash_reason(spec)
    if spec.variant != "sdpa" or spec.backend in ("auto", "math"):
        return None
    if spec.device == "cpu":
        # On CPU, `flash` selects the CPU flash kernel (_scaled_dot_product_flash_attention_for_cpu).
        return CPU_ONLY_REASONS.get(spec.backend)
    return cuda_backend_reason(spec)
