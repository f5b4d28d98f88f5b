"""Attention variants behind one registry, as transformers' `ALL_ATTENTION_FUNCTIONS`.

Every variant takes `(query, key, value, *, mask, backend)` and returns the attention output
`[batch, heads, seq, head_dim]`. `mask` is the causal mask `[seq, seq]` (True = masked),
built once outside the forward; variants that mask by themselves ignore it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from attention.flex import flex_causal_attention
from attention.hub_flash import hub_flash_attention
from attention.inplace import inplace_attention
from attention.naive import naive_attention
from attention.sdpa import SDPA_BACKENDS, sdpa_attention
from attention.spec import (
    BACKENDS,
    DEVICES,
    DTYPES,
    LIMITS,
    PRESETS,
    REFERENCE_BLOCK_BYTES,
    VARIANTS,
    AttentionSpec,
    SpecError,
    format_bytes,
)
from attention.support import unsupported


class AttentionFn(Protocol):
    def __call__(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, mask: torch.Tensor, backend: str = "auto"
    ) -> torch.Tensor: ...


ATTENTION_FUNCTIONS: dict[str, AttentionFn] = {
    "naive": naive_attention,
    "inplace": inplace_attention,
    "sdpa": sdpa_attention,
    "flex": flex_causal_attention,
    "hub_flash": hub_flash_attention,
}


def causal_mask(seq_len: int, device: torch.device | str) -> torch.Tensor:
    """`[seq, seq]` boolean, True above the diagonal: the positions a query may not see."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)


def make_inputs(spec: AttentionSpec, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded q, k, v of the spec's shape and dtype, on its device."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    shape = (spec.batch, spec.heads, spec.seq_len, spec.head_dim)
    # Drawn on the CPU so the same seed gives the same inputs on every device.
    return tuple(  # type: ignore[return-value]
        torch.randn(shape, generator=generator).to(device=spec.device, dtype=spec.torch_dtype) for _ in range(3)
    )


def reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Float64 causal attention, the ground truth for `max_abs_error`.

    Queries go in blocks so the float64 scores never exceed `REFERENCE_BLOCK_BYTES`: the
    reference must not be what stops a fused kernel at long sequence lengths.
    """
    q, k, v = (t.double() for t in (query, key, value))
    batch, heads, seq, _ = q.shape
    rows = max(1, REFERENCE_BLOCK_BYTES // (batch * heads * seq * 8))
    mask = causal_mask(seq, q.device)
    out = torch.empty_like(q[..., : v.size(-1)])
    for start in range(0, seq, rows):
        block = slice(start, start + rows)
        scores = (q[..., block, :] @ k.transpose(-2, -1)) * q.size(-1) ** -0.5  # [batch, heads, rows, seq]
        out[..., block, :] = torch.softmax(scores.masked_fill(mask[block], float("-inf")), dim=-1) @ v
    return out


def build(spec: AttentionSpec) -> AttentionFn:
    """The spec's attention function, wrapped in `torch.compile` when asked."""
    fn = ATTENTION_FUNCTIONS[spec.variant]
    return torch.compile(fn) if spec.compile else fn  # type: ignore[return-value]


@dataclass
class Prepared:
    """A spec bound to its seeded inputs and mask: call it to run one forward."""

    spec: AttentionSpec
    fn: AttentionFn
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor

    def __call__(self) -> torch.Tensor:
        return self.fn(self.query, self.key, self.value, mask=self.mask, backend=self.spec.backend)

    def reference(self) -> torch.Tensor:
        return reference_attention(self.query, self.key, self.value)


def prepare(spec: AttentionSpec, seed: int = 0) -> Prepared:
    """Build the spec's function, inputs and causal mask once; each call is then one forward."""
    query, key, value = make_inputs(spec, seed)
    return Prepared(spec, build(spec), query, key, value, causal_mask(spec.seq_len, spec.device))


__all__ = [
    "ATTENTION_FUNCTIONS",
    "BACKENDS",
    "DEVICES",
    "DTYPES",
    "LIMITS",
    "PRESETS",
    "SDPA_BACKENDS",
    "VARIANTS",
    "AttentionFn",
    "AttentionSpec",
    "Prepared",
    "SpecError",
    "build",
    "causal_mask",
    "format_bytes",
    "make_inputs",
    "prepare",
    "reference_attention",
    "unsupported",
]
