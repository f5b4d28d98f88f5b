"""Float64 attention, the ground truth for `max_abs_error` and, in training, `max_abs_grad_error`.

It takes every mask (both causal alignments, the window, padding) from `masks`, expands key/value
heads for GQA, and works in blocks of query rows so its float64 scores never exceed
`REFERENCE_BLOCK_BYTES`: the reference must not be what stops a fused kernel at long sequence lengths.
Gradients come from autograd on float64 copies, block by block: dQ of a block depends on that block
alone, and dK, dV accumulate over the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attention import masks

if TYPE_CHECKING:
    from attention.spec import AttentionSpec

REFERENCE_BLOCK_BYTES = 256 * 1024**2


@dataclass(frozen=True)
class Reference:
    """The float64 output, and in training mode the float64 (dQ, dK, dV)."""

    output: torch.Tensor
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def block_rows(spec: AttentionSpec, block_bytes: int | None = None) -> int:
    """Query rows per block, so that one block's float64 scores stay within `block_bytes`."""
    row_bytes = spec.batch * spec.heads * spec.seq_len * 8
    return max(1, (block_bytes or REFERENCE_BLOCK_BYTES) // row_bytes)


def reference_attention(
    spec: AttentionSpec,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    grad_out: torch.Tensor | None = None,
) -> Reference:
    """Float64 attention of `spec`'s mask on these inputs; with `grad_out`, also its gradients."""
    q, k, v = (t.detach().double().requires_grad_(grad_out is not None) for t in (query, key, value))
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    rows = block_rows(spec)
    for start in range(0, spec.q_len, rows):
        block = range(start, min(start + rows, spec.q_len))
        with torch.set_grad_enabled(grad_out is not None):
            out_block = _attend(spec, q[..., block.start : block.stop, :], k, v, block)
        if grad_out is not None:
            out_block.backward(grad_out[..., block.start : block.stop, :].double())
        out[..., block.start : block.stop, :] = out_block.detach()
    grads = None if grad_out is None else (q.grad, k.grad, v.grad)
    return Reference(out, grads)  # type: ignore[arg-type]


def _attend(
    spec: AttentionSpec, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rows: range
) -> torch.Tensor:
    groups = spec.heads // spec.kv_heads
    if groups > 1:
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))  # [batch, heads, seq, head_dim]
    scores = query @ key.transpose(-2, -1) * spec.head_dim**-0.5  # [batch, heads, rows, seq]
    visible = masks.visible(spec, rows)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value  # [batch, heads, rows, head_dim]
