"""Why each SDPA backend would refuse one prepared call, in torch's own words where torch says.

On CUDA, torch's `can_use_*_attention(debug=True)` checks run on the call's own tensors and mask
(nothing is allocated). On CPU only `math` and the CPU flash kernel exist: efficient and cuDNN are
CUDA only, and flash is asked through `torch._fused_sdp_choice` pinned to flash, which runs torch's
CPU checks without computing. In torch 2.13 that kernel takes dense masks and GQA, so on CPU a mask
costs flash nothing: the "dense mask forces SDPA off flash" lesson is a CUDA one.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias

from attention.sdpa import SdpaMask

if TYPE_CHECKING:
    from attention.prepared import Prepared

CUDA_ONLY_REASONS = {
    "efficient": "the efficient (xformers/cutlass) SDPA backend runs only on CUDA; on cpu choose auto, math or flash",
    "cudnn": "the cuDNN SDPA backend runs only on CUDA; on cpu choose auto, math or flash",
}
_CUDA_CHECKS = {
    "flash": "can_use_flash_attention",
    "efficient": "can_use_efficient_attention",
    "cudnn": "can_use_cudnn_attention",
}
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*")


def backend_reasons(prepared: Prepared) -> dict[str, str]:
    """`{backend: reason}` for each SDPA backend that would refuse this call; {} for other variants.

    `math` never refuses.
    """
    if prepared.spec.variant != "sdpa":
        return {}
    if prepared.query.device.type == "cuda":
        return _cuda_reasons(prepared)
    reasons = dict(CUDA_ONLY_REASONS)
    flash = _cpu_flash_reason(prepared)
    if flash:
        reasons["flash"] = flash
    return reasons


def _dense_stand_in(prepared: Prepared) -> tuple[torch.Tensor | None, bool]:
    """The call's mask and is_causal, with a causal bias replaced by the dense mask it becomes.

    The stand-in is one boolean expanded to `[q_len, seq_len]`: the shape checks see a dense mask,
    and nothing is allocated.
    """
    mask: SdpaMask = prepared.mask
    if isinstance(mask.attn_mask, CausalBias):
        spec = prepared.spec
        stand_in = torch.ones((), dtype=torch.bool, device=prepared.query.device).expand(spec.q_len, spec.seq_len)
        return stand_in, False
    return mask.attn_mask, mask.is_causal  # type: ignore[return-value]


def _torch_messages(caught: list[warnings.WarningMessage]) -> str:
    messages = [_TRIGGERED.sub(" ", str(w.message)).strip() for w in caught]
    return "; ".join(m for m in messages if m) or "torch gave no reason"


def _enable_gqa(prepared: Prepared) -> bool:
    return prepared.spec.kv_heads != prepared.spec.heads


def _cpu_flash_reason(prepared: Prepared) -> str | None:
    attn_mask, is_causal = _dense_stand_in(prepared)
    q, k, v = prepared.query, prepared.key, prepared.value
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch._fused_sdp_choice(q, k, v, attn_mask, 0.0, is_causal, enable_gqa=_enable_gqa(prepared))
        except RuntimeError:
            return f"torch refuses the CPU flash kernel for this call: {_torch_messages(caught)}"
    return None


def _cuda_check(prepared: Prepared, backend: str, attn_mask: torch.Tensor | None, is_causal: bool) -> str | None:
    check: Callable[..., bool] | None = getattr(torch.backends.cuda, _CUDA_CHECKS[backend], None)
    if check is None:
        return f"this torch ({torch.__version__}) has no {backend} SDPA backend"
    params = torch.backends.cuda.SDPAParams(
        prepared.query, prepared.key, prepared.value, attn_mask, 0.0, is_causal, _enable_gqa(prepared)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = check(params, debug=True)
    return None if ok else f"torch refuses the {backend} backend for this call: {_torch_messages(caught)}"


def _cuda_reasons(prepared: Prepared) -> dict[str, str]:
    """Each backend as if pinned: torch's causal_lower_right hands flash and efficient no mask at all
    (they align causal to the bottom right themselves) and gives any other backend a dense mask."""
    reasons: dict[str, str] = {}
    causal_bias = isinstance(prepared.mask.attn_mask, CausalBias)
    for backend in _CUDA_CHECKS:
        attn_mask, is_causal = (None, False) if causal_bias and backend != "cudnn" else _dense_stand_in(prepared)
        reason = _cuda_check(prepared, backend, attn_mask, is_causal)
        if reason:
            reasons[backend] = reason
    return reasons
