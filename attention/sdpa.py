"""`F.scaled_dot_product_attention`, pinned to one backend with `sdpa_kernel`."""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SDPA_BACKENDS: dict[str, SDPBackend] = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def sdpa_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, mask: torch.Tensor, backend: str = "auto"
) -> torch.Tensor:
    # `is_causal` replaces the precomputed mask; the math backend rebuilds it on every call.
    if backend == "auto":
        return F.scaled_dot_product_attention(query, key, value, is_causal=True)
    with sdpa_kernel(SDPA_BACKENDS[backend]):
        return F.scaled_dot_product_attention(query, key, value, is_causal=True)
