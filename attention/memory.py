"""How many bytes a whole run allocates at its peak, counted allocation by allocation.

A run holds its inputs (and, in training, their gradients and the upstream gradient) and output
throughout; builds its dense mask once (only the variants that take one); then runs forwards (and
backwards), in which SDPA turns a dense mask into a float one on every call; and last the float64
reference. The peak is the persistent part plus the larger of the forward's and the reference's
temporaries. Score matrices are `[batch, heads, q_len, seq_len]`.

It counts live tensors. glibc serves allocations under its mmap threshold (32 MiB at most) from a heap
that keeps freed memory, so a run made of many small blocks can hold a few times their size in RSS;
at the sizes where memory matters, tensors are larger than that and are returned on free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from attention.reference import block_rows

if TYPE_CHECKING:
    from attention.spec import AttentionSpec

# Score matrices alive at the forward's peak (inference) and at the backward's peak (training), measured
# on CPU with torch 2.13 at 1x16x2048x64 (tests/attention/test_memory.py holds the estimate to 2x of the
# peak RSS growth): naive and in-place hold the scaled scores and the next result at once (masked_fill_
# saves a copy's traffic, not its peak); in training the saved probabilities stay while the backward holds
# two gradients of the scores. The math backend and eager flex compute their scores in float32 whatever
# the inputs' dtype (bfloat16 math measured 685 MiB against 645 MiB in float32).
SCORE_MATRICES: dict[str, tuple[int, int]] = {
    "naive": (2, 3),
    "inplace": (2, 3),
    "math": (3, 4),
    "flex": (4, 5),
    "fused": (0, 0),
}
# Score kinds that compute in float32 whatever the inputs' dtype.
FLOAT32_SCORES = ("math", "flex")
# Float64 score blocks alive at the reference's peak, without and with autograd.
REFERENCE_BLOCKS = (2, 4)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes by stage; `peak` is what `AttentionSpec.estimated_bytes()` reports. `forward` includes SDPA's
    per-call float mask (`sdpa_mask_per_call_bytes`)."""

    inputs: int
    mask_build: int
    mask: int
    forward: int
    reference: int

    @property
    def peak(self) -> int:
        return self.inputs + max(self.mask_build, self.mask + max(self.forward, self.reference))


def score_kind(spec: AttentionSpec) -> str:
    """naive, inplace, math, flex or fused: what decides how many score matrices a forward holds."""
    if spec.variant in ("naive", "inplace"):
        return spec.variant
    if spec.variant == "sdpa" and spec.backend == "math":
        return "math"
    if spec.variant == "flex" and not spec.compile:
        return "flex"  # eager flex_attention is an unfused reference implementation
    return "fused"


def _tensor_bytes(spec: AttentionSpec, itemsize: int) -> tuple[int, int]:
    """Bytes of one query-shaped tensor and of one key-shaped tensor at `itemsize`."""
    q_side = spec.batch * spec.heads * spec.q_len * spec.head_dim * itemsize
    kv_side = spec.batch * spec.kv_heads * spec.seq_len * spec.head_dim * itemsize
    return q_side, kv_side


def _inputs(spec: AttentionSpec) -> int:
    q_side, kv_side = _tensor_bytes(spec, spec.itemsize)
    tensors = 2 * q_side + 2 * kv_side  # q, k, v and the output the runner keeps
    return tensors * 2 if spec.training else tensors  # + dQ, dK, dV and the upstream gradient


def dense_mask_bytes(spec: AttentionSpec) -> tuple[int, int]:
    """(peak while building, kept) bytes of the dense mask `prepare` builds; (0, 0) when the variant takes none."""
    dense = spec.variant in ("naive", "inplace") or (
        spec.variant == "sdpa" and spec.mask in ("sliding_window", "padding")
    )
    if not dense or spec.mask == "none":
        return 0, 0
    plane = spec.q_len * spec.seq_len  # one bool per (query, key)
    if spec.mask == "padding":
        return plane * (spec.batch + 1), plane * spec.batch
    if spec.mask == "sliding_window":
        return 3 * plane, plane  # two comparisons and their `&`
    return plane, plane


def _forward(spec: AttentionSpec) -> int:
    q_side, kv_side = _tensor_bytes(spec, spec.itemsize)
    kind = score_kind(spec)
    matrices = SCORE_MATRICES[kind][spec.training]
    score_itemsize = max(4, spec.itemsize) if kind in FLOAT32_SCORES else spec.itemsize
    scores = matrices * spec.batch * spec.heads * spec.q_len * spec.seq_len * score_itemsize
    expanded = 2 * kv_side * spec.heads // spec.kv_heads if kind != "fused" and spec.kv_heads != spec.heads else 0
    return scores + expanded * (2 if spec.training else 1) + sdpa_mask_per_call_bytes(spec) + q_side


def sdpa_mask_per_call_bytes(spec: AttentionSpec) -> int:
    """Bytes of the dense mask SDPA builds inside each call, alive through the kernel (0 for other variants).

    SDPA turns a boolean `attn_mask` into an additive float mask of the query's dtype on every call,
    one item per mask element: `[q_len, seq_len]`, or `[batch, 1, q_len, seq_len]` for padding (it is not
    broadcast over heads). `causal_lower_right` first materialises its boolean `[q_len, seq_len]`, so it
    costs 1 + itemsize bytes per element; the math backend builds `is_causal`'s mask itself in float32.
    Measured on CPU, torch 2.13, 1x1x8192x8 (tests/attention/test_memory_masks.py): 4.0 bytes per element
    for flash and float32 (2.0 in bfloat16), 5.0 for causal_lower_right (3.1), and math's is_causal
    13 bytes per score element against 9 with no mask.
    """
    if spec.variant != "sdpa" or spec.mask == "none":
        return 0
    plane = spec.q_len * spec.seq_len
    if spec.mask in ("sliding_window", "padding"):
        return dense_mask_bytes(spec)[1] * spec.itemsize  # the kept boolean mask, one byte per element
    if spec.mask == "causal" and spec.q_len != spec.seq_len:
        return plane * (1 + spec.itemsize)  # causal_lower_right: where no fused CUDA kernel takes it
    return plane * max(4, spec.itemsize) if score_kind(spec) == "math" else 0  # is_causal


def _reference(spec: AttentionSpec) -> int:
    q_side, kv_side = _tensor_bytes(spec, 8)
    copies = 2 * q_side + 2 * kv_side  # float64 q, k, v and the output
    if spec.training:
        copies += 2 * q_side + 2 * kv_side  # their gradients and the upstream gradient
    rows = min(block_rows(spec), spec.q_len)
    block = spec.batch * spec.heads * rows * spec.seq_len * 8
    mask_block = rows * spec.seq_len * (spec.batch if spec.mask == "padding" else 1) * 2
    expanded = 2 * kv_side * spec.heads // spec.kv_heads if spec.kv_heads != spec.heads else 0
    return copies + REFERENCE_BLOCKS[spec.training] * block + mask_block + expanded


def memory_estimate(spec: AttentionSpec) -> MemoryEstimate:
    """Every allocation of `prepare()`, the forwards (and backwards) and `reference()`, by stage."""
    mask_build, mask = dense_mask_bytes(spec)
    return MemoryEstimate(_inputs(spec), mask_build, mask, _forward(spec), _reference(spec))
