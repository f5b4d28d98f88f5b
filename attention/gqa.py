"""Grouped-query attention as eager model code does it: copy each key/value head for its query heads.

The same `expand` + `reshape` as transformers' `repeat_kv`, so the copy is visible in a profile: in
`reshape` for GQA, or in the next `matmul` for MQA (one key/value head reshapes as a view).
"""

import torch


def repeat_kv(key: torch.Tensor, value: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`key` and `value` with `heads` heads; untouched (no op at all) when they already have them."""
    groups = heads // key.size(1)
    if groups == 1:
        return key, value
    return _repeat_heads(key, groups), _repeat_heads(value, groups)


def _repeat_heads(tensor: torch.Tensor, groups: int) -> torch.Tensor:
    batch, kv_heads, seq_len, head_dim = tensor.shape
    expanded = tensor[:, :, None].expand(batch, kv_heads, groups, seq_len, head_dim)  # a view, no copy yet
    return expanded.reshape(batch, kv_heads * groups, seq_len, head_dim)  # [batch, heads, seq, head_dim]: the copy
