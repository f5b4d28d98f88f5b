"""Communication: collectives that take a large share of the step, and how much of them computation hides."""

from __future__ import annotations

from profiling.communication import communication_stats
from profiling.insights.base import NAME_IN_LIST, Evidence, Finding, Rule, gpu_share, short
from profiling.step_breakdown import step_at

# The TensorBoard plugin's threshold (tb_plugin/torch_tb_profiler/profiler/data.py,
# `_analyze_distributed_metrics`: `communication_ratio > 0.1` of the step time). We apply it to the step's
# wall time, as the plugin does, and to the GPU's work: a host-bound step is mostly idle wall time, and
# must not hide a collective that holds a fifth of the kernel time (B200 vLLM: 2.5% of the step, 19.7% of
# kernel time).
MIN_STEP_PERCENT = 10.0
MIN_KERNEL_TIME_PERCENT = 10.0
HIDDEN_PERCENT = 50.0  # above this overlap, most of the collectives' time is already behind computation


def communication(ev: Evidence) -> Finding | None:
    """Collectives (`profiling.communication`) holding at least MIN_STEP_PERCENT of the step's wall time or
    MIN_KERNEL_TIME_PERCENT of kernel time, with HTA's overlap."""
    stats = communication_stats(ev.trace)
    if stats is None or not (
        (stats.step_percent or 0.0) >= MIN_STEP_PERCENT or (stats.kernel_time_percent or 0.0) >= MIN_KERNEL_TIME_PERCENT
    ):
        return None
    overlap = stats.overlap_percent or 0.0
    top = ", ".join(
        f"{short(c['name'], NAME_IN_LIST)} ({c['total_us'] / 1e3:.3f} ms, {c['count']}x)" for c in stats.by_name[:3]
    )
    advice = (
        "most of it already runs beside computation."
        if overlap >= HIDDEN_PERCENT
        else "nothing else runs on the GPU for the rest of it: overlap collectives with independent computation on "
        "another stream (in training, DDP's gradient buckets and FSDP's prefetch do), or make fewer, larger ones."
    )
    worst = stats.worst
    return Finding(
        "Communication",
        f"collectives take {stats.kernel_time_percent or 0.0:.1f}% of kernel time and {stats.step_percent or 0.0:.1f}% "
        f"of the step's wall time ({stats.in_steps_us / 1e3:.3f} of {stats.step_us / 1e3:.3f} ms): {top}. "
        f"{overlap:.0f}% of their time overlaps computation kernels (HTA's communication/computation overlap); "
        + advice,
        {
            "step_percent": stats.step_percent,
            "kernel_time_percent": stats.kernel_time_percent,
            "overlap_percent": stats.overlap_percent,
            "collective_us": stats.collective_us,
            "collectives": stats.collectives,
            "step_us": stats.step_us,
            "kernels": stats.by_name,
            "longest": {"name": worst["name"], "dur_us": worst["dur"]},
            "ts_us": worst["ts"] + ev.trace.ts_base_us,
            "step": step_at(ev.trace, worst["ts"], device_side=True),
        },
        # About the collectives' kernels: their share of all GPU time.
        gpu_share(ev, stats.collective_us),
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "communication",
        "collective kernels >= 10% of the step or of kernel time; their overlap with computation",
        communication,
    ),
)
