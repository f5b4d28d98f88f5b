"""Every variant in one place: its name, label, SDPA backends, function and mask builder, and the run names.

As transformers' `ALL_ATTENTION_FUNCTIONS`: every function takes `(query, key, value, *, mask, backend)`
and returns `[batch, heads, q_len, head_dim]`. `mask` is whatever that variant's `make_mask` built once,
outside the forward: a dense boolean tensor, SDPA's mask arguments, a flex `BlockMask`, or None.
Dropdowns, the CLI's choices and help, Compare and Sweep are all built from this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from attention import masks
from attention.errors import SpecError, quote
from attention.flex import flex_mask, flex_masked_attention
from attention.hub_flash import hub_flash_attention, hub_flash_mask
from attention.inplace import inplace_attention
from attention.naive import naive_attention
from attention.sdpa import SDPA_BACKENDS, sdpa_attention, sdpa_mask

if TYPE_CHECKING:
    from attention.spec import AttentionSpec


class AttentionFn(Protocol):
    def __call__(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, mask: Any, backend: str = "auto"
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class Variant:
    """One attention implementation. `backends` is ("auto",) for all but SDPA."""

    name: str
    label: str
    fn: AttentionFn
    backends: tuple[str, ...]
    make_mask: Callable[[AttentionSpec], Any]


BACKENDS: tuple[str, ...] = ("auto", *SDPA_BACKENDS)
VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("naive", "naive", naive_attention, ("auto",), masks.hidden),
        Variant("inplace", "in-place", inplace_attention, ("auto",), masks.hidden),
        Variant("sdpa", "SDPA", sdpa_attention, BACKENDS, sdpa_mask),
        Variant("flex", "flex_attention", flex_masked_attention, ("auto",), flex_mask),
        Variant("hub_flash", "FlashAttention from the Hub", hub_flash_attention, ("auto",), hub_flash_mask),
    )
}
VARIANT_CHOICES: list[tuple[str, str]] = [(v.label, v.name) for v in VARIANTS.values()]

# What Compare runs: the blog's six first, then what came after it.
RUNS: tuple[tuple[str, str], ...] = (
    ("naive", "auto"),
    ("inplace", "auto"),
    ("sdpa", "math"),
    ("sdpa", "flash"),
    ("sdpa", "efficient"),
    ("sdpa", "cudnn"),
    ("flex", "auto"),
    ("hub_flash", "auto"),
)
BLOG_RUNS = RUNS[:6]


def run_label(variant: str, backend: str = "auto", compile: bool = False) -> str:
    """A short name: `naive`, `sdpa-flash`, `sdpa-math+compile`. SDPA always names its backend."""
    label = f"{variant}-{backend}" if len(VARIANTS[variant].backends) > 1 else variant
    return label + ("+compile" if compile else "")


RUN_NAMES: tuple[str, ...] = tuple(run_label(v, b) for v, b in RUNS)
# The longest comma list `parse_runs` or `parse_seq_lens` reads: every run, or 64 lengths of 7 digits,
# with room for blanks; a longer one is refused before it is split.
MAX_LIST_CHARS = 1024
# Every name `parse_run` takes: the runs, plus SDPA's `auto` spelled both ways.
RUN_CHOICES: tuple[str, ...] = (*RUN_NAMES[:2], "sdpa", "sdpa-auto", *RUN_NAMES[2:])


def parse_run(text: str) -> tuple[str, str]:
    """`sdpa-flash` -> ("sdpa", "flash"); `naive` -> ("naive", "auto"); `sdpa` -> ("sdpa", "auto")."""
    name = text.strip()
    variant, _, backend = name.partition("-")
    if name not in RUN_CHOICES:
        raise SpecError("variants", f"{quote(name)} is not one of {', '.join(RUN_CHOICES)}")
    return variant, backend or "auto"


def parse_runs(text: str) -> list[tuple[str, str]]:
    """`naive, sdpa-flash` -> [("naive", "auto"), ("sdpa", "flash")]; refuses an empty list and duplicates."""
    if not isinstance(text, str):
        raise SpecError("variants", f"must be a comma list of {', '.join(RUN_CHOICES)}; got {quote(text)}")
    if len(text) > MAX_LIST_CHARS:
        raise SpecError("variants", f"give at most {MAX_LIST_CHARS:,} characters, got {len(text):,}")
    runs = [parse_run(item) for item in text.split(",") if item.strip()]
    if not runs:
        raise SpecError("variants", f"give at least one of {', '.join(RUN_CHOICES)}")
    repeated = sorted({run_label(*run) for run in runs if runs.count(run) > 1})
    if repeated:
        raise SpecError("variants", f"each variant once, please: {', '.join(repeated)} given more than once")
    return runs


def parse_seq_lens(text: str) -> list[int]:
    """`128,256` -> [128, 256]; each value is then checked by the spec like any seq_len."""
    if not isinstance(text, str):
        raise SpecError("seq_lens", f"must be a comma list of whole numbers, got {quote(text)}")
    if len(text) > MAX_LIST_CHARS:
        raise SpecError("seq_lens", f"give at most {MAX_LIST_CHARS:,} characters, got {len(text):,}")
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SpecError("seq_lens", f"must be a comma list of whole numbers, got {quote(text)}") from None
    if not values:
        raise SpecError("seq_lens", "give at least one seq_len, e.g. 128,256,512")
    return values
