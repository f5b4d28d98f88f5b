"""What changed between two traces of one job: ops and kernels added, removed and changed, the step
breakdown and GPU metrics, and the top regressions (the TensorBoard plugin's Diff view; HTA's TraceDiff).

    diff = diff_analyses(analyze_file(before), analyze_file(after))
    diff["ops"], diff["kernels"], diff["steps"], diff["gpu_metrics"], diff["regressions"]

Every figure comes with its Δ (after − before) and Δ% (of before; null where before is 0). Two single
traces give only Δ: one measurement each cannot tell a change from noise. Where each trace holds at least
`stats.MIN_SAMPLES` steps, the step time follows issue 19's rule (`profiling.diff.time_row`): "changed"
only when a Mann–Whitney test over the per-step times gives p < 0.01 and the medians differ by 5% or more,
else "within noise". Ops are compared on host time (self and total), kernels on device time.

`diff_uploads` is what the app's `/diff_traces` calls: both analyses admitted against the memory budget
before either starts, then run in one killable process.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiling.admission import (
    PEAK_PER_ROW,
    AdmissionError,
    AnalysisCost,
    AnalysisGate,
    TopUp,
    analysis_cost,
    analysis_gate,
    charged_reads,
)
from profiling.diff import MAX_NAMES, MAX_P, MIN_CHANGE
from profiling.reader import Progress, TraceError
from profiling.stats import MAX_SAMPLES, MIN_SAMPLES, mann_whitney_p
from profiling.step_breakdown import ROLES
from profiling.worker import Cancelled, Worker

# Each table's figures: (the diff's name, the analysis table's column).
OP_FIGURES = (
    ("calls", "calls"),
    ("self host (us)", "self cpu (us)"),
    ("total host (us)", "total cpu (us)"),
    ("self device (us)", "self device (us)"),
    ("total device (us)", "total device (us)"),
)
KERNEL_FIGURES = (("calls", "count"), ("total device (us)", "total (us)"))
RANKED_BY = {"op": "total host (us)", "kernel": "total device (us)"}  # a row's "total time"
GPU_METRICS = (
    *("gpu_utilization_percent", "sm_efficiency_percent", "achieved_occupancy_percent"),
    *("tensor_core_time_percent", "kernel_time_us", "idle_time_us"),
)
TOP_REGRESSIONS = 10  # per table
DIGITS = 3
STEP_COLUMN = "step time (us)"


@dataclass(frozen=True)
class Side:
    """What a diff reads of one analysis: small enough to keep while the other trace is analysed."""

    ops: pd.DataFrame  # the op table (kind "op" rows only)
    kernels: pd.DataFrame  # the kernel table
    per_step_us: dict[str, list[float]]  # "step time" and each role: per step in time order (<= MAX_STEPS)
    summary: dict[str, Any]


def side_of(analysis: Any) -> Side:
    """The parts of an `Analysis` that the diff reads."""
    ops = analysis.op_table
    ops = ops[ops["kind"] == "op"] if "kind" in ops else ops
    steps = analysis.steps
    per_step = {
        column.removesuffix(" (us)"): steps[column].dropna().astype(float).tolist()
        for column in (STEP_COLUMN, *(f"{role} (us)" for role in (*ROLES, "other")))
        if column in steps
    }
    return Side(ops=ops, kernels=analysis.kernel_table, per_step_us=per_step, summary=dict(analysis.summary))


def _percent(before: float, delta: float) -> float | None:
    return round(delta / before * 100, 2) if before else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def name_rows(
    kind: str, before: pd.DataFrame, after: pd.DataFrame, figures: tuple[tuple[str, str], ...]
) -> pd.DataFrame:
    """One row per name in either table whose figures differ: `status` added, removed or changed, and per
    figure `X before`, `X after`, `Δ X`, `Δ% X`. Names are grouped first (a table's name is unique, but
    grouping makes that so for any input); rows with the largest |Δ total time| first. Vectorised: a
    crafted trace's 100,000 names cost one merge, and `diff_sides` keeps MAX_NAMES rows of them."""
    columns = [column for _, column in figures]
    sides = []
    for table in (before, after):
        frame = table.reindex(columns=["name", *columns]).fillna({c: 0.0 for c in columns})
        sides.append(frame.groupby("name", sort=False)[columns].sum())
    merged = sides[0].join(sides[1], how="outer", lsuffix=" before", rsuffix=" after")
    present = [merged.index.isin(side.index) for side in sides]
    merged = merged.fillna(0.0)
    out = pd.DataFrame({"kind": kind, "name": merged.index.astype(str)})
    out["status"] = np.where(~present[0], "added", np.where(~present[1], "removed", "changed"))
    same = np.ones(len(merged), dtype=bool)
    for label, column in figures:
        a, b = merged[f"{column} before"].to_numpy(float), merged[f"{column} after"].to_numpy(float)
        delta = b - a
        if label == "calls":  # counts stay whole numbers
            out[f"{label} before"], out[f"{label} after"], out[f"Δ {label}"] = (
                a.astype(int),
                b.astype(int),
                delta.astype(int),
            )
        else:
            out[f"{label} before"], out[f"{label} after"] = a.round(DIGITS), b.round(DIGITS)
            out[f"Δ {label}"] = delta.round(DIGITS)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(a != 0, np.round(delta / np.where(a != 0, a, 1) * 100, 2), np.nan)
        out[f"Δ% {label}"] = pd.Series(share).astype(object).where(~np.isnan(share), None).to_numpy()
        same &= a == b
    out = out[~(same & present[0] & present[1])]
    ranked = out[f"Δ {RANKED_BY[kind]}"].abs().to_numpy()
    return out.iloc[np.argsort(-ranked, kind="stable")].reset_index(drop=True)


