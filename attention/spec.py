"""The run specification: one frozen dataclass, validated once, passed everywhere."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch

VARIANTS = ("naive", "inplace", "sdpa", "flex", "hub_flash")
BACKENDS = ("auto", "math", "flash", "efficient", "cudnn")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DEVICES = ("auto", "cpu", "cuda")

# Inclusive ranges. Upper bounds keep a public Space from being asked for absurd work;
# the memory guard below refuses what is in range but still too big for the device.
LIMITS: dict[str, tuple[int, int]] = {
    "batch": (1, 512),
    "heads": (1, 256),
    "seq_len": (1, 131_072),
    "head_dim": (1, 512),
}

# How many seq x seq score matrices each kind keeps alive at its peak, in its compute
# dtype: naive holds scores, the masked copy and the probabilities; in-place drops the copy;
# math upcasts to float32 and also holds the safe-softmax select; eager flex materialises
# like naive. Fused kernels never materialise one.
SCORE_MATRICES = {"naive": 3, "inplace": 2, "math": 4, "fused": 0}

# The float64 reference attention works in query blocks of at most this many score bytes.
REFERENCE_BLOCK_BYTES = 256 * 1024**2

# Leave room for the allocator, the float64 reference and the profiler itself.
MEMORY_HEADROOM = 0.6


class SpecError(ValueError):
    """A spec that cannot be run. The message names the field and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _check_choice(field: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(field, f"{value!r} is not one of {', '.join(allowed)}")


def _check_int(field: str, value: Any) -> None:
    low, high = LIMITS[field]
    # bool is an int in Python; True as a batch size is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"must be a whole number from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise SpecError(field, f"must be from {low} to {high}, got {value}")


def cuda_available() -> bool:
    return torch.cuda.is_available()


def available_bytes(device: str) -> int:
    """Memory a run may use on `device` right now."""
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_budget(device: str) -> int:
    """The bytes a run may plan to use on `device`: what is free, less headroom."""
    return int(available_bytes(device) * MEMORY_HEADROOM)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class AttentionSpec:
    """What to run: the variant, its SDPA backend, the shape, dtype, device and compile flag.

    `device="auto"` is resolved to a concrete device at construction, so every later
    reader sees `cpu` or `cuda`.
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

    def __post_init__(self) -> None:
        _check_choice("variant", self.variant, VARIANTS)
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("dtype", self.dtype, tuple(DTYPES))
        _check_choice("device", self.device, DEVICES)
        for field in LIMITS:
            _check_int(field, getattr(self, field))
        if not isinstance(self.compile, bool):
            raise SpecError("compile", f"must be true or false, got {self.compile!r}")
        if self.device == "cuda" and not cuda_available():
            raise SpecError("device", "cuda was asked for, but this machine has no CUDA GPU; use cpu or auto")
        if self.device == "auto":
            object.__setattr__(self, "device", "cuda" if cuda_available() else "cpu")
        self._check_memory()

    def replace(self, **changes: Any) -> AttentionSpec:
        return dataclasses.replace(self, **changes)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return self.torch_dtype.itemsize

    @property
    def memory_kind(self) -> str:
        """naive, inplace, math or fused: what decides how much memory a run needs."""
        if self.variant in ("naive", "inplace"):
            return self.variant
        if self.variant == "sdpa" and self.backend == "math":
            return "math"
        if self.variant == "flex" and not self.compile:
            return "naive"  # eager flex_attention is an unfused reference implementation
        return "fused"

    @property
    def name(self) -> str:
        """A short label: `naive`, `sdpa-flash`, `sdpa-math+compile`."""
        label = f"sdpa-{self.backend}" if self.variant == "sdpa" else self.variant
        return label + ("+compile" if self.compile else "")

    def estimated_bytes(self, seq_len: int | None = None) -> int:
        """Peak bytes a forward needs: q, k, v, out, plus its live score matrices.

        `seq_len` overrides the spec's own, so a sweep can look ahead without building specs
        the memory guard would refuse.
        """
        b, h, s, d = self.batch, self.heads, seq_len or self.seq_len, self.head_dim
        tensors = 4 * b * h * s * d * self.itemsize
        score_itemsize = 4 if self.memory_kind == "math" else self.itemsize
        scores = SCORE_MATRICES[self.memory_kind] * b * h * s * s * score_itemsize
        # The float64 reference: its inputs and output, plus one block of scores and probabilities.
        reference = 4 * b * h * s * d * 8 + 2 * min(b * h * s * s * 8, REFERENCE_BLOCK_BYTES)
        return tensors + scores + reference

    def _check_memory(self) -> None:
        need = self.estimated_bytes()
        have = memory_budget(self.device)
        if need > have:
            raise SpecError(
                "seq_len",
                f"this shape needs about {format_bytes(need)} on {self.device} but only "
                f"{format_bytes(have)} is available; lower seq_len, batch or heads",
            )

    def flops(self) -> int:
        """Useful FLOPs of one causal forward: QK^T and PV over the unmasked half only."""
        b, h, s, d = self.batch, self.heads, self.seq_len, self.head_dim
        unmasked = s * (s + 1) // 2
        return 2 * 2 * b * h * unmasked * d

    def score_bytes(self) -> int:
        """Bytes written and read by one materialised score matrix (what fusion saves)."""
        return self.batch * self.heads * self.seq_len**2 * self.itemsize

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Named starting points, as in gpt-fast's `transformer_configs`.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-small": dict(batch=1, heads=4, seq_len=256, head_dim=64, dtype="float32"),
    "blog": dict(batch=8, heads=16, seq_len=1024, head_dim=64, dtype="bfloat16"),
}
