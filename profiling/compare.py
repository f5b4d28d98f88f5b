"""Every variant/backend on one shape, side by side: the blog's table in one call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from attention import RUNS, AttentionSpec, SpecError, run_label
from profiling.pipeline import profile_attention
from profiling.runner import Deadline, Progress, RunError
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
]


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
    _add_speedups(rows)
    return rows


def _add_speedups(rows: list[dict[str, Any]]) -> None:
    naive = next((forward_ms(r) for r in rows if r.get("variant") == "naive" and "error" not in r), None)
    for row in rows:
        ms = forward_ms(row) if "error" not in row else None
        row["speedup_vs_naive"] = round(naive / ms, 3) if naive and ms else None


def row_label(row: dict[str, Any]) -> str:
    """The run's short name, from a summary or an error row."""
    return run_label(str(row.get("variant")), str(row.get("backend", "auto")), bool(row.get("compile")))


def compare_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One line per run; a run that could not run says why in `what the trace revealed`."""
    records = []
    for r in rows:
        if "error" in r:
            records.append(
                [row_label(r), None, *[None] * (len(COMPARE_COLUMNS) - 4), f"unavailable: {r['error']}", None]
            )
            continue
        records.append(
            [
                row_label(r),
                r.get("backend_used"),
                r["kernels_per_forward"],
                r["forward_cpu_ms"],
                r.get("forward_unprofiled_ms"),
                r["forward_device_ms"],
                r["self_cpu_total_ms"],
                r["self_device_total_ms"],
                round(r["peak_memory_bytes"] / 1024**2, 3),
                r["max_abs_error"],
                r["speedup_vs_naive"],
                r["insights"][0] if r["insights"] else "",
                "; ".join(f"{b}: {why}" for b, why in (r.get("backend_reasons") or {}).items()),
            ]
        )
    table = pd.DataFrame(records, columns=COMPARE_COLUMNS)
    table["max abs error"] = table["max abs error"].map(lambda e: f"{e:.2e}" if pd.notna(e) else None)
    # Host-only runs have no device time: keep the table readable rather than two empty columns.
    device_columns = ["forward device (ms)", "self device total (ms)"]
    if table[device_columns].isna().all().all():
        table = table.drop(columns=device_columns)
    return table
