"""What changed between two runs, per forward: ops and kernels added, removed or changed."""

from __future__ import annotations

from typing import Any

import pandas as pd

from profiling.compare import forward_ms, run_label

DIFF_COLUMNS = ["kind", "name", "before", "after", "change", "status"]


def _rows(kind: str, before: dict[str, float], after: dict[str, float]) -> list[list[Any]]:
    rows = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name, 0.0), after.get(name, 0.0)
        if a == b:
            continue
        status = "added" if a == 0 else "removed" if b == 0 else "changed"
        rows.append([kind, name, a, b, round(b - a, 3), status])
    return rows


def diff_summaries(before: dict[str, Any], after: dict[str, Any]) -> pd.DataFrame:
    """Rows for each op/kernel whose per-forward count changed, then time, memory and copies."""
    kernel_kind = "kernel" if before.get("device") == "cuda" else "compute op"
    rows = _rows("op", before.get("per_forward_ops", {}), after.get("per_forward_ops", {}))
    rows += _rows(kernel_kind, before.get("per_forward_kernels", {}), after.get("per_forward_kernels", {}))
    totals = [
        ("kernels per forward", before.get("kernels_per_forward"), after.get("kernels_per_forward")),
        ("ops per forward", before.get("ops_per_forward"), after.get("ops_per_forward")),
        ("forward time (ms)", forward_ms(before), forward_ms(after)),
        ("peak memory (bytes)", before.get("peak_memory_bytes"), after.get("peak_memory_bytes")),
        (
            "copied bytes per forward",
            before.get("copied_bytes_per_forward", 0),
            after.get("copied_bytes_per_forward", 0),
        ),
    ]
    for name, a, b in totals:
        if a is None or b is None:
            continue
        rows.append(["total", name, a, b, round(b - a, 4), "same" if a == b else "changed"])
    return pd.DataFrame(rows, columns=DIFF_COLUMNS)


def diff_title(before: dict[str, Any], after: dict[str, Any]) -> str:
    return f"{run_label(before)} → {run_label(after)}"
