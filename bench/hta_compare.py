"""Our GPU metrics against Holistic Trace Analysis (HTA 0.5.0), and our analysis time against HTA's.

    python bench/hta_compare.py [TRACE ...]   # default: the real GPU traces in tests/data

For each trace, three columns:
- `HTA`: what HTA reports (run by bench/hta.py in its own venv);
- `ours, HTA's rules`: HTA's definitions recomputed on our event table, with HTA's scope
  (GPU work launched before the last ProfilerStep starts, and only work whose launch is in
  the trace). Equal to `HTA` where we understood HTA right;
- `ours`: what the app reports (the TensorBoard plugin's steps span; every kernel).
Then the wall time of our whole in-process analysis of the largest trace (load, GPU metrics,
kernel stats, step breakdown, idle time; in a fresh child, without the interpreter's start)
against HTA's load + kernel breakdown + temporal breakdown of the same file.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


import numpy as np
import pandas as pd

from bench.hta import run_hta
from profiling import intervals as iv
from profiling.gpu_metrics import gpu_metrics, kernel_stats
from profiling.idle_time import idle_breakdown_us, idle_time
from profiling.step_breakdown import profiler_steps, step_breakdown
from profiling.trace import LAUNCH_CATEGORIES, Trace, load_trace

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
TRACES = [
    DATA / "tb_plugin" / "resnet50_num_workers_4.pt.trace.json.gz",
    DATA / "sampled_training_rank0.json.gz",
    DATA / "a100_simple_add.json.gz",
]


def hta_scope(trace: Trace) -> Trace:
    """The events HTA analyses, as HTA 0.5.0 prepares them.

    - trace_parser.round_down_time_stamps: with fractional timestamps, ts is rounded up and the
      end down to whole µs;
    - Trace._filter_irrelevant_gpu_kernels: with 2+ steps, GPU work is kept only where a host
      event that starts before the last step does launched it (no launch in the trace: dropped).
    """
    ev = trace.events.copy()
    if (ev["ts"] % 1).any():
        ev["ts"], ev["end"] = np.ceil(ev["ts"]), np.floor(ev["end"])
        ev["dur"] = ev["end"] - ev["ts"]
    gpu = ev["cat"].isin(("kernel", "gpu_memcpy", "gpu_memset")) & ev["stream"].notna()
    launch = ev["cat"].isin(LAUNCH_CATEGORIES) & ev["correlation"].notna()
    steps = profiler_steps(trace)
    if steps["name"].nunique() > 1:
        launch &= ev["ts"] < steps["ts"].max()
    keep = (gpu & ev["correlation"].isin(ev.loc[launch, "correlation"])) | ~gpu
    return Trace(events=ev[keep].reset_index(drop=True), device_properties=trace.device_properties)


def on_a_stream(trace: Trace) -> pd.DataFrame:
    """BreakdownAnalysis.get_temporal_breakdown takes every event with a `stream` arg as GPU work."""
    ev = trace.complete
    return ev[ev["stream"].notna() & ev["stream"].ne(-1)]


def hta_temporal_us(trace: Trace) -> dict[str, float]:
    """get_temporal_breakdown: first to last event on a stream, minus the union of those events."""
    work = on_a_stream(trace)
    busy = iv.union(work["ts"].to_numpy(), work["end"].to_numpy())
    span = float(busy[1].max() - busy[0].min())
    return {"idle_time(us)": span - iv.total(busy), "kernel_time(us)": span}


def why_we_differ(trace: Trace) -> list[str]:
    """What in this trace makes HTA's numbers differ from ours, counted."""
    scoped, ev = hta_scope(trace), trace.complete
    not_gpu = on_a_stream(trace)
    not_gpu = not_gpu[~not_gpu["cat"].isin(("kernel", "gpu_memcpy", "gpu_memset"))]
    reasons = [
        f"{len(trace.gpu_activity) - len(scoped.gpu_activity)} GPU events left out by HTA "
        "(launched in the last step, or launch not in the trace)",
        f"{len(not_gpu)} non-GPU events counted as GPU busy time by HTA's temporal breakdown "
        f"(they carry a `stream` arg: {', '.join(sorted(not_gpu['cat'].unique())) or 'none'})",
        f"{int((ev['ts'] % 1).ne(0).sum())} events with fractional µs timestamps, which HTA rounds to whole µs",
        "HTA's idle span is first to last GPU event; ours is the plugin's steps span (whole trace without steps), "
        "and counts only kernels as busy, as the plugin's utilization does",
    ]
    return reasons


