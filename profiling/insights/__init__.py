"""What a trace teaches, found automatically: one module per family of rules, each rule a row in its `RULES`.

A rule reads one `Evidence` and returns a `Finding` (a title, a sentence, the numbers behind it and
its share of GPU time), or None where its evidence is absent. `find_insights` runs them all, in
the order of `ORDER`, and sorts what they found by GPU time. docs/rules.md lists every rule with
the evidence it needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from profiling.insights import (
    attention,
    communication,
    copies,
    data_quality,
    host,
    occupancy,
    precision,
    rotary,
    timing,
    training,
)
from profiling.insights.base import Evidence, Finding, Insight, Rule
from profiling.insights.copies import copied_bytes_per_window
from profiling.trace import Trace
from profiling.windows import WindowStats

__all__ = [
    "ORDER",
    "RULES",
    "Evidence",
    "Finding",
    "Insight",
    "Rule",
    "copied_bytes_per_window",
    "find_insights",
    "ranked",
]

# The order rules run and speak in where GPU time does not rank them (CPU runs, and findings about
# no GPU events). Stable names: the summaries' `findings[].rule` and docs/rules.md use them.
ORDER: tuple[str, ...] = (
    "hidden_copy",
    "mask_rebuilt",
    "safe_softmax",
    "fp32_upcast",
    "fused_attention",
    "unfused_attention",
    "unfused_rotary",
    "overhead_bound",
    "blocking_sync",
    "launch_bound",
    "communication",
    "dataloader_bound",
    "low_gpu_utilization",
    "memory_near_capacity",
    "amp_opportunity",
    "occupancy",
    "no_kernels",
    "profiler_overhead",
    "backward_memory",
    "gqa_copy",
    "decode_bound",
    "wrong_alignment",
    "dense_mask_backend",
    "first_call",
    "noisy_timing",
    "impossible_values",
)
FAMILIES = (copies, attention, rotary, precision, occupancy, host, timing, communication, training, data_quality)
_BY_NAME = {rule.name: rule for family in FAMILIES for rule in family.RULES}
RULES: tuple[Rule, ...] = tuple(_BY_NAME[name] for name in ORDER)
MIN_GPU_TIME_PERCENT = 1.0  # a finding about GPU events that hold less of the GPU's time is not worth reading


def find_insights(
    trace: Trace,
    scope: WindowStats,
    kernels: pd.DataFrame,
    spec: Any | None = None,
    numbers: Mapping[str, Any] | None = None,
    backward: WindowStats | None = None,
) -> list[Insight]:
    """Every rule's finding for this trace: those about the most GPU time first, then those about no GPU
    events in rule order; a finding under MIN_GPU_TIME_PERCENT of GPU time is dropped. `spec` and
    `numbers` are our run's, if it is one."""
    evidence = Evidence(trace, scope, kernels, spec, numbers or {}, backward)
    return ranked(
        [
            Insight(rule.name, finding.title, finding.detail, finding.evidence, finding.gpu_time_percent)
            for rule in RULES
            if (finding := rule.check(evidence)) is not None
        ]
    )


def ranked(found: list[Insight]) -> list[Insight]:
    """`found` (in rule order) by GPU time, most first, those about no GPU events last in rule order;
    without those about under MIN_GPU_TIME_PERCENT of it."""
    kept = [i for i in found if i.gpu_time_percent is None or i.gpu_time_percent >= MIN_GPU_TIME_PERCENT]
    # sorted() is stable: equal shares, and every None, keep rule order.
    return sorted(kept, key=lambda i: (i.gpu_time_percent is None, -(i.gpu_time_percent or 0.0)))