def step_rows(before: Side, after: Side) -> list[dict[str, Any]]:
    """The step time (with issue 19's noise rule where both traces repeat it) and the mean per step of
    each role of the plugin's breakdown, before, after, Δ and Δ%."""
    mean_a, mean_b = before.summary.get("average_step_time_us"), after.summary.get("average_step_time_us")
    rows = [_timed_row("step time", mean_a, mean_b, before, after)]
    roles_a = before.summary.get("step_breakdown_us") or {}
    roles_b = after.summary.get("step_breakdown_us") or {}
    for role in dict.fromkeys([*roles_a, *roles_b]):
        rows.append(_timed_row(role, roles_a.get(role), roles_b.get(role), before, after))
    return rows


def _plain_row(name: str, a: float | None, b: float | None, status: str | None = None) -> dict[str, Any]:
    delta = None if a is None or b is None else b - a
    if status is None:
        status = "n/a" if delta is None else "same" if delta == 0 else "changed"
    return {
        "name": name,
        "before": None if a is None else round(a, DIGITS),
        "after": None if b is None else round(b, DIGITS),
        "Δ": None if delta is None else round(delta, DIGITS),
        "Δ%": None if delta is None or a is None else _percent(a, delta),
        "status": status,
    }


def _timed_row(name: str, mean_a: Any, mean_b: Any, before: Side, after: Side) -> dict[str, Any]:
    """A time's mean per step before and after. With MIN_SAMPLES steps a side, its per-step values compared
    by the rank test (issue 19): "changed" only at p < MAX_P with medians MIN_CHANGE apart, else "within
    noise"; with fewer, a Δ that is not 0 is a "single measurement"."""
    a_times = before.per_step_us.get(name, [])[:MAX_SAMPLES]
    b_times = after.per_step_us.get(name, [])[:MAX_SAMPLES]
    row = _plain_row(f"{name} (us)", mean_a if _number(mean_a) else None, mean_b if _number(mean_b) else None)
    row.update(steps_before=len(before.per_step_us.get(name, [])), steps_after=len(after.per_step_us.get(name, [])))
    row["p_value"] = None
    if row["Δ"] is None or row["status"] == "same":
        return row
    if min(len(a_times), len(b_times)) < MIN_SAMPLES:
        row["status"] = "single measurement"  # Δ shown; too few repetitions to call it a change
        return row
    med_a, med_b = float(np.median(a_times)), float(np.median(b_times))
    p = mann_whitney_p(a_times, b_times)
    changed = p < MAX_P and abs(med_b - med_a) >= MIN_CHANGE * med_a
    row.update(
        median_before=round(med_a, DIGITS),
        median_after=round(med_b, DIGITS),
        median_change_percent=_percent(med_a, med_b - med_a),
        p_value=float(f"{p:.3g}"),
        status="changed" if changed else "within noise",
    )
    return row


