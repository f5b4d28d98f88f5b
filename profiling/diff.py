"""What changed between two runs, per forward: ops and kernels added, removed or changed."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from profiling.compare import forward_ms
from profiling.stats import MAX_SAMPLES, MIN_SAMPLES, mann_whitney_p, stats_problem, timing_of
from profiling.timing import TimingStats

TIME_COLUMNS = ["change %", "p value", "before p25–p75", "after p25–p75"]  # null on counts and bytes
DIFF_COLUMNS = ["kind", "name", "before", "after", "change", "status", *TIME_COLUMNS]
TIMES = {"forward time (ms)": "forward_ms_stats", "backward time (ms)": "backward_ms_stats"}  # row: its samples
STATS_KEYS = tuple(TIMES.values())
# A time is "changed" only when the samples differ (Mann–Whitney p below this) by at least MIN_CHANGE:
# Criterion's confidence level and noise threshold, in spirit.
MAX_P = 0.01
MIN_CHANGE = 0.05
COUNT_KEYS = ("per_forward_ops", "per_forward_kernels", "per_backward_kernels")  # the last null in inference
TOTAL_KEYS = (
    *("kernels_per_forward", "ops_per_forward", "peak_memory_bytes", "copied_bytes_per_forward"),
    *("kernels_per_backward", "saved_for_backward_bytes", "backward_device_ms", "backward_cpu_ms"),
)
DIGITS = 4
# A run's summary names a few dozen ops and kernels per forward; these bounds are far above any real one,
# and stop a crafted summary (300,000 names took 18 s to diff) before any work is done on it.
MAX_NAMES = 10_000  # per map
MAX_NAME_CHARS = 4096  # the longest name a table shows


class DiffError(ValueError):
    """Two summaries that cannot be compared; the message names the field."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_size(field: str, summary: Any) -> None:
    """DiffError naming `field` when `summary` is no summary, or its op/kernel maps are past MAX_NAMES names
    or hold a name past MAX_NAME_CHARS: checked in time bounded by MAX_NAMES, whatever the summary's size."""
    if not isinstance(summary, dict) or "per_forward_ops" not in summary:
        raise DiffError(f"{field}: give a summary returned by /profile or /compare")
    for key in COUNT_KEYS:
        counts = summary.get(key) or {}
        if not isinstance(counts, dict):
            raise DiffError(f"{field}: {key} must map names to finite numbers")
        if len(counts) > MAX_NAMES:
            raise DiffError(f"{field}: {key} holds {len(counts):,} names; a run's summary holds at most {MAX_NAMES:,}")
        if any(not isinstance(name, str) or len(name) > MAX_NAME_CHARS for name in counts):
            raise DiffError(f"{field}: {key} must map names of at most {MAX_NAME_CHARS:,} characters to numbers")
    for key in STATS_KEYS:
        stats = summary.get(key)
        samples = stats.get("samples") if isinstance(stats, dict) else None
        if isinstance(samples, (list, tuple)) and len(samples) > MAX_SAMPLES:
            raise DiffError(
                f"{field}: {key}.samples holds {len(samples):,} samples; a summary keeps at most {MAX_SAMPLES}"
            )


def check_summary(field: str, summary: Any) -> dict[str, Any]:
    """`summary` if it looks like one from /profile or /compare: bounded in size (`check_size`), finite
    numbers where numbers go."""
    check_size(field, summary)
    for key in COUNT_KEYS:
        counts = summary.get(key) or {}
        if not all(_number(v) for v in counts.values()):
            raise DiffError(f"{field}: {key} must map names to finite numbers")
    for key in TOTAL_KEYS:
        if summary.get(key) is not None and not _number(summary[key]):
            raise DiffError(f"{field}: {key} must be a finite number or null")
    for key in STATS_KEYS:
        problem = stats_problem(summary.get(key))
        if problem:
            raise DiffError(f"{field}: {key}: {problem}")
    return summary


def _rows(kind: str, before: dict[str, float], after: dict[str, float]) -> list[list[Any]]:
    rows = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name, 0.0), after.get(name, 0.0)
        if a == b:
            continue
        status = "added" if a == 0 else "removed" if b == 0 else "changed"
        rows.append([kind, name, a, b, round(b - a, 3), status, *[None] * len(TIME_COLUMNS)])
    return rows


