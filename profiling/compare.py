"""Every variant/backend on one shape, side by side: the blog's table in one call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from attention import RUNS, AttentionSpec, SpecError, run_label
from profiling.pipeline import profile_attention
from profiling.runner import Deadline, Progress, RunError
from profiling.stats import MIN_SAMPLES, speedup_ci, timing_of, within_noise
from profiling.timing import TimingStats
from profiling.worker import Cancelled

COMPARE_COLUMNS = [
    "run",
    "backend used",
    "kernels/forward",
    "forward cpu (ms)",
    "unprofiled (ms)",
    "forward device (ms)",
    "self cpu total (ms)",
    "self device total (ms)",
    "peak memory (MiB)",
    "max abs error",
    "speed-up vs naive",
    "what the trace revealed",
    "backends that refuse this call",
    "speed-up 95% CI",
    "timing",
]
SPEEDUP_STATUSES = ("faster", "slower", "within noise", "no samples")
BASELINE = "naive"


def forward_ms(summary: dict[str, Any]) -> float | None:
    """A forward's time where it runs: the profiler's device time on a GPU; on the CPU the
    unprofiled time, since there the profiler's per-op bookkeeping lands inside the forward."""
    return summary.get("forward_device_ms") or summary.get("forward_unprofiled_ms") or summary.get("forward_cpu_ms")


