"""Fidelity: is the forward time the app shows the time the forward really takes?

Goal (issue 19, item 8): for every variant the CPU runs, the app's forward time divided by an independent
`torch.utils.benchmark.Timer` on the same call has a 95% interval that contains 1 and lies within 1 ± 0.10.

Each round times every run twice, side by side (app then Timer, and Timer then app on odd rounds, so drift
on a shared machine and any order effect hit both alike):
  app    `profile_attention(spec, dir).summary`: the median of `forward_ms_stats` (the runner's unprofiled
         wall-clock loop, in the app's worker process), or `forward_unprofiled_ms` where those stats are absent
  Timer  the median of `torch.utils.benchmark.Timer(...).blocked_autorange()` on the same prepared call
         (`attention.prepare(spec)`), in this process: no profiler, same thread count, same allocator tuning
ratio = median(app) / median(Timer) over the rounds. Its 95% interval is a paired bootstrap over the rounds
(a resample keeps each round's two figures together, so drift shared by a round cancels), with a fixed seed.

Run it on a quiet machine (about 4 minutes on 2 cores at the defaults; it prints progress on stderr):

    python bench/fidelity.py --markdown

Options: --shape BxHxSxD (default 2x8x512x64, float32, inference), --variants naive,sdpa-math (default: every
run the CPU takes), --rounds N, --timer-s S (the Timer's min_run_time), --markdown, and --quick (a tiny shape,
3 rounds, a short Timer: a smoke run that checks the script works; its figures mean nothing). The app's own
loop keeps its budget (ATTENTION_PROFILER_TIMING_BUDGET_S, read by the app's worker), which this script leaves alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.utils.benchmark as benchmark

import attention
from attention import AttentionSpec, SpecError
from profiling.pipeline import profile_attention
from profiling.runner import keep_freed_cpu_memory
from profiling.worker import default_worker

TOLERANCE = 0.10  # the goal: the ratio's interval within 1 ± this
LEVEL = 0.95
RESAMPLES, SEED = 2000, 0  # as profiling.stats' bootstrap: reproducible intervals
DEFAULT_SHAPE = "2x8x512x64"
DEFAULT_ROUNDS = 20
DEFAULT_TIMER_S = 0.5  # as the app's default timing budget (ATTENTION_PROFILER_TIMING_BUDGET_S)
QUICK_SHAPE, QUICK_ROUNDS, QUICK_TIMER_S = "1x2x64x16", 3, 0.05
BUDGET_ENV = "ATTENTION_PROFILER_TIMING_BUDGET_S"
# Every run the app offers, in Compare's order, with SDPA's own choice beside its pinned backends.
ALL_RUNS: tuple[tuple[str, str], ...] = (*attention.RUNS[:2], ("sdpa", "auto"), *attention.RUNS[2:])
STATS_KEY, MEDIAN_KEY = "forward_ms_stats", "forward_unprofiled_ms"


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """`2x8x512x64` -> (batch, heads, seq_len, head_dim); ValueError on anything else."""
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(
            f"shape must be BxHxSxD (batch x heads x seq_len x head_dim), e.g. {DEFAULT_SHAPE}; got {text!r}"
        )
    batch, heads, seq_len, head_dim = (int(p) for p in parts)
    return batch, heads, seq_len, head_dim


def app_forward_ms(summary: Mapping[str, Any]) -> tuple[float, float | None, str]:
    """The forward time the app shows: (median ms, its cv or None, the key it came from).

    The median of `forward_ms_stats` where the summary has them, else `forward_unprofiled_ms` (summaries
    made before the timing stats existed); the cv is the app's own spread within its one run.
    """
    stats = summary.get(STATS_KEY)
    if isinstance(stats, Mapping) and isinstance(stats.get("median"), int | float):
        cv = stats.get("cv")
        return float(stats["median"]), float(cv) if isinstance(cv, int | float) else None, STATS_KEY
    return float(summary[MEDIAN_KEY]), None, MEDIAN_KEY


def paired_ratio_ci(
    app_ms: Sequence[float],
    timer_ms: Sequence[float],
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> tuple[float, float, float]:
    """(ratio, lo, hi): median(app) / median(timer), and its percentile interval from `resamples` paired
    bootstrap resamples of the rounds (round i's app and Timer figures are drawn together)."""
    app, timer = np.asarray(app_ms, dtype=float), np.asarray(timer_ms, dtype=float)
    if app.ndim != 1 or app.shape != timer.shape or app.size == 0:
        raise ValueError(f"need one app and one Timer figure per round, got {app.size} and {timer.size}")
    if not (np.all(np.isfinite(app)) and np.all(np.isfinite(timer)) and np.all(app > 0) and np.all(timer > 0)):
        raise ValueError("every figure must be a positive, finite time")
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level must be in (0, 1) and resamples >= 1, got {level} and {resamples}")
    rounds = np.random.default_rng(seed).integers(0, app.size, size=(resamples, app.size))
    ratios = np.median(app[rounds], axis=1) / np.median(timer[rounds], axis=1)
    lo, hi = np.percentile(ratios, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(np.median(app) / np.median(timer)), float(lo), float(hi)


@dataclass(frozen=True)
class Fidelity:
    """One run's figures over the rounds, and what they say."""

    run: str
    app_ms: tuple[float, ...]
    timer_ms: tuple[float, ...]
    app_cv: tuple[float, ...] = ()  # the app's own cv in each round, where its summary had the stats

    @property
    def ratio_ci(self) -> tuple[float, float, float]:
        return paired_ratio_ci(self.app_ms, self.timer_ms)

    @property
    def contains_one(self) -> bool:
        _, lo, hi = self.ratio_ci
        return lo <= 1 <= hi

    @property
    def within_tolerance(self) -> bool:
        """The whole interval within 1 ± TOLERANCE."""
        _, lo, hi = self.ratio_ci
        return lo >= 1 - TOLERANCE and hi <= 1 + TOLERANCE

    @property
    def goal_met(self) -> bool:
        return self.contains_one and self.within_tolerance


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def table_rows(results: Sequence[Fidelity]) -> list[list[str]]:
    """The table's cells, header first."""
    rows = [
        [
            "run",
            "app ms",
            "Timer ms",
            f"app/Timer [{LEVEL:.0%} CI]",
            f"within 1±{TOLERANCE:.2f}",
            "contains 1",
            "app cv",
        ]
    ]
    for r in results:
        ratio, lo, hi = r.ratio_ci
        cv = f"{statistics.median(r.app_cv):.3f}" if r.app_cv else "n/a"
        rows.append([
            r.run, f"{statistics.median(r.app_ms):.3f}", f"{statistics.median(r.timer_ms):.3f}",
            f"{ratio:.3f} [{lo:.3f}, {hi:.3f}]", _yes(r.within_tolerance), _yes(r.contains_one), cv,
        ])  # fmt: skip
    return rows


def format_table(results: Sequence[Fidelity], markdown: bool = False) -> str:
    """A plain, right-aligned table, or a markdown one."""
    rows = table_rows(results)
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in rows]
        lines.insert(1, "|" + "|".join([":---", *["---:"] * (len(rows[0]) - 1)]) + "|")
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def specs_for(
    runs: Sequence[tuple[str, str]], shape: tuple[int, int, int, int]
) -> tuple[list[AttentionSpec], list[tuple[str, str]]]:
    """The CPU specs of `runs` at `shape` that can run here, and (run, reason) for those that cannot."""
    batch, heads, seq_len, head_dim = shape
    specs, refused = [], []
    for variant, backend in runs:
        spec = AttentionSpec(
            variant=variant, backend=backend, batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim, device="cpu"
        )
        reason = attention.unsupported(spec)
        if reason:
            refused.append((spec.name, reason))
        else:
            specs.append(spec)
    return specs, refused


def time_app(spec: AttentionSpec) -> tuple[float, float | None, str]:
    """One /profile run of `spec`, as the app does it; its trace is thrown away."""
    with tempfile.TemporaryDirectory() as trace_dir:
        return app_forward_ms(profile_attention(spec, trace_dir).summary)


def time_timer(forward: attention.Prepared, min_run_time: float) -> float:
    """Median ms of the prepared forward under `torch.utils.benchmark.Timer`, no profiler, no grad."""
    timer = benchmark.Timer("forward()", globals={"forward": forward}, num_threads=torch.get_num_threads())
    with torch.no_grad():  # the app's inference forward runs without autograd too
        return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def measure(specs: Sequence[AttentionSpec], rounds: int, timer_s: float) -> tuple[list[Fidelity], set[str]]:
    """Every spec, `rounds` times, app and Timer side by side; returns the results and the app keys read."""
    prepared = {spec: attention.prepare(spec) for spec in specs}
    for spec in specs:  # untimed: the worker's start and each spec's first calls stay out of the figures
        time_app(spec)
        time_timer(prepared[spec], timer_s)
    figures: dict[AttentionSpec, list[tuple[float, float, float | None]]] = {spec: [] for spec in specs}
    keys: set[str] = set()
    started = time.monotonic()
    for round_ in range(rounds):
        for spec in specs:
            if round_ % 2 == 0:
                app, cv, key = time_app(spec)
                timer = time_timer(prepared[spec], timer_s)
            else:
                timer = time_timer(prepared[spec], timer_s)
                app, cv, key = time_app(spec)
            keys.add(key)
            figures[spec].append((app, timer, cv))
        print(f"round {round_ + 1}/{rounds} done, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    results = []
    for spec, rows in figures.items():
        app_ms, timer_ms, cvs = zip(*rows, strict=True)
        app_cv = tuple(c for c in cvs if c is not None)
        results.append(Fidelity(spec.name, app_ms, timer_ms, app_cv if len(app_cv) == len(cvs) else ()))
    return results, keys


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default=None, help=f"BxHxSxD, default {DEFAULT_SHAPE} ({QUICK_SHAPE} with --quick)")
    parser.add_argument("--variants", default=None, help="comma list of runs (naive, sdpa-math, ...); default: all")
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS} ({QUICK_ROUNDS} with --quick)"
    )
    parser.add_argument("--timer-s", type=float, default=None, help=f"Timer min_run_time, default {DEFAULT_TIMER_S}")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--quick", action="store_true", help="tiny shape, few rounds, a short Timer: a smoke run")
    args = parser.parse_args(argv)
    try:
        args.shape = parse_shape(args.shape or (QUICK_SHAPE if args.quick else DEFAULT_SHAPE))
        args.runs = attention.parse_runs(args.variants) if args.variants else list(ALL_RUNS)
    except (ValueError, SpecError) as exc:
        parser.error(str(exc))
    if args.rounds is None:
        args.rounds = QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS
    if args.timer_s is None:
        args.timer_s = QUICK_TIMER_S if args.quick else DEFAULT_TIMER_S
    if args.rounds < 1 or args.timer_s <= 0:
        parser.error("--rounds must be >= 1 and --timer-s > 0")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    keep_freed_cpu_memory()  # the runner tunes the allocator in the app's worker: the Timer gets the same
    specs, refused = specs_for(args.runs, args.shape)
    if not specs:
        sys.exit("fidelity: none of the runs asked for can run on this CPU")
    results, keys = measure(specs, args.rounds, args.timer_s)
    worker_threads = default_worker().call(torch.get_num_threads)
    print(
        f"CPU, torch {torch.__version__}, {torch.get_num_threads()} threads here and {worker_threads} in the app's "
        f"worker, {'x'.join(map(str, args.shape))} float32 inference, {args.rounds} interleaved rounds, "
        f"app = {' / '.join(sorted(keys))}, Timer min_run_time {args.timer_s} s, "
        f"app budget {os.environ.get(BUDGET_ENV, 'default')}, bootstrap {RESAMPLES} paired resamples, seed {SEED}"
    )
    print()
    print(format_table(results, args.markdown))
    print()
    met = sum(r.goal_met for r in results)
    print(f"goal (interval contains 1 and within 1 ± {TOLERANCE:.2f}) met by {met} of {len(results)} runs")
    for name, reason in refused:
        print(f"  {name}: not on this CPU: {reason}")


if __name__ == "__main__":
    main()
