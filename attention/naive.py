"""Naive attention, as the blog writes it: the out-of-place `masked_fill` copies the scores."""

import torch


def naive_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, mask: torch.Tensor, backend: str = "auto"
) -> torch.Tensor:
    scale = query.size(-1) ** -0.5
    scores = query @ key.transpose(-2, -1) * scale  # [batch, heads, seq, seq]
    scores = scores.masked_fill(mask, float("-inf"))  # [batch, heads, seq, seq]
    probs = torch.softmax(scores, dim=-1)  # [batch, heads, seq, seq]
    return probs @ value  # [batch, heads, seq, head_dim]