def compare(
    base: AttentionSpec,
    trace_dir: str | Path,
    progress: Progress | None = None,
    runs: tuple[tuple[str, str], ...] = RUNS,
    time_limit_s: float | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list[dict[str, Any]]:
    """Run each (variant, backend) on `base`'s shape. A row that cannot run carries `error`.

    `time_limit_s` bounds the whole comparison: each run gets what the ones before it left.
    `cancelled()` true (the client left) stops the run in progress and the comparison.
    """
    report = progress or (lambda fraction, message: None)
    deadline = Deadline(time_limit_s)
    rows: list[dict[str, Any]] = []
    for i, (variant, backend) in enumerate(runs):

        def step(fraction: float, message: str, i: int = i, label: str = run_label(variant, backend)) -> None:
            report((i + fraction) / len(runs), f"{label}: {message}")

        try:
            deadline.check("compare")
            spec = base.replace(variant=variant, backend=backend)
            result = profile_attention(spec, trace_dir, step, deadline.remaining_s(), cancelled)
            rows.append(dict(result.summary))
        except Cancelled:
            raise
        except (SpecError, RunError) as exc:
            rows.append({"variant": variant, "backend": backend, "device": base.device, "error": str(exc)})
    add_speedups(rows)
    return rows


def forward_timing(row: dict[str, Any]) -> TimingStats | None:
    """The forward's unprofiled samples (`forward_ms_stats`), or None where the row has none."""
    return timing_of(row.get("forward_ms_stats")) if "error" not in row else None


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """`speedup` (median(naive) / median(row)), its 95% bootstrap interval `speedup_ci` and `speedup_status`:
    "within noise" where the interval contains 1, "no samples" where either side has fewer than MIN_SAMPLES."""
    naive = next((r for r in rows if r.get("variant") == BASELINE and "error" not in r), None)
    for row in rows:
        row["speedup"], row["speedup_ci"], row["speedup_status"] = _speedup(naive, row)
        row["speedup_vs_naive"] = round(row["speedup"], 3) if row["speedup"] else None


def _speedup(naive: dict[str, Any] | None, row: dict[str, Any]) -> tuple[float | None, list[float] | None, str]:
    if naive is None or "error" in row:
        return None, None, "no samples"
    if row is naive:
        return 1.0, [1.0, 1.0], "within noise"  # the baseline against itself
    base, timing = forward_timing(naive), forward_timing(row)
    if base is None or timing is None:
        # A summary made before the samples (or one side without them): the times as before, on one
        # footing (forward_ms on both sides: never a wall clock over a device time), with no interval.
        base_ms, ms = forward_ms(naive), forward_ms(row)
        return (_digits(base_ms / ms) if base_ms and ms else None), None, "no samples"
    if min(len(base.samples), len(timing.samples)) < MIN_SAMPLES:
        return _digits(base.median / timing.median), None, "no samples"
    speedup, lo, hi = speedup_ci(base.samples, timing.samples)
    ci = [_digits(lo), _digits(hi)]
    return _digits(speedup), ci, "within noise" if within_noise(ci) else "faster" if lo > 1 else "slower"


def _digits(ratio: float) -> float:
    """Six significant digits: a ratio can be 0.0059 (an eager fallback) as well as 40."""
    return float(f"{ratio:.6g}")


def _noisy(row: dict[str, Any]) -> bool:
    timing = forward_timing(row)
    return bool(timing and timing.noisy)


def compare_lesson(rows: list[dict[str, Any]]) -> str:
    """One line on what the comparison shows, e.g. "sdpa-flash is 4.1× faster than naive (95% CI 3.8–4.4×);
    in-place is within noise of naive". It rests only on intervals that exclude 1 between figures that are
    not noisy: a noisy row is named as noisy, never as faster or slower."""
    naive = next((r for r in rows if r.get("variant") == BASELINE and "error" not in r), None)
    if naive is None:
        return f"no {BASELINE} run to compare against"
    if _noisy(naive):
        return f"{row_label(naive)}'s timing is noisy on this run: no speed-up is claimed"
    others = [r for r in rows if r is not naive and "error" not in r]
    noisy = [r for r in others if _noisy(r)]
    clear = [r for r in others if r not in noisy]
    parts = []
    for status, word in (("faster", "faster"), ("slower", "slower")):
        ranked = sorted((r for r in clear if r.get("speedup_status") == status), key=lambda r: r["speedup"])
        if ranked:
            best = ranked[-1] if status == "faster" else ranked[0]
            parts.append(_claim(best, word, row_label(naive)))
            break
    else:
        parts.append(f"no clear speed-up over {row_label(naive)}")
    for status, phrase in (
        ("within noise", f"within noise of {row_label(naive)}"),
        ("no samples", "too sparsely timed to rank"),
    ):
        names = [row_label(r) for r in clear if r.get("speedup_status") == status]
        if names:
            parts.append(f"{_names(names)} {'is' if len(names) == 1 else 'are'} {phrase}")
    if noisy:
        parts.append(f"{_names([row_label(r) for r in noisy])}: timing noisy, not ranked")
    return "; ".join(parts)


def _claim(row: dict[str, Any], word: str, baseline: str) -> str:
    lo, hi = row["speedup_ci"]
    if word == "faster":
        return f"{row_label(row)} is {row['speedup']:.3g}× faster than {baseline} (95% CI {lo:.3g}–{hi:.3g}×)"
    return f"{row_label(row)} is {1 / row['speedup']:.3g}× slower than {baseline} (95% CI {1 / hi:.3g}–{1 / lo:.3g}×)"


def _names(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def row_label(row: dict[str, Any]) -> str:
    """The run's short name, from a summary or an error row."""
    return run_label(str(row.get("variant")), str(row.get("backend", "auto")), bool(row.get("compile")))


def compare_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One line per run; a run that could not run says why in `what the trace revealed`."""
    records = [_error_record(r) if "error" in r else _record(r) for r in rows]
    table = pd.DataFrame(records, columns=COMPARE_COLUMNS)
    table["max abs error"] = table["max abs error"].map(lambda e: f"{e:.2e}" if pd.notna(e) else None)
    # Host-only runs have no device time: keep the table readable rather than two empty columns.
    device_columns = ["forward device (ms)", "self device total (ms)"]
    if table[device_columns].isna().all().all():
        table = table.drop(columns=device_columns)
    return table


def _error_record(r: dict[str, Any]) -> dict[str, Any]:
    return {"run": row_label(r), "what the trace revealed": f"unavailable: {r['error']}"}


def _record(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "run": row_label(r),
        "backend used": r.get("backend_used"),
        "kernels/forward": r["kernels_per_forward"],
        "forward cpu (ms)": r["forward_cpu_ms"],
        "unprofiled (ms)": r.get("forward_unprofiled_ms"),
        "forward device (ms)": r["forward_device_ms"],
        "self cpu total (ms)": r["self_cpu_total_ms"],
        "self device total (ms)": r["self_device_total_ms"],
        "peak memory (MiB)": round(r["peak_memory_bytes"] / 1024**2, 3),
        "max abs error": r["max_abs_error"],
        "speed-up vs naive": r["speedup_vs_naive"],
        "what the trace revealed": r["insights"][0] if r["insights"] else "",
        "backends that refuse this call": "; ".join(
            f"{b}: {why}" for b, why in (r.get("backend_reasons") or {}).items()
        ),
        "speed-up 95% CI": _interval(r),
        "timing": _timing_note(r),
    }


def _interval(r: dict[str, Any]) -> str | None:
    if r.get("variant") == BASELINE and r.get("speedup") == 1.0:
        return "baseline"
    return "{:.3g}–{:.3g}×".format(*r["speedup_ci"]) if r.get("speedup_ci") else None


def _timing_note(r: dict[str, Any]) -> str:
    """The speed-up's status, then the forward's spread: median, IQR, n and cv, marked where noisy."""
    status = "baseline" if _interval(r) == "baseline" else r.get("speedup_status") or "no samples"
    timing = forward_timing(r)
    if timing is None:
        return status
    spread = f"median {timing.median:.3g} ms, IQR {timing.p25:.3g}–{timing.p75:.3g}, n {len(timing.samples)}"
    return f"{status}; {spread}, cv {timing.cv:.0%}" + (" (noisy)" if timing.noisy else "")
