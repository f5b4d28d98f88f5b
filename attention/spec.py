"""The run specification: one frozen dataclass of plain values, validated once, passed everywhere.

Building a spec reads nothing from the machine except to resolve `device="auto"`; whether the run
fits this machine (CUDA, memory, backend support) is `support.preflight`'s job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from attention import masks, memory
from attention.errors import SpecError, quote
from attention.registry import BACKENDS, VARIANTS, run_label

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DEVICES = ("auto", "cpu", "cuda")
MODES = ("inference", "training")

# Inclusive ranges. Upper bounds keep a public Space from being asked for absurd work;
# `preflight` refuses what is in range but still too big for the device.
LIMITS: dict[str, tuple[int, int]] = {
    "batch": (1, 512),
    "heads": (1, 256),
    "seq_len": (1, 131_072),
    "head_dim": (1, 512),
}


VALID_LEN_ENTRY_CHARS = 20  # one padding length: a few digits, with room for blanks around them


def _check_choice(field: str, value: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(field, f"{quote(value)} is not one of {', '.join(allowed)}")


def _check_int(field: str, value: Any, low: int, high: int, note: str = "") -> None:
    # bool is an int in Python; True as a batch size is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"must be a whole number from {low} to {high}{note}, got {quote(value)}")
    if not low <= value <= high:
        raise SpecError(field, f"must be from {low} to {high}{note}, got {quote(value)}")


def _parse_valid_len(value: Any, batch: int) -> tuple[int, ...]:
    """One int, a comma list, or a sequence of ints, as a tuple; "" and None mean unused.

    Bounded before any parsing: a string of at most `batch` lengths of VALID_LEN_ENTRY_CHARS each, a
    sequence of at most `batch` items; a longer one is refused at once, whatever its size.
    """
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return _parse_valid_len_text(value, batch)
    items = value if isinstance(value, (tuple, list)) else (value,)
    if len(items) > batch:
        raise SpecError("valid_len", f"padding needs one length, or one per batch row ({batch}), got {len(items):,}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise SpecError("valid_len", f"must be a whole number or a comma list of them, got {quote(value)}")
    return tuple(items)


def _parse_valid_len_text(text: str, batch: int) -> tuple[int, ...]:
    most = batch * (VALID_LEN_ENTRY_CHARS + 1)  # each length and its comma
    if len(text) > most:
        raise SpecError(
            "valid_len",
            f"padding needs one length, or one per batch row ({batch}): at most {most:,} characters, got {len(text):,}",
        )
    entries = [t for t in text.split(",") if t.strip()]
    long = next((t for t in entries if len(t) > VALID_LEN_ENTRY_CHARS), None)
    if long is not None:
        raise SpecError("valid_len", f"each length is a whole number of a few digits, got {quote(long)}")
    try:
        return tuple(int(t) for t in entries)
    except ValueError:
        raise SpecError("valid_len", f"must be a whole number or a comma list of them, got {quote(text)}") from None


@dataclass(frozen=True)
class AttentionSpec:
    """What to run: the variant, its SDPA backend, the shape, dtype, device, compile flag, mode and mask.

    Neutral values are resolved at construction: `device="auto"` to `cpu` or `cuda` (the one
    machine read), `kv_heads=0` to `heads`, `q_len=0` to `seq_len`. Values a field's mask does
    not use are reset to neutral (`window` 0, `valid_len` ()), and a non-SDPA variant's backend
    to `auto`, so a form that keeps hidden controls' values still gives one canonical spec.
    `valid_len` is stored as one int per batch row.
    """

    variant: str = "naive"
    backend: str = "auto"
    batch: int = 1
    heads: int = 4
    seq_len: int = 256
    head_dim: int = 64
    dtype: str = "float32"
    device: str = "auto"
    compile: bool = False
    mode: str = "inference"
    kv_heads: int = 0
    q_len: int = 0
    mask: str = "causal"
    window: int = 0
    valid_len: Any = ()

    def __post_init__(self) -> None:
        self._check_choices()
        for field, (low, high) in LIMITS.items():
            _check_int(field, getattr(self, field), low, high)
        if not isinstance(self.compile, bool):
            raise SpecError("compile", f"must be true or false, got {quote(self.compile)}")
        self._resolve_heads_and_lengths()
        self._resolve_mask_values()
        if self.device == "auto":
            object.__setattr__(self, "device", "cuda" if torch.cuda.is_available() else "cpu")
        if len(VARIANTS[self.variant].backends) == 1:
            object.__setattr__(self, "backend", "auto")

    def _check_choices(self) -> None:
        _check_choice("variant", self.variant, tuple(VARIANTS))
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("dtype", self.dtype, tuple(DTYPES))
        _check_choice("device", self.device, DEVICES)
        _check_choice("mode", self.mode, MODES)
        _check_choice("mask", self.mask, masks.MASKS)

    def _resolve_heads_and_lengths(self) -> None:
        _check_int("kv_heads", self.kv_heads, 0, self.heads, " (0 means heads)")
        _check_int("q_len", self.q_len, 0, self.seq_len, " (0 means seq_len)")
        kv_heads = self.kv_heads or self.heads
        if self.heads % kv_heads:
            raise SpecError("kv_heads", f"must divide heads ({self.heads}), got {kv_heads}")
        object.__setattr__(self, "kv_heads", kv_heads)
        object.__setattr__(self, "q_len", self.q_len or self.seq_len)

    def _resolve_mask_values(self) -> None:
        _check_int("window", self.window, 0, LIMITS["seq_len"][1])
        if self.mask == "sliding_window" and not 1 <= self.window <= self.seq_len:
            raise SpecError(
                "window", f"sliding_window needs a window from 1 to seq_len ({self.seq_len}), got {self.window}"
            )
        # Only padding reads valid_len: a hidden field's leftover (or a hostile one) is dropped unparsed.
        valid_len = (
            self._checked_valid_len(_parse_valid_len(self.valid_len, self.batch)) if self.mask == "padding" else ()
        )
        object.__setattr__(self, "window", self.window if self.mask == "sliding_window" else 0)
        object.__setattr__(self, "valid_len", valid_len)

    def _checked_valid_len(self, valid_len: tuple[int, ...]) -> tuple[int, ...]:
        if len(valid_len) == 1:
            valid_len *= self.batch
        if len(valid_len) != self.batch:
            raise SpecError(
                "valid_len", f"padding needs one length, or one per batch row ({self.batch}), got {len(valid_len)}"
            )
        bad = [v for v in valid_len if not 1 <= v <= self.seq_len]
        if bad:
            raise SpecError("valid_len", f"each length must be from 1 to seq_len ({self.seq_len}), got {quote(bad[0])}")
        return valid_len

    def replace(self, **changes: Any) -> AttentionSpec:
        """A copy with `changes`. A q_len equal to seq_len (or kv_heads equal to heads) keeps following
        it, and one padding length for every row keeps applying to every row, unless given."""
        if "seq_len" in changes and "q_len" not in changes and self.q_len == self.seq_len:
            changes["q_len"] = 0
        if "heads" in changes and "kv_heads" not in changes and self.kv_heads == self.heads:
            changes["kv_heads"] = 0
        if "batch" in changes and "valid_len" not in changes and len(set(self.valid_len)) == 1:
            changes["valid_len"] = self.valid_len[:1]
        return dataclasses.replace(self, **changes)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return self.torch_dtype.itemsize

    @property
    def training(self) -> bool:
        return self.mode == "training"

    @property
    def name(self) -> str:
        """A short label: `naive`, `sdpa-flash`, `sdpa-math+compile`."""
        return run_label(self.variant, self.backend, self.compile)

    def estimated_bytes(self) -> int:
        """Peak bytes the whole run allocates: inputs, mask, forward (and backward), the float64 reference."""
        return memory.memory_estimate(self).peak

    def flops(self) -> int:
        """FLOPs of one forward over the unmasked (query, key) pairs only: QK^T and PV, 2 FLOPs per MAC."""
        return 4 * self.head_dim * self.heads * masks.visible_pairs(self)

    def backward_flops(self) -> int:
        """2.5 x the forward, the FlashAttention papers' convention (5 matmuls against 2)."""
        return self.flops() * 5 // 2

    def bytes_moved(self) -> int:
        """Q and O, then K and V, once each: the least memory traffic a fused forward can do."""
        q_side = 2 * self.batch * self.heads * self.q_len * self.head_dim
        kv_side = 2 * self.batch * self.kv_heads * self.seq_len * self.head_dim
        return (q_side + kv_side) * self.itemsize

    def score_bytes(self) -> int:
        """Bytes of one materialised score matrix, `[batch, heads, q_len, seq_len]` (what fusion saves)."""
        return self.batch * self.heads * self.q_len * self.seq_len * self.itemsize

    def as_dict(self) -> dict[str, Any]:
        """Every field, resolved; `valid_len` as a list."""
        fields = dataclasses.asdict(self)
        fields["valid_len"] = list(self.valid_len)
        return fields


# Named starting points, as in gpt-fast's `transformer_configs`.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-small": dict(batch=1, heads=4, seq_len=256, head_dim=64, dtype="float32"),
    "blog": dict(batch=8, heads=16, seq_len=1024, head_dim=64, dtype="bfloat16"),
}


def format_bytes(n: float) -> str:
    """`1536` -> `1.5 KiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
