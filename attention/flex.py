"""FlexAttention with a causal `mask_mod`: the block mask is built once per shape."""

import functools
import warnings

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

# Eager flex_attention is an unfused reference implementation; the profile shows that plainly,
# so torch's warning about it would only repeat on every call.
warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")


def causal(batch: torch.Tensor, head: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return q_idx >= kv_idx


@functools.lru_cache(maxsize=8)
def causal_block_mask(seq_len: int, device: str) -> BlockMask:
    return create_block_mask(causal, B=None, H=None, Q_LEN=seq_len, KV_LEN=seq_len, device=device)


def flex_causal_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, mask: torch.Tensor, backend: str = "auto"
) -> torch.Tensor:
    block_mask = causal_block_mask(query.size(-2), str(query.device))
    return flex_attention(query, key, value, block_mask=block_mask)
