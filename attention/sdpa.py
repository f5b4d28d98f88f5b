"""`F.scaled_dot_product_attention`, pinned to one backend with `sdpa_kernel`.

SDPA takes the mask the way a model passes it: `is_causal=True` where it is right (it aligns to the
top left, so only when q_len == seq_len, or on purpose for `causal_top_left`), torch's
`causal_lower_right` for decode and chunked prefill (it rebuilds a dense mask on every call where no
fused CUDA kernel takes it: the lesson), and a dense boolean `attn_mask` for a window or padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias, causal_lower_right

from attention import masks

if TYPE_CHECKING:
    from attention.spec import AttentionSpec

SDPA_BACKENDS: dict[str, SDPBackend] = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


@dataclass(frozen=True)
class SdpaMask:
    """What SDPA is told about the mask: `attn_mask` (True = attend, or a causal bias) and `is_causal`."""

    attn_mask: torch.Tensor | CausalBias | None
    is_causal: bool


def sdpa_mask(spec: AttentionSpec) -> SdpaMask:
    """The spec's mask in SDPA's terms, built once by `prepare`."""
    if spec.mask == "none":
        return SdpaMask(None, False)
    if spec.mask == "causal_top_left" or (spec.mask == "causal" and spec.q_len == spec.seq_len):
        return SdpaMask(None, True)  # no dense mask: the kernels (or the math backend) mask by themselves
    if spec.mask == "causal":
        return SdpaMask(causal_lower_right(spec.q_len, spec.seq_len), False)
    return SdpaMask(masks.visible(spec), False)


def sdpa_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, mask: SdpaMask, backend: str = "auto"
) -> torch.Tensor:
    options = dict(attn_mask=mask.attn_mask, is_causal=mask.is_causal, enable_gqa=query.size(1) != key.size(1))
    if backend == "auto":
        return F.scaled_dot_product_attention(query, key, value, **options)
    with sdpa_kernel(SDPA_BACKENDS[backend]):
        return F.scaled_dot_product_attention(query, key, value, **options)