def ours_in_child(trace: Path) -> dict[str, Any]:
    """Our whole analysis in a fresh interpreter: wall time after imports, and peak RSS."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--ours", str(trace)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _time_ours(trace: str) -> None:
    start = time.perf_counter()
    t = load_trace(trace)
    loaded = time.perf_counter()
    gpu_metrics(t), kernel_stats(t), step_breakdown(t), idle_time(t)
    done = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {"load_s": loaded - start, "analysis_s": done - loaded, "peak_rss_mib": rss, "events": len(t.events)}
        )
    )


def compare_rows(path: Path, hta: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    trace = load_trace(path)
    scoped = hta_scope(trace)
    ours_idle = idle_time(trace)
    rows = [
        (
            "GPU idle (us)",
            hta["temporal_us"]["idle_time(us)"],
            hta_temporal_us(scoped)["idle_time(us)"],
            ours_idle["idle_time_us"],
        ),
        ("GPU span (us)", hta["temporal_us"]["kernel_time(us)"], hta_temporal_us(scoped)["kernel_time(us)"], None),
    ]
    scoped_breakdown = idle_breakdown_us(scoped)
    for stream, theirs in sorted(hta["idle_us"].items()):
        for category in ("host_wait", "kernel_wait", "other"):
            rows.append(
                (
                    f"stream {stream} {category} (us)",
                    theirs.get(category, 0.0),
                    scoped_breakdown.get(stream, {}).get(category),
                    (ours_idle["idle_breakdown_us"] or {}).get(stream, {}).get(category),
                )
            )
    return rows


def print_table(title: str, rows: list[tuple[str, Any, Any, Any]], reasons: list[str]) -> None:
    print(f"\n{title}")
    print(f"{'metric':<34}{'HTA':>14}{'ours, HTA rules':>18}{'ours':>14}")
    for name, *values in rows:
        cells = ["-" if v is None else f"{v:,.0f}" for v in values]
        print(f"{name:<34}" + "".join(f"{c:>{w}}" for c, w in zip(cells, (14, 18, 14), strict=True)))
    print("why ours differs from HTA:")
    for reason in reasons:
        print(f"  - {reason}")


def main(paths: list[Path]) -> None:
    results = {}
    for path in paths:
        hta = run_hta(path)
        results[path] = hta
        print_table(path.name, compare_rows(path, hta), why_we_differ(load_trace(path)))
    largest = max(paths, key=lambda p: len(load_trace(p).events))
    ours = ours_in_child(largest)
    hta = results[largest]
    hta_s = hta["load_s"] + hta["kernel_breakdown_s"] + hta["temporal_breakdown_s"]
    ours_s = ours["load_s"] + ours["analysis_s"]
    print(f"\nTiming on {largest.name} ({ours['events']:,} events), wall seconds after imports:")
    print(
        f"  ours: load {ours['load_s']:.2f} + analysis {ours['analysis_s']:.2f} = {ours_s:.2f} s, "
        f"peak RSS {ours['peak_rss_mib']:.0f} MiB"
    )
    print(
        f"  HTA:  load {hta['load_s']:.2f} + kernel {hta['kernel_breakdown_s']:.2f} + temporal "
        f"{hta['temporal_breakdown_s']:.2f} = {hta_s:.2f} s (idle breakdown {hta['idle_breakdown_s']:.2f} s more), "
        f"peak RSS {hta['peak_rss_mib']:.0f} MiB"
    )
    print(f"  ours is {hta_s / ours_s:.1f}x faster")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--ours":
        _time_ours(sys.argv[2])
    else:
        main([Path(p) for p in sys.argv[1:]] or TRACES)