def gpu_metric_rows(before: Side, after: Side) -> list[dict[str, Any]]:
    """The summary's GPU metrics before and after (percentages: Δ in points); none where neither trace has a GPU."""
    if not (before.summary.get("kernel_events") or after.summary.get("kernel_events")):
        return []  # two host-only traces: no GPU to compare
    rows = []
    for key in GPU_METRICS:
        a, b = before.summary.get(key), after.summary.get(key)
        if _number(a) or _number(b):
            rows.append(_plain_row(key, a if _number(a) else None, b if _number(b) else None))
    return rows


def regressions(ops: pd.DataFrame, kernels: pd.DataFrame) -> list[dict[str, Any]]:
    """The TOP_REGRESSIONS ops (by host time) and kernels (by device time) whose total time grew most."""
    top = []
    for kind, table in (("op", ops), ("kernel", kernels)):
        label = RANKED_BY[kind]
        if table.empty:
            continue
        grown = table[table[f"Δ {label}"] > 0].nlargest(TOP_REGRESSIONS, f"Δ {label}")
        for source in grown.to_dict(orient="records"):
            top.append(
                {
                    "kind": kind,
                    "name": source["name"],
                    "status": source["status"],
                    "figure": label,
                    "before": source[f"{label} before"],
                    "after": source[f"{label} after"],
                    "Δ": source[f"Δ {label}"],
                    "Δ%": source[f"Δ% {label}"],
                }
            )
    return top


def diff_sides(before: Side, after: Side) -> dict[str, Any]:
    """The whole diff of two traces, JSON-ready: `ops`, `kernels` (records), `steps`, `gpu_metrics`,
    `regressions`, `counts` of rows by status (all of them) and `left_off` (rows past MAX_NAMES, not listed)."""
    ops = name_rows("op", before.ops, after.ops, OP_FIGURES)
    kernels = name_rows("kernel", before.kernels, after.kernels, KERNEL_FIGURES)
    counts = {
        kind: {status: int((table["status"] == status).sum()) for status in ("added", "removed", "changed")}
        for kind, table in (("ops", ops), ("kernels", kernels))
    }
    left_off = {"ops": max(0, len(ops) - MAX_NAMES), "kernels": max(0, len(kernels) - MAX_NAMES)}
    ops, kernels = ops.head(MAX_NAMES), kernels.head(MAX_NAMES)
    return {
        "before": before.summary.get("source"),
        "after": after.summary.get("source"),
        "counts": counts,
        "left_off": left_off,  # rows past MAX_NAMES per table, the smallest |Δ|: counted, not listed
        "steps": step_rows(before, after),
        "gpu_metrics": gpu_metric_rows(before, after),
        "regressions": regressions(ops, kernels),
        "ops": ops.to_dict(orient="records"),
        "kernels": kernels.to_dict(orient="records"),
    }


def diff_analyses(before: Any, after: Any) -> dict[str, Any]:
    """`diff_sides` of two `profiling.analysis.Analysis` objects."""
    return diff_sides(side_of(before), side_of(after))


