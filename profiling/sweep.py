"""Sequence-length sweep: forward time and peak memory against seq_len, per variant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attention import AttentionSpec, SpecError, format_bytes
from attention.spec import memory_budget
from profiling.compare import forward_ms, run_label
from profiling.runner import Progress, RunError, profile_attention

DEFAULT_SEQ_LENS = (128, 256, 512, 1024, 2048)
MAX_POINTS = 64


def sweep(
    base: AttentionSpec,
    variants: list[tuple[str, str]],
    seq_lens: list[int],
    trace_dir: str | Path,
    progress: Progress | None = None,
    budget_bytes: int | None = None,
    time_limit_s: float | None = None,
) -> list[dict[str, Any]]:
    """One row per (variant, seq_len) that ran, plus one `stopped` row where a variant stopped.

    A variant stops before the memory guard would refuse it: at the first seq_len whose
    estimated memory exceeds `budget_bytes` (default: what the device has free, with headroom).
    """
    report = progress or (lambda fraction, message: None)
    seq_lens = sorted(set(seq_lens))
    if not seq_lens or len(seq_lens) * len(variants) > MAX_POINTS:
        raise SpecError(
            "seq_lens", f"give 1 to {MAX_POINTS // max(len(variants), 1)} seq_len values for {len(variants)} variant(s)"
        )
    budget = memory_budget(base.device) if budget_bytes is None else budget_bytes
    rows: list[dict[str, Any]] = []
    total = len(variants) * len(seq_lens)
    for v, (variant, backend) in enumerate(variants):
        for s, seq_len in enumerate(seq_lens):
            done = v * len(seq_lens) + s
            label = run_label({"variant": variant, "backend": backend, "compile": base.compile})
            report(done / total, f"{label} at seq_len {seq_len}")
            need = base.replace(variant=variant, backend=backend, seq_len=1).estimated_bytes(seq_len=seq_len)
            if need > budget:
                rows.append(
                    _stopped(
                        label, seq_len, f"needs about {format_bytes(need)}, over the {format_bytes(budget)} budget"
                    )
                )
                break
            try:
                spec = base.replace(variant=variant, backend=backend, seq_len=seq_len)
                result = profile_attention(spec, trace_dir, time_limit_s=time_limit_s)
            except (SpecError, RunError) as exc:
                rows.append(_stopped(label, seq_len, str(exc)))
                break
            summary = result.summary
            rows.append(
                {
                    "run": label,
                    "seq_len": seq_len,
                    "status": "ok",
                    "forward_ms": forward_ms(summary),
                    "peak_memory_bytes": summary["peak_memory_bytes"],
                    "kernels_per_forward": summary["kernels_per_forward"],
                    "achieved_tflops": summary["achieved_tflops"],
                }
            )
    report(1.0, "done")
    return rows


def _stopped(label: str, seq_len: int, reason: str) -> dict[str, Any]:
    return {
        "run": label,
        "seq_len": seq_len,
        "status": "stopped",
        "reason": reason,
        "forward_ms": None,
        "peak_memory_bytes": None,
        "kernels_per_forward": None,
        "achieved_tflops": None,
    }
