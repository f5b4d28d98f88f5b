"""Naive attention, as the blog writes it: the out-of-place `masked_fill` copies the scores.

`mask` is the dense mask (True = masked) that `prepare` built, or None when nothing is masked; fewer
key/value heads (GQA) are copied up to the query heads first.
"""

import torch

from attention.gqa import repeat_kv


def naive_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, mask: torch.Tensor | None, backend: str = "auto"
) -> torch.Tensor:
    key, value = repeat_kv(key, value, query.size(1))  # [batch, heads, seq, head_dim]
    scale = query.size(-1) ** -0.5
    scores = query @ key.transpose(-2, -1) * scale  # [batch, heads, q_len, seq]
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))  # [batch, heads, q_len, seq]
    probs = torch.softmax(scores, dim=-1)  # [batch, heads, q_len, seq]
    return probs @ value  # [batch, heads, q_len, head_dim]