def diff_summaries(before: dict[str, Any], after: dict[str, Any]) -> pd.DataFrame:
    """Rows for each op/kernel whose count per forward (or per backward, in training) changed, then
    time, memory and copies."""
    check_size("before", before), check_size("after", after)  # both bounded before either is read
    before, after = check_summary("before", before), check_summary("after", after)
    kernel_kind = "kernel" if before.get("device") == "cuda" else "compute op"
    rows = _rows("op", before.get("per_forward_ops", {}), after.get("per_forward_ops", {}))
    rows += _rows(kernel_kind, before.get("per_forward_kernels", {}), after.get("per_forward_kernels", {}))
    rows += _rows(
        f"backward {kernel_kind}", before.get("per_backward_kernels") or {}, after.get("per_backward_kernels") or {}
    )
    totals = [
        ("kernels per forward", before.get("kernels_per_forward"), after.get("kernels_per_forward")),
        ("ops per forward", before.get("ops_per_forward"), after.get("ops_per_forward")),
        ("forward time (ms)", _time(before), _time(after)),
        ("peak memory (bytes)", before.get("peak_memory_bytes"), after.get("peak_memory_bytes")),
        (
            "copied bytes per forward",
            before.get("copied_bytes_per_forward", 0),
            after.get("copied_bytes_per_forward", 0),
        ),
        ("kernels per backward", before.get("kernels_per_backward"), after.get("kernels_per_backward")),
        ("backward time (ms)", _backward_time(before), _backward_time(after)),
        ("saved for backward (bytes)", before.get("saved_for_backward_bytes"), after.get("saved_for_backward_bytes")),
    ]
    for name, a, b in totals:
        if name in TIMES:  # timed: compared as samples
            row = time_row(name, a, b, timing_of(before.get(TIMES[name])), timing_of(after.get(TIMES[name])))
            rows += [row] if row else []
        elif a is not None and b is not None:  # counts and bytes are exact: their plain difference
            plain = ["total", name, a, b, round(b - a, DIGITS), "same" if a == b else "changed"]
            rows.append([*plain, *[None] * len(TIME_COLUMNS)])
    table = pd.DataFrame(rows, columns=DIFF_COLUMNS)
    for column in TIME_COLUMNS:  # null, not NaN, where a row has none: the endpoint returns JSON
        table[column] = table[column].astype(object).where(table[column].notna(), None)
    return table


def time_row(
    name: str, a: float | None, b: float | None, t_a: TimingStats | None, t_b: TimingStats | None
) -> list | None:
    """A time's diff row. With samples on both sides, the medians compared by a Mann–Whitney U test:
    "changed" only when p < MAX_P and the medians differ by at least MIN_CHANGE, else "within noise";
    "no samples" where a side has fewer than MIN_SAMPLES (a summary made before the samples) and the
    times are not equal ("same")."""
    if t_a is not None and t_b is not None:
        a, b = t_a.median, t_b.median  # the figures the test speaks about
    if a is None or b is None:
        return None
    change = round((b - a) / a * 100, 2) if a else None
    spread = [_iqr(t_a), _iqr(t_b)]
    if a == b:
        return ["total", name, a, b, 0.0, "same", change, None, *spread]
    if t_a is None or t_b is None or min(len(t_a.samples), len(t_b.samples)) < MIN_SAMPLES:
        return ["total", name, a, b, round(b - a, DIGITS), "no samples", change, None, *spread]
    p = mann_whitney_p(t_a.samples, t_b.samples)
    status = "changed" if p < MAX_P and abs(b - a) >= MIN_CHANGE * a else "within noise"
    p_value = float(f"{p:.3g}")
    return ["total", name, round(a, DIGITS), round(b, DIGITS), round(b - a, DIGITS), status, change, p_value, *spread]


def _iqr(timing: TimingStats | None) -> str | None:
    return f"{timing.p25:.4g}–{timing.p75:.4g}" if timing else None


def _time(summary: dict[str, Any]) -> float | None:
    ms = forward_ms(summary)
    return ms if _number(ms) else None


def _backward_time(summary: dict[str, Any]) -> float | None:
    """The backward's time where it runs: device time on a GPU, else the profiled CPU time (null in inference)."""
    ms = summary.get("backward_device_ms") or summary.get("backward_cpu_ms")
    return ms if _number(ms) else None
