"""A spec bound to its seeded inputs and its mask, built once: each call is then one forward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attention.backends import backend_reasons
from attention.errors import SpecError
from attention.hub_flash import load_hub_flash
from attention.reference import Reference, reference_attention
from attention.registry import VARIANTS, AttentionFn
from attention.spec import AttentionSpec


def make_inputs(spec: AttentionSpec, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded q `[batch, heads, q_len, head_dim]` and k, v `[batch, kv_heads, seq_len, head_dim]`.

    In training mode they require grad.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    shapes = [(spec.batch, spec.heads, spec.q_len, spec.head_dim)]
    shapes += [(spec.batch, spec.kv_heads, spec.seq_len, spec.head_dim)] * 2
    # Drawn on the CPU so the same seed gives the same inputs on every device.
    return tuple(  # type: ignore[return-value]
        torch.randn(shape, generator=generator)
        .to(device=spec.device, dtype=spec.torch_dtype)
        .requires_grad_(spec.training)
        for shape in shapes
    )


def upstream_gradient(spec: AttentionSpec, seed: int = 0) -> torch.Tensor:
    """The fixed gradient a training step sends back into the attention output (seeded apart from the inputs)."""
    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    shape = (spec.batch, spec.heads, spec.q_len, spec.head_dim)
    return torch.randn(shape, generator=generator).to(device=spec.device, dtype=spec.torch_dtype)


def build(spec: AttentionSpec) -> AttentionFn:
    """The spec's attention function, wrapped in `torch.compile` when asked."""
    fn = VARIANTS[spec.variant].fn
    return torch.compile(fn) if spec.compile else fn  # type: ignore[return-value]


@dataclass
class Prepared:
    """A spec with its inputs, its variant's mask and, in training, its upstream gradient."""

    spec: AttentionSpec
    fn: AttentionFn
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: Any
    grad_out: torch.Tensor | None = None

    def __call__(self) -> torch.Tensor:
        """One forward."""
        return self.fn(self.query, self.key, self.value, mask=self.mask, backend=self.spec.backend)

    def backward(self, out: torch.Tensor) -> None:
        """One backward of `out` (a forward's output) with the fixed upstream gradient.

        The gradients land on `query.grad`, `key.grad` and `value.grad`; the previous step's are
        dropped first (set to None, as `zero_grad` does), so each step's are its own.
        """
        if self.grad_out is None:
            raise RuntimeError("backward() needs a spec with mode='training'")
        for tensor in (self.query, self.key, self.value):
            tensor.grad = None
        out.backward(self.grad_out)

    def reference(self) -> Reference:
        """Float64 output on the same inputs, and in training the float64 dQ, dK, dV."""
        return reference_attention(self.spec, self.query, self.key, self.value, self.grad_out)


def prepare(spec: AttentionSpec, seed: int = 0) -> Prepared:
    """Build the spec's function, inputs, mask and upstream gradient once.

    For `hub_flash` this is where the kernel is downloaded (SpecError("variant") if it cannot be).
    Raises SpecError("backend") when a pinned SDPA backend refuses this very call.
    """
    if spec.variant == "hub_flash":
        loaded = load_hub_flash()
        if isinstance(loaded, str):
            raise SpecError("variant", loaded)
    query, key, value = make_inputs(spec, seed)
    grad_out = upstream_gradient(spec, seed) if spec.training else None
    mask = VARIANTS[spec.variant].make_mask(spec)
    prepared = Prepared(spec, build(spec), query, key, value, mask, grad_out)
    _check_pinned_backend(prepared)
    return prepared


def _check_pinned_backend(prepared: Prepared) -> None:
    backend = prepared.spec.backend
    if prepared.spec.variant == "sdpa" and backend != "auto":
        reason = backend_reasons(prepared).get(backend)
        if reason:
            raise SpecError("backend", reason)
