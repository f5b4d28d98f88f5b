"""FlexAttention with the spec's `mask_mod`; GQA through its `enable_gqa`."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from attention import masks

if TYPE_CHECKING:
    from attention.spec import AttentionSpec

# Eager flex_attention is an unfused reference implementation; the profile shows that plainly,
# so torch's warning about it would only repeat on every call.
warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")

# flex_attention's default tile: a (query block, key block) tile with no visible pair is skipped.
FLEX_BLOCK_SIZE = 128


def flex_mask(spec: AttentionSpec) -> BlockMask | None:
    """The spec's block mask (None when nothing is masked): built once, by `prepare`, never in a forward."""
    if spec.mask == "none":
        return None
    rows = spec.batch if spec.mask == "padding" else None  # only padding differs between batch rows
    return create_block_mask(
        masks.mask_mod(spec), B=rows, H=None, Q_LEN=spec.q_len, KV_LEN=spec.seq_len, device=spec.device
    )


def flex_masked_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, mask: BlockMask | None, backend: str = "auto"
) -> torch.Tensor:
    return flex_attention(query, key, value, block_mask=mask, enable_gqa=query.size(1) != key.size(1))


def block_sparsity(spec: AttentionSpec, block_size: int = FLEX_BLOCK_SIZE) -> float:
    """The fraction of (query block, key block) tiles with no visible pair, which flex skips.

    Computed from each query's visible key interval, because `BlockMask.sparsity()` counts the
    partial last block wrongly (it goes negative) when lengths are not multiples of the block size.
    Every mask here gives a block of queries one contiguous range of keys: the first row's first
    key to the last row's last key.
    """
    lo, hi = masks.key_intervals(spec)
    starts = torch.arange(0, spec.q_len, block_size)
    ends = (starts + block_size).clamp(max=spec.q_len) - 1
    first_key_block = lo[starts] // block_size  # [q_blocks]
    last_key_block = hi[:, ends] // block_size  # [rows, q_blocks]
    used = int((last_key_block - first_key_block + 1).sum())
    key_blocks = -(-spec.seq_len // block_size)
    return 1.0 - used / (hi.size(0) * starts.numel() * key_blocks)
