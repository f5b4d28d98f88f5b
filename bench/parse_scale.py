"""Scaling of the whole upload analysis, beside Holistic Trace Analysis (HTA), on replicas of a real trace.

    python bench/parse_scale.py                          # 1x 4x 16x 64x 256x and ~1 GiB of JSON
    python bench/parse_scale.py --sizes 1,4 --max-gib 0.05 --no-hta    # a quick run
    python bench/parse_scale.py --source PATH.json.gz --hta-timeout-s 120 --keep /tmp/replicas

Each size is `bench.synthetic.replicate` of the source (times, correlation/External/flow ids and
step numbers shifted per copy), written gzipped. For each size, in fresh child processes:
- ours: `profiling.analysis.analyze_file` on the gzip, as /analyze and the CLI call it, then the
  figures /analyze draws (timeline and steps chart, serialised as Gradio sends them);
- HTA 0.5.0 (its own venv, see bench/hta.py): `TraceAnalysis` load + kernel breakdown + temporal
  breakdown of the same gzip.
Seconds (wall, and the child's CPU time: the machine may be shared) exclude the interpreter's
start and imports. Peak RSS is VmHWM from /proc/self/status after the work minus VmHWM after the
imports (ours: read before drawing, so it is the analysis alone; `draw s` and `fig KiB` are the
drawing's). HTA sizes stop after one that passes --hta-limit-gib of RSS or --hta-timeout-s, and
the table says so. `marginal` is events per second beyond 1x: flat when time is linear.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.proc import peak_mib, status_kib  # noqa: E402 - after the path above

GiB, MiB = 1024**3, 1024**2
DEFAULT_SOURCE = ROOT / "tests" / "data" / "sampled_training_rank0.json.gz"
DEFAULT_SIZES = "1,4,16,64,256,max"
POLL_S = 0.25


def child_ours(path: str) -> None:
    """Run in a fresh interpreter: analyze `path` as /analyze does, print figures as JSON."""
    from profiling.analysis import analyze_file
    from profiling.charts import timeline, window_chart

    baseline = peak_mib()
    start, cpu = time.perf_counter(), time.process_time()
    analysis = analyze_file(path)
    analysed, cpu = time.perf_counter(), time.process_time() - cpu
    peak = peak_mib()
    figures = (timeline(analysis), window_chart(analysis.steps))
    figure_bytes = sum(len(f.to_json()) for f in figures)  # Gradio sends each figure as plotly JSON
    drawn = time.perf_counter()
    result = {"seconds": analysed - start, "cpu_s": cpu, "draw_s": drawn - analysed, "figure_bytes": figure_bytes}
    result |= {"events": len(analysis.trace.events), "baseline_mib": baseline, "peak_mib": peak}
    print(json.dumps(result | {"peak_with_draw_mib": peak_mib()}))


def watched(command: list[str], limit_bytes: float, timeout_s: float) -> dict[str, Any] | str:
    """Run `command` (which prints one JSON line last); kill it past `limit_bytes` of RSS or `timeout_s`.

    Returns its JSON, or a string saying why there is none.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        start, why = time.monotonic(), ""
        while child.poll() is None:
            if status_kib("VmRSS", child.pid) * 1024 > limit_bytes:
                why = f"killed past {limit_bytes / GiB:.0f} GiB RSS"
            elif time.monotonic() - start > timeout_s:
                why = f"killed past {timeout_s:.0f} s"
            if why:
                child.kill()
                child.wait()
                return why
            time.sleep(POLL_S)
        out.seek(0), err.seek(0)
        lines = out.read().strip().splitlines()
        if child.returncode or not lines:
            tail = err.read().strip().splitlines()
            return f"failed: {tail[-1][:100] if tail else f'exit {child.returncode}'}"
        return json.loads(lines[-1])


def ours(path: Path) -> dict[str, Any] | str:
    return watched([sys.executable, __file__, "--child-ours", str(path)], float("inf"), float("inf"))


