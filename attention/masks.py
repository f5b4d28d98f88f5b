"""Which (query, key) pairs a run attends to, defined once.

Each mask is a predicate over index tensors, like attention-gym's `mask_mod`s: flex uses it as is,
and the dense masks of the eager variants, SDPA and the float64 reference are built from it.
Query i sits at key position `p = i + offset`: bottom-right alignment (`offset = seq_len - q_len`,
the last query sees every key, as in KV-cache decode) except for `causal_top_left`, which is what
SDPA's `is_causal=True` computes (`offset = 0`).

`key_intervals` states the same masks a second way, as each query's first and last visible key,
which the FLOP count and flex's block sparsity use without building an S x S tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from attention.spec import AttentionSpec

MASKS = ("causal", "causal_top_left", "none", "sliding_window", "padding")
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def key_offset(spec: AttentionSpec) -> int:
    """The key position of query 0."""
    return 0 if spec.mask == "causal_top_left" else spec.seq_len - spec.q_len


def _position(q_idx: torch.Tensor, offset: int) -> torch.Tensor:
    # No add at all for offset 0: eager flex calls the mask_mod in every forward, and the default
    # run must keep today's ops.
    return q_idx + offset if offset else q_idx


def mask_mod(spec: AttentionSpec) -> MaskMod | None:
    """The spec's mask as a predicate `(batch, head, q_idx, kv_idx) -> attend?`; None when nothing is masked."""
    offset = key_offset(spec)
    if spec.mask == "none":
        return None
    if spec.mask in ("causal", "causal_top_left"):

        def causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            return _position(q_idx, offset) >= kv_idx

        return causal
    if spec.mask == "sliding_window":
        window = spec.window

        def sliding_window(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            position = _position(q_idx, offset)
            return (position >= kv_idx) & (position - window < kv_idx)

        return sliding_window
    valid = torch.tensor(spec.valid_len, device=spec.device)

    def padding(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (_position(q_idx, offset) >= kv_idx) & (kv_idx < valid[b])

    return padding


def visible(spec: AttentionSpec, rows: range | None = None) -> torch.Tensor | None:
    """Dense boolean mask, True = attend: `[rows, seq_len]`, or `[batch, 1, rows, seq_len]` for padding.

    `rows` picks query rows (all by default), so the reference can build its mask block by block.
    None when the mask hides nothing.
    """
    predicate = mask_mod(spec)
    if predicate is None:
        return None
    rows = rows if rows is not None else range(spec.q_len)
    device = spec.device
    q_idx = torch.arange(rows.start, rows.stop, device=device)[:, None]
    kv_idx = torch.arange(spec.seq_len, device=device)[None, :]
    zero = torch.zeros((), dtype=torch.int64, device=device)  # the head, and the batch row where it does not matter
    batch = torch.arange(spec.batch, device=device)[:, None, None, None] if spec.mask == "padding" else zero
    return predicate(batch, zero, q_idx, kv_idx)


def hidden(spec: AttentionSpec) -> torch.Tensor | None:
    """`visible` inverted in place (True = masked), the form `masked_fill` takes."""
    mask = visible(spec)
    return None if mask is None else mask.logical_not_()


def key_intervals(spec: AttentionSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's first and last visible key: `lo` of shape `[q_len]`, `hi` of `[rows, q_len]`.

    `hi` has one row per batch row for padding (its keys depend on the row), else one row for all.
    Every mask here leaves each query at least one key (key 0, or the query's own position).
    """
    position = torch.arange(spec.q_len, dtype=torch.int64) + key_offset(spec)
    last_key = spec.seq_len - 1
    if spec.mask == "none":
        return torch.zeros_like(position), torch.full((1, spec.q_len), last_key)
    hi = position.clamp(max=last_key)[None, :]
    lo = torch.zeros_like(position)
    if spec.mask == "sliding_window":
        lo = (position - spec.window + 1).clamp(min=0)
    if spec.mask == "padding":
        valid = torch.tensor(spec.valid_len, dtype=torch.int64)[:, None]
        hi = torch.minimum(hi, valid - 1)
    return lo, hi


def visible_pairs(spec: AttentionSpec) -> int:
    """Unmasked (query, key) pairs summed over the batch rows: what the FLOPs count."""
    lo, hi = key_intervals(spec)
    per_row = (hi - lo[None, :] + 1).sum(dim=1)  # one entry, or one per batch row for padding
    total = int(per_row.sum())
    return total * spec.batch if per_row.numel() == 1 else total
