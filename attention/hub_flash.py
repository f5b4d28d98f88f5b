"""FlashAttention loaded from the Hugging Face Hub with the `kernels` package (the blog's fourth script).

`flash_attn_func` takes `[batch, seq, heads, head_dim]`, so the variant transposes in and out. It
takes fewer key/value heads (GQA) as they are, aligns `causal=True` to the bottom right (since
flash-attn 2.1) and does a sliding window with `window_size=(left, right)`. Padding needs its
varlen API and top-left causal it cannot do: `support.py` refuses those.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from attention.spec import AttentionSpec

HUB_KERNEL = "kernels-community/flash-attn2"


@functools.lru_cache(maxsize=1)
def load_hub_flash() -> ModuleType | str:
    """The kernel module, or the reason it cannot be had here (cached: one download per process).

    An explicit step: `prepare()` calls it; nothing else downloads.
    """
    try:
        from kernels import get_kernel
    except ImportError:
        return "the `kernels` package is not installed (pip install kernels) to load FlashAttention from the Hub"
    try:
        return get_kernel(HUB_KERNEL)
    except Exception as exc:  # offline, no build for this torch/CUDA, gated repo, ...
        return f"could not load {HUB_KERNEL} from the Hub ({type(exc).__name__}: {str(exc)[:200]})"


def hub_flash_mask(spec: AttentionSpec) -> dict[str, Any]:
    """`flash_attn_func`'s masking arguments: query p sees keys p - window < j <= p for a window."""
    if spec.mask == "none":
        return {"causal": False}
    if spec.mask == "sliding_window":
        return {"causal": True, "window_size": (spec.window - 1, 0)}
    return {"causal": True}


def hub_flash_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, mask: dict[str, Any], backend: str = "auto"
) -> torch.Tensor:
    module = load_hub_flash()
    if isinstance(module, str):
        raise RuntimeError(module)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [batch, seq, heads, head_dim]
    out = module.flash_attn_func(q, k, v, **mask)
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2)  # [batch, heads, q_len, head_dim]
