"""Timing: noise named as a finding, so that no conclusion about speed rests on a run that cannot carry it."""

from __future__ import annotations

from typing import Any

from profiling.insights.base import Evidence, Finding, Rule
from profiling.timing import NOISY_CV, TimingStats, stats_from_dict

TIMED = ("forward", "backward")  # the summary's `<name>_ms_stats`, from the unprofiled loop


def _figures(stats: TimingStats) -> dict[str, Any]:
    return {"cv": stats.cv, "n": stats.n, "median_ms": stats.median, "p25_ms": stats.p25, "p75_ms": stats.p75}


def _spread(name: str, stats: TimingStats) -> str:
    return (
        f"the {name}'s unprofiled times vary by {100 * stats.cv:.0f}% of their mean (cv over {stats.n} calls; median "
        f"{stats.median:.3f} ms, quartiles {stats.p25:.3f} to {stats.p75:.3f} ms), above the {100 * NOISY_CV:.0f}% "
        "pyperf warns at"
    )


def noisy_timing(ev: Evidence) -> Finding | None:
    """Our runs whose unprofiled timings are spread too wide to compare, or (on CPU) came out slower
    than the profiled forward, which carries the profiler's overhead on top: the machine was busy."""
    if ev.spec is None:
        return None  # an upload carries no unprofiled timing
    noisy = {
        name: stats
        for name in TIMED
        if (stats := stats_from_dict(ev.numbers.get(f"{name}_ms_stats"))) is not None and stats.cv > NOISY_CV
    }
    unprofiled, profiled = ev.numbers.get("forward_unprofiled_ms"), ev.numbers.get("forward_cpu_ms")
    # Only on the CPU: on a GPU the wall clock also holds the launches and the sync the device time leaves out.
    inverted = (
        ev.device == "cpu"
        and isinstance(unprofiled, (int, float))
        and isinstance(profiled, (int, float))
        and unprofiled > profiled > 0
    )
    if not noisy and not inverted:
        return None
    reasons = [_spread(name, stats) for name, stats in noisy.items()]
    evidence: dict[str, Any] = {name: _figures(stats) for name, stats in noisy.items()}
    if inverted:
        reasons.append(
            f"the forward took {unprofiled:.3f} ms without the profiler but {profiled:.3f} ms under it, though the "
            "profiler only adds time"
        )
        evidence.update(forward_unprofiled_ms=unprofiled, forward_cpu_ms=profiled)
    return Finding(
        "Noisy timing",
        "; ".join(reasons) + ". Conclusions about speed are unsafe on this run: the machine was busy or its clock "
        "unsteady. Rerun on a quiet machine, and trust a difference only where the intervals do not overlap.",
        evidence,
        None,  # about the timing loop, outside the trace: no GPU events
    )


RULES: tuple[Rule, ...] = (
    Rule("noisy_timing", "our runs: unprofiled cv > 10%, or on CPU unprofiled > profiled forward", noisy_timing),
)