def sizes(spec: str, max_gib: float, copy_bytes: int) -> list[int]:
    """Copies per size: the listed ones that fit under `max_gib` of JSON, and `max` = as many as fit."""
    largest = max(1, int(max_gib * GiB // copy_bytes))
    wanted = {largest if s == "max" else int(s) for s in spec.split(",") if s.strip()}
    return sorted(n for n in wanted if n <= largest)


HEADER = (
    ("size", 6),
    ("events", 11),
    ("JSON MiB", 10),
    ("gzip MiB", 9),
    ("ours s", 8),
    ("CPU s", 7),
    ("events/s", 10),
    ("vs 1x", 7),
    ("marginal", 10),
    ("peak MiB", 9),
    ("peak/JSON", 10),
    ("draw s", 8),
    ("fig KiB", 8),
    ("HTA s", 8),
    ("CPU s", 7),
    ("HTA peak", 9),
    ("HTA/ours s", 11),
    ("HTA/ours peak", 14),
)


def row_cells(
    copies: int, events: int, json_bytes: int, gz_bytes: int, us: Any, hta: Any, base: tuple[int, float]
) -> list:
    """One row; `base` is the smallest size's (events, seconds), for the ratio and the marginal rate."""
    cells: list[str] = [f"{copies}x", f"{events:,}", f"{json_bytes / MiB:,.0f}", f"{gz_bytes / MiB:,.1f}"]
    if isinstance(us, str):
        cells += [us] + [""] * 8
    else:
        rate, grown = events / us["seconds"], us["peak_mib"] - us["baseline_mib"]
        # Events per extra second beyond the smallest size: flat when time is fixed cost + linear.
        extra = us["seconds"] - base[1]
        marginal = f"{(events - base[0]) / extra:,.0f}" if events > base[0] and extra > 0 else "-"
        cells += [f"{us['seconds']:.1f}", f"{us['cpu_s']:.1f}", f"{rate:,.0f}", f"{rate / (base[0] / base[1]):.2f}"]
        cells += [marginal, f"{grown:,.0f}"]
        cells += [f"{grown * MiB / json_bytes:.2f}", f"{us['draw_s']:.1f}", f"{us['figure_bytes'] / 1024:,.0f}"]
    if isinstance(hta, str):
        cells += [hta]
    elif not isinstance(us, str):
        hta_grown = hta["peak_mib"] - hta["baseline_mib"]
        cells += [f"{hta['seconds']:.1f}", f"{hta['cpu_s']:.1f}", f"{hta_grown:,.0f}"]
        cells += [f"{hta['seconds'] / us['seconds']:.1f}"]
        cells += [f"{hta_grown / (us['peak_mib'] - us['baseline_mib']):.1f}"]
    return cells


def print_row(cells: list[str]) -> None:
    line = "".join(f"{c:>{w}}" if len(c) < w else f"  {c}" for c, (_, w) in zip(cells, HEADER, strict=False))
    print(line + "".join(f"  {c}" for c in cells[len(HEADER) :]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="a real trace to replicate")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="copies, comma-separated; max: fill --max-gib")
    parser.add_argument("--max-gib", type=float, default=1.0, help="largest replica, GiB of JSON (inflated)")
    parser.add_argument("--no-hta", action="store_true", help="skip HTA")
    parser.add_argument("--hta-limit-gib", type=float, default=10.0, help="kill HTA past this RSS")
    parser.add_argument("--hta-timeout-s", type=float, default=300.0, help="kill HTA past this wall time")
    parser.add_argument("--keep", type=Path, help="write the replicas to this folder and keep them")
    parser.add_argument("--child-ours", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_ours:
        child_ours(args.child_ours)
        return
    run(args)


def run(args: argparse.Namespace) -> None:
    from bench.hta import hta_timing_command
    from bench.synthetic import replicate

    with tempfile.TemporaryDirectory() as folder:  # one copy as the replica writes it (compact JSON)
        copy_bytes = replicate(args.source, 1, Path(folder) / "one.json.gz")[1]
    plan = sizes(args.sizes, args.max_gib, copy_bytes)
    print(
        f"{args.source.name} replicated {', '.join(f'{n}x' for n in plan)}; {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} CPUs; peak = VmHWM growth after imports; HTA = load + kernel + temporal breakdown"
    )
    print("".join(f"{h:>{w}}" for h, w in HEADER), flush=True)
    hta_stopped: str | None = "not run (--no-hta)" if args.no_hta else None
    base: tuple[int, float] | None = None
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory() as folder:
        for copies in plan:
            path = Path(folder) / f"{args.source.name.split('.')[0]}_{copies}x.json.gz"
            events, json_bytes = replicate(args.source, copies, path)
            us = ours(path)
            if base is None and not isinstance(us, str):
                base = (events, us["seconds"])
            hta: Any = hta_stopped
            if hta is None:
                limit = args.hta_limit_gib * GiB
                hta = watched(hta_timing_command(path), limit, args.hta_timeout_s)
                if isinstance(hta, str):
                    hta_stopped = f"stopped: at {copies}x HTA was {hta}"
            print_row(row_cells(copies, events, json_bytes, path.stat().st_size, us, hta, base or (events, 1.0)))
            if not args.keep:
                path.unlink()


if __name__ == "__main__":
    main()
