"""Sequence-length sweep: forward time and peak memory against seq_len, per variant."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from attention import AttentionSpec, SpecError, format_bytes, memory_budget, run_label
from profiling.compare import forward_ms
from profiling.pipeline import profile_attention
from profiling.runner import Deadline, Progress, RunError
from profiling.stats import timing_of
from profiling.worker import Cancelled

MAX_POINTS = 64  # variants x seq_len values in one sweep
POINT_KEYS = ("forward_ms", "peak_memory_bytes", "kernels_per_forward", "achieved_tflops")
SPREAD_KEYS = ("forward_ms_p25", "forward_ms_p75", "noisy")  # from the forward's samples; null without them


def sweep(
    base: AttentionSpec,
    runs: list[tuple[str, str]],
    seq_lens: list[int],
    trace_dir: str | Path,
    progress: Progress | None = None,
    budget_bytes: int | None = None,
    time_limit_s: float | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list[dict[str, Any]]:
    """One row per (variant, seq_len) that ran, plus one `stopped` row where a variant stopped.

    A variant stops before the memory guard would refuse it: at the first seq_len whose
    estimated memory exceeds `budget_bytes` (default: what the device has free, with headroom).
    `time_limit_s` bounds the whole sweep; `cancelled()` true (the client left) stops it.
    """
    report = progress or (lambda fraction, message: None)
    seq_lens = sorted(set(seq_lens))
    _check_size(runs, seq_lens)
    _check_values(base, seq_lens)
    budget = memory_budget(base.device) if budget_bytes is None else budget_bytes
    deadline = Deadline(time_limit_s)
    rows: list[dict[str, Any]] = []
    total = len(runs) * len(seq_lens)
    for v, (variant, backend) in enumerate(runs):
        label = run_label(variant, backend, base.compile)
        for s, seq_len in enumerate(seq_lens):
            report((v * len(seq_lens) + s) / total, f"{label} at seq_len {seq_len}")
            spec = base.replace(variant=variant, backend=backend, seq_len=seq_len)
            row = _point(spec, label, budget, trace_dir, deadline, cancelled)
            rows.append(row)
            if row["status"] == "stopped":
                break
    report(1.0, "done")
    return rows


def _check_size(runs: list[tuple[str, str]], seq_lens: list[int]) -> None:
    if not runs:
        raise SpecError("variants", "give at least one variant")
    most = MAX_POINTS // len(runs)
    if not seq_lens or len(seq_lens) > most:
        raise SpecError(
            "seq_lens", f"give 1 to {most} seq_len values for {len(runs)} variant(s) (at most {MAX_POINTS} points)"
        )


def _check_values(base: AttentionSpec, seq_lens: list[int]) -> None:
    """Every point is a valid spec (seq_len in range, a fixed q_len no longer than it): else SpecError, up front."""
    for seq_len in seq_lens:
        base.replace(seq_len=seq_len)


def _point(
    spec: AttentionSpec,
    label: str,
    budget: int,
    trace_dir: str | Path,
    deadline: Deadline,
    cancelled: Callable[[], bool] | None,
) -> dict[str, Any]:
    need = spec.estimated_bytes()
    if need > budget:
        return _stopped(
            label, spec.seq_len, f"needs about {format_bytes(need)}, over the {format_bytes(budget)} budget"
        )
    try:
        deadline.check("sweep")
        summary = profile_attention(spec, trace_dir, time_limit_s=deadline.remaining_s(), cancelled=cancelled).summary
    except Cancelled:
        raise
    except (SpecError, RunError) as exc:
        return _stopped(label, spec.seq_len, str(exc))
    return {
        "run": label,
        "seq_len": spec.seq_len,
        "status": "ok",
        "reason": None,
        "q_len": spec.q_len,
        **point_times(dict(summary)),
        **{key: summary[key] for key in POINT_KEYS if key != "forward_ms"},  # type: ignore[literal-required]
    }


def point_times(summary: dict[str, Any]) -> dict[str, Any]:
    """A point's forward time with its spread: the median of the unprofiled samples, their p25 and p75, and
    whether they are noisy; a summary without samples keeps `forward_ms` with no spread."""
    timing = timing_of(summary.get("forward_ms_stats"))
    if timing is None:
        return {"forward_ms": forward_ms(summary), **dict.fromkeys(SPREAD_KEYS)}
    return {
        "forward_ms": round(timing.median, 6),
        "forward_ms_p25": timing.p25,
        "forward_ms_p75": timing.p75,
        "noisy": timing.noisy,
    }


def _stopped(label: str, seq_len: int, reason: str) -> dict[str, Any]:
    return {
        "run": label,
        "seq_len": seq_len,
        "status": "stopped",
        "reason": reason,
        "q_len": None,
        **dict.fromkeys(POINT_KEYS),
        **dict.fromkeys(SPREAD_KEYS),
    }
