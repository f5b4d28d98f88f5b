"""Can this spec run here? `refusal` and `unsupported` give the reason it cannot; `preflight` checks the machine.

The predicates read only the spec and what torch is (no download, no allocation); `preflight` is
the one explicit step that reads the machine: CUDA, free memory, the GPU's capability.
"""

from __future__ import annotations

import os

import torch

from attention.backends import CUDA_ONLY_REASONS
from attention.errors import SpecError
from attention.spec import AttentionSpec, format_bytes

# Leave room for the allocator, the profiler and the rest of the process.
MEMORY_HEADROOM = 0.6
# FlashAttention 2 needs Ampere (sm_80) or newer.
HUB_FLASH_CAPABILITY = (8, 0)


def _flex_refusal(spec: AttentionSpec) -> tuple[str, str] | None:
    if spec.training and spec.device == "cpu":
        # Verified in torch 2.13: eager and compiled flex_attention raise NotImplementedError on CPU
        # inputs that require grad.
        return "mode", (
            "flex_attention has no backward on CPU (eager or compiled); use inference, another variant, or CUDA"
        )
    return None


def _hub_flash_refusal(spec: AttentionSpec) -> tuple[str, str] | None:
    if spec.device != "cuda":
        return "variant", "FlashAttention from the Hub (kernels-community/flash-attn2) runs only on CUDA"
    if spec.dtype == "float32":
        return "variant", "FlashAttention from the Hub needs bfloat16 or float16 inputs, not float32"
    if spec.mask == "padding":
        return "mask", "FlashAttention from the Hub takes padding only through its varlen API, which is not called here"
    if spec.mask == "causal_top_left":
        return "mask", "FlashAttention 2 aligns causal masks to the bottom right only; it cannot do causal_top_left"
    return None


def refusal(spec: AttentionSpec) -> tuple[str, str] | None:
    """`(field, reason)` when `spec` cannot run on its device: the field is `backend` for SDPA, `variant`
    otherwise, or the parameter (`mode`, `mask`) that makes it impossible. None if it can run."""
    if spec.variant == "flex":
        return _flex_refusal(spec)
    if spec.variant == "hub_flash":
        return _hub_flash_refusal(spec)
    if spec.variant == "sdpa" and spec.device == "cpu" and spec.backend in CUDA_ONLY_REASONS:
        return "backend", CUDA_ONLY_REASONS[spec.backend]
    return None  # a pinned CUDA backend is checked by `prepare` on the run's own tensors


def unsupported(spec: AttentionSpec) -> str | None:
    """Why `spec` cannot run on its device, or None if it can."""
    found = refusal(spec)
    return found[1] if found else None


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


def preflight(spec: AttentionSpec) -> AttentionSpec:
    """Check that `spec` can run on this machine now: CUDA, support, capability, memory. Returns it.

    Raises SpecError naming the field: `device`, `backend`/`variant`/`mode`/`mask`, or `seq_len`.
    """
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise SpecError("device", "cuda was asked for, but this machine has no CUDA GPU; use cpu or auto")
    found = refusal(spec)
    if found:
        raise SpecError(*found)
    if spec.variant == "hub_flash" and torch.cuda.get_device_capability() < HUB_FLASH_CAPABILITY:
        raise SpecError("variant", "FlashAttention 2 needs an Ampere (sm_80) or newer GPU")
    need, have = spec.estimated_bytes(), memory_budget(spec.device)
    if need > have:
        raise SpecError(
            "seq_len",
            f"this run needs about {format_bytes(need)} on {spec.device} but only {format_bytes(have)} is "
            "available; lower seq_len, batch or heads",
        )
    return spec