def _side_of_file(field: str, path: str, progress: Progress, limits: dict[str, int]) -> Side:
    """`side_of` the analysis of `path`; the reader's TraceError says `field` (before/after), not "trace"."""
    from profiling.analysis import analyze_file

    try:
        return side_of(analyze_file(path, progress, **limits))
    except TraceError as exc:
        raise _renamed(field, exc) from None


_UNNAMED = re.compile(r"^(?:trace|before|after): ")  # the field a message names: the reader's, or the diff's share's


def _renamed(field: str, exc: TraceError) -> TraceError:
    """The reader's error about one of the two traces, its message naming `field` instead of "trace"."""
    message = f"{field}: {_UNNAMED.sub('', str(exc), count=1)}"
    try:
        return type(exc)(message)  # its own kind kept where it takes a message alone
    except TypeError:
        return TraceError(message)


def _cost(field: str, path: str | Path) -> AnalysisCost:
    try:
        return analysis_cost(path)
    except TraceError as exc:
        raise _renamed(field, exc) from None


def diff_files(
    before: str,
    after: str,
    limits: tuple[dict[str, int], dict[str, int]] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Analyse both trace files (one after the other, the first reduced to its `Side` before the second is
    read) and diff them. `limits`: the reader's limits for each (see `load_trace`)."""
    report = progress or (lambda fraction, message: None)
    limits_a, limits_b = limits or ({}, {})
    side_a = _side_of_file("before", before, lambda f, m: report(0.5 * f, f"before: {m}"), limits_a)
    side_b = _side_of_file("after", after, lambda f, m: report(0.5 + 0.45 * f, f"after: {m}"), limits_b)
    report(0.95, "comparing the two traces")
    return diff_sides(side_a, side_b)


def diff_uploads(
    before: str | Path,
    after: str | Path,
    time_limit_s: float | None = None,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None,
    gate: AnalysisGate | None = None,
    worker: Worker | None = None,
) -> dict[str, Any]:
    """`/diff_traces`: both traces counted, then admitted together (the sum of their charges) against the
    memory budget before either is analysed, then analysed and diffed in one killable process.

    Raises AdmissionError naming `before` or `after` when that trace (alone, or on top of the other) cannot
    fit the budget, the reader's TraceError for a bad file, AnalysisStopped at the time limit."""
    from profiling.uploads import AnalysisStopped, AnalysisWorker, stop_waiting

    started = time.monotonic()
    cost_a, cost_b = _cost("before", before), _cost("after", after)  # a bad file is refused here, by name
    gate = gate or analysis_gate()
    need = cost_a.peak_bytes + cost_b.peak_bytes
    if need > gate.budget_bytes:
        field = "before" if cost_a.peak_bytes > gate.budget_bytes else "after"
        what = f"both traces ({cost_a.describe()} and {cost_b.describe()})"
        raise AdmissionError(
            f"{field}: analysing {what} needs about {need / 2**20:,.0f} MiB of memory together; this server "
            f"allows {gate.budget_bytes / 2**20:,.0f} MiB for runs and analyses; give smaller traces"
        )
    own = worker or AnalysisWorker()
    try:
        what = f"{cost_a.describe()} and {cost_b.describe()}"
        with gate.admit(need, field="before", what=what, cancelled=cancelled) as share:
            left = None if time_limit_s is None else max(0.0, time_limit_s - (time.monotonic() - started))
            limits = (cost_a.reader_limits(), cost_b.reader_limits())
            # In-process (worker off), the limit and `cancelled` are checked at each progress report.
            report = progress or (lambda fraction, message: None)
            charged = {str(before): cost_a.peak_bytes, str(after): cost_b.peak_bytes}
            return own.call(
                charged_reads,
                diff_files,
                PEAK_PER_ROW,
                str(before),
                str(after),
                limits,
                time_limit_s=left,
                progress=report,
                cancelled=cancelled,
                answer=TopUp(share, charged, stop_waiting(cancelled, own), time_left_s=left),
            )
    except Cancelled:
        raise AnalysisStopped("before: the diff was stopped because its caller left") from None
    finally:
        if worker is None:
            own.close()
