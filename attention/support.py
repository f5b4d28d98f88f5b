"""Can this spec run here? `refusal` and `unsupported` give the reason it cannot; `preflight` checks the machine.

The predicates read only the spec and what torch is (no download, no allocation); `preflight` is
the one explicit step that reads the machine: CUDA, free memory, the GPU's capability, and on the CPU
the machine budget that analyses share (`attention.budget`). `admit_run` is preflight plus holding the
run's estimate in that budget while it runs.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator

import torch

from attention.backends import CUDA_ONLY_REASONS
from attention.budget import machine_budget
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


# Bytes the current run already holds in the machine budget (set by `admit_run`): a preflight inside it,
# as `runner.measure` makes when it runs in this process, must not count the run against itself.
_HELD_HERE: contextvars.ContextVar[int] = contextvars.ContextVar("held_here", default=0)


def memory_budget(device: str) -> int:
    """The bytes a run may plan to use on `device` now: what is free, less headroom, and on the CPU no
    more than the machine budget has left beside the runs and analyses that hold it."""
    free = int(available_bytes(device) * MEMORY_HEADROOM)
    if device != "cpu":
        return free
    return min(free, machine_budget().available_bytes() + _HELD_HERE.get())


def _check_memory(spec: AttentionSpec) -> None:
    need, budget = spec.estimated_bytes(), machine_budget()
    fix = "lower seq_len, batch or heads"
    have = int(available_bytes(spec.device) * MEMORY_HEADROOM)
    if need > have:
        raise SpecError(
            "seq_len",
            f"this run needs about {format_bytes(need)} on {spec.device} but only {format_bytes(have)} is "
            f"available; {fix}",
        )
    if spec.device != "cpu":
        return
    if need > budget.budget_bytes:
        raise SpecError(
            "seq_len",
            f"this run needs about {format_bytes(need)} but this server allows {format_bytes(budget.budget_bytes)} "
            f"for runs and analyses together; {fix}",
        )
    if need > budget.available_bytes() + _HELD_HERE.get():
        raise SpecError(
            "seq_len",
            f"this run needs about {format_bytes(need)}, more than is left now: {budget.holders()}; {fix}, "
            "or try again when they finish",
        )


def preflight(spec: AttentionSpec) -> AttentionSpec:
    """Check that `spec` can run on this machine now: CUDA, support, capability, memory. Returns it.

    Raises SpecError naming the field: `device`, `backend`/`variant`/`mode`/`mask`, or `seq_len` (the
    memory: what is free, and on the CPU the machine budget shared with analyses).
    """
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise SpecError("device", "cuda was asked for, but this machine has no CUDA GPU; use cpu or auto")
    found = refusal(spec)
    if found:
        raise SpecError(*found)
    if spec.variant == "hub_flash" and torch.cuda.get_device_capability() < HUB_FLASH_CAPABILITY:
        raise SpecError("variant", "FlashAttention 2 needs an Ampere (sm_80) or newer GPU")
    _check_memory(spec)
    return spec


@contextlib.contextmanager
def admit_run(
    spec: AttentionSpec, wait_s: float = 0.0, cancelled: Callable[[], bool] | None = None
) -> Iterator[AttentionSpec]:
    """`preflight(spec)`, then hold its estimated peak in the machine budget until the block ends (CPU runs:
    a CUDA run's memory is the GPU's). While it holds, an analysis that would not fit beside it waits.

    Wrap the whole run in it, in the process that admits analyses (the app's), around the worker call.
    Raises SpecError("seq_len") when the budget has no room after `wait_s` seconds (at once by default).
    """
    preflight(spec)
    if spec.device != "cpu":
        yield spec
        return
    need = spec.estimated_bytes()
    with machine_budget().admit(need, field="seq_len", kind="run", wait_s=wait_s, cancelled=cancelled, error=SpecError):
        token = _HELD_HERE.set(_HELD_HERE.get() + need)
        try:
            yield spec
        finally:
            _HELD_HERE.reset(token)
