"""Reading and analysing big traces: the parsers, our reader, our analysis and HTA side by side, 1x to ~1 GiB.

    python bench/parse_scale.py                          # 1x 4x 16x 64x 256x and ~1 GiB of JSON
    python bench/parse_scale.py --sizes 1,4 --max-gib 0.1 --no-hta    # a quick run
    python bench/parse_scale.py --source PATH.json.gz --hta-timeout-s 120 --keep /tmp/replicas

Each size is `bench.synthetic.replicate` of the source (times, correlation/External/flow ids and
step numbers shifted per copy), written gzipped. For each size, each route runs on that gzip in a
fresh child process (bench/readers.py says how each child measures):
- orjson: inflate, `orjson.loads` into dicts: the parse alone, as today's reader does it;
- msgspec: inflate, decode into typed Structs (name, ph, cat, ts, dur, pid, tid; args as Raw);
- reader: `profiling.reader.read_path`, our reader alone, gzip to event columns;
- analysis: `profiling.analysis.analyze_file` and the figures /analyze draws (timeline and steps
  chart, serialised as Gradio sends them): our whole analysis end to end, as the CLI runs it (numba,
  for the compiled reader, loaded by the read);
- server: the same, as the app's analysis worker runs it: forked from a server that imported
  `profiling.worker_process.PRELOAD` once (numba and the compiled code among them), so imported first;
- HTA 0.5.0 (its own venv, see bench/hta.py): `TraceAnalysis` load + kernel + temporal breakdown.
Seconds (wall; CPU s beside it, as the machine may be shared) exclude the interpreter's start and
imports (for the analysis, plotly's first Figure too: it builds its validators then, once per
process). MB/s is 10^6 bytes of inflated JSON per wall second, from the gzip file; `parse MB/s` is
the raw parsers' parse alone, after inflating. Peak is VmHWM after the work minus VmHWM after the
imports (summed RSS where a child ran several processes). A route stops after the size where it
passed --limit-gib of RSS or its time limit, and the table says so. `load` is the 1-minute load
average when the route started. The last lines judge the ~1 GiB size against issue 21's goal: each judged route
runs --repeats times there, and its median run (by wall time) is shown and judged, every run's time beside it, and
the largest peak of the runs judged.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.proc import peak_mib  # noqa: E402 - after the path above
from bench.readers import Figures, child_command, growth_mib, watched  # noqa: E402

GiB, MiB, MB = 1024**3, 1024**2, 10**6
DEFAULT_SOURCE = ROOT / "tests" / "data" / "sampled_training_rank0.json.gz"
DEFAULT_SIZES = "1,4,16,64,256,max"
ROUTES = {
    "orjson": "orjson.loads into dicts",
    "msgspec": "msgspec into typed Structs",
    "reader": "our reader (read_path)",
    "analysis": "our analysis, end to end",
    "server": "the same, in an app worker",
    "hta": "HTA load+kernel+temporal",
}
HEADS = {"orjson": "orjson → dicts", "msgspec": "msgspec → Structs", "reader": "our reader", "analysis": "our analysis"}
HEADS |= {"server": "in an app worker", "hta": "HTA"}  # the Markdown tables' column heads
JUDGED = {"server": "in an app worker (/analyze)", "analysis": "from the CLI"}  # the routes issue 21's goal judges
GOAL_S, GOAL_PEAK = 10.0, 1.5  # issue 21: ~1 GiB of JSON analysed end to end in 10 s, peak <= 1.5x the JSON
JUDGED_FROM_BYTES = int(0.9 * GiB)  # a size the goal is judged on (the largest, where it holds this much JSON)
# Runs of each judged route at a judged size: this machine's speed drifts by 5-10% within an hour (the same code
# measured 9.2-10.2 s in one evening), so the median run is judged, beside every run, and the largest peak.
DEFAULT_REPEATS = 3
COLUMNS = (("route", 28), ("s", 8), ("CPU s", 8), ("MB/s", 8), ("parse MB/s", 11), ("peak MiB", 10))
COLUMNS += (("peak/JSON", 10), ("load", 6))


@dataclass
class Size:
    """One replica and what each route measured on it (figures, or a string saying why none)."""

    copies: int
    events: int
    json_bytes: int
    gzip_bytes: int
    routes: dict[str, Figures | str] = field(default_factory=dict)


def child_analysis(path: str, preloaded: bool = False) -> None:
    """Run in a fresh interpreter: analyze `path` and draw its figures as /analyze does; print JSON.

    `preloaded`: first import what the app's forkserver imports before it forks each worker (PRELOAD)."""
    if preloaded:
        from profiling.worker_process import PRELOAD

        for module in PRELOAD:
            importlib.import_module(module)
    import plotly.graph_objects as go

    from profiling.analysis import analyze_file
    from profiling.charts import timeline, window_chart

    # plotly builds its figure classes' validators on the first Figure of a process (0.15-0.3 s here): an
    # import in all but name, which a server pays once, not per trace. Built before the clock, like the imports.
    go.Figure()
    baseline = peak_mib()
    start, cpu = time.perf_counter(), time.process_time()
    analysis = analyze_file(path)
    analysed, peak_before_drawing = time.perf_counter(), peak_mib()
    figures = (timeline(analysis), window_chart(analysis.steps))
    figure_bytes = sum(len(f.to_json()) for f in figures)  # Gradio sends each figure as plotly JSON
    drawn, cpu = time.perf_counter(), time.process_time() - cpu
    result = {"seconds": drawn - start, "analysis_s": analysed - start, "draw_s": drawn - analysed, "cpu_s": cpu}
    result |= {"events": len(analysis.trace.events), "figure_bytes": figure_bytes, "baseline_mib": baseline}
    print(json.dumps(result | {"peak_before_drawing_mib": peak_before_drawing, "peak_mib": peak_mib()}))


def sizes(spec: str, max_gib: float, copy_bytes: int) -> list[int]:
    """Copies per size: the listed ones that fit under `max_gib` of JSON, and `max` = as many as fit."""
    largest = max(1, int(max_gib * GiB // copy_bytes))
    wanted = {largest if s.strip() == "max" else int(s) for s in spec.split(",") if s.strip()}
    if any(n < 1 for n in wanted):
        raise ValueError(f"--sizes: copies must be at least 1, got {spec!r}")
    return sorted(n for n in wanted if n <= largest)


def mb_per_s(json_bytes: int, seconds: float) -> float:
    """10^6 bytes of JSON per second."""
    return json_bytes / seconds / MB


def peak_ratio(figures: Figures, json_bytes: int) -> float:
    """The work's peak memory over the size of its JSON."""
    return growth_mib(figures) * MiB / json_bytes


def route_cells(route: str, figures: Figures | str, json_bytes: int, replica_events: int | None = None) -> list[str]:
    """One line of a size's block: COLUMNS' cells, then a note (why there are no figures, or the split).

    `replica_events`, counted as the replica was written, checks every route but HTA's count.
    """
    if isinstance(figures, str):
        return [ROUTES[route], figures]
    parse = f"{mb_per_s(json_bytes, figures['parse_s']):,.0f}" if "parse_s" in figures else "-"
    cells = [ROUTES[route], f"{figures['seconds']:.2f}", f"{figures['cpu_s']:.2f}"]
    cells += [f"{mb_per_s(json_bytes, figures['seconds']):,.0f}", parse, f"{growth_mib(figures):,.0f}"]
    cells += [f"{peak_ratio(figures, json_bytes):.2f}", f"{figures.get('load', 0.0):.1f}"]
    notes = []
    if "draw_s" in figures:
        before = (figures["peak_before_drawing_mib"] - figures["baseline_mib"]) * MiB / json_bytes
        notes += [f"analysis {figures['analysis_s']:.2f} s + drawing {figures['draw_s']:.2f} s"]
        notes += [f"peak before drawing {before:.2f}x", f"figures {figures['figure_bytes'] / 1024:,.0f} KiB"]
    if "runs_s" in figures:
        peaks = [mib * MiB / json_bytes for mib in figures["runs_peak_mib"]]
        runs = ", ".join(f"{seconds:.2f}" for seconds in figures["runs_s"])
        notes += [f"median of {len(figures['runs_s'])} runs: {runs} s, peaks {min(peaks):.2f}-{max(peaks):.2f}x"]
    if figures.get("processes", 1) > 1:
        notes += [f"{figures['processes']} processes"]
    if figures.get("events") is not None:  # HTA keeps fewer: it drops the events it does not analyse
        notes += [f"{figures['events']:,} events" + (" kept" if route == "hta" else "")]
        if route != "hta" and replica_events is not None and figures["events"] != replica_events:
            notes += [f"MISMATCH: the replica has {replica_events:,}"]
    return [*cells, "; ".join(notes)]


def format_line(cells: list[str]) -> str:
    """COLUMNS' cells right-aligned (the first left-aligned), then the rest after two spaces."""
    (_, first), *rest = COLUMNS
    line = f"  {cells[0]:<{first}}" + "".join(f"{c:>{w}}" for c, (_, w) in zip(cells[1:], rest, strict=False))
    return line + "".join(f"  {c}" for c in cells[len(COLUMNS) :] if c)


def size_heading(size: Size) -> str:
    return (
        f"{size.copies}x: {size.events:,} events, {size.json_bytes / MiB:,.1f} MiB of JSON "
        f"({size.json_bytes / MB:,.1f} MB), {size.gzip_bytes / MiB:,.1f} MiB gzip"
    )


def markdown_tables(results: list[Size]) -> str:
    """MB/s and peak/JSON of every route at every size, as the two Markdown tables docs/benchmarks.md holds."""
    head = "| size | events | JSON MiB | " + " | ".join(HEADS.values()) + " |"
    rule = "|---|---:|---:|" + "---:|" * len(ROUTES)
    tables = []
    rates = "MB/s of JSON (10^6 bytes a second, from the gzip file; in brackets, the parse alone after inflating)"
    for title, cell in ((rates, _rate_cell), ("peak / JSON (VmHWM growth over the JSON bytes)", _peak_cell)):
        lines = [f"{title}:", "", head, rule]
        for size in results:
            cells = [f"{size.copies}x", f"{size.events:,}", f"{size.json_bytes / MiB:,.1f}"]
            cells += [cell(size.routes.get(r, "not run"), size.json_bytes) for r in ROUTES]
            lines += ["| " + " | ".join(cells) + " |"]
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def _rate_cell(figures: Figures | str, json_bytes: int) -> str:
    if isinstance(figures, str):
        return "–"
    rate = f"{mb_per_s(json_bytes, figures['seconds']):,.0f}"
    return rate + (f" ({mb_per_s(json_bytes, figures['parse_s']):,.0f})" if "parse_s" in figures else "")


def _peak_cell(figures: Figures | str, json_bytes: int) -> str:
    return "–" if isinstance(figures, str) else f"{peak_ratio(figures, json_bytes):.2f}"


def verdict(size: Size) -> str:
    """Issue 21's goal judged on `size`, a line per JUDGED route: end to end in at most GOAL_S, at a peak of at most
    GOAL_PEAK x the JSON."""
    where = f"{size.copies}x, {size.json_bytes / MiB:,.0f} MiB of JSON"
    if size.json_bytes < JUDGED_FROM_BYTES:
        return f"goal (~1 GiB in {GOAL_S:.0f} s at <= {GOAL_PEAK}x): not judged, the largest size here is {where}"
    return "\n".join(
        f"goal at {where}, {label}: {_judged(size.routes.get(route, 'not run'), size.json_bytes)}"
        for route, label in JUDGED.items()
    )


def _judged(ours: Figures | str, json_bytes: int) -> str:
    if isinstance(ours, str):
        return f"FAIL, the analysis has no figures ({ours})"
    seconds, peak = ours["seconds"], max(ours.get("runs_peak_mib", [growth_mib(ours)]))
    ratio = peak * MiB / json_bytes
    time_ok, peak_ok = seconds <= GOAL_S, ratio <= GOAL_PEAK
    runs = ours.get("runs_s", [])
    spread = f", the median of {len(runs)} runs ({min(runs):.1f}-{max(runs):.1f} s)" if runs else ""
    return (
        f"end to end {seconds:.1f} s{spread} (<= {GOAL_S:.0f} s: {'PASS' if time_ok else 'FAIL'}); "
        f"peak {peak:,.0f} MiB = {ratio:.2f}x the JSON{' at most' if runs else ''} "
        f"(<= {GOAL_PEAK}x: {'PASS' if peak_ok else 'FAIL'})"
    )


def typical(runs: list[Figures | str]) -> Figures | str:
    """The median of a route's runs by wall time (the lower one of an even count), with every run's seconds and
    peak beside it; the first failure where any run failed."""
    failed = next((run for run in runs if isinstance(run, str)), None)
    if failed is not None:
        return failed
    figures = [run for run in runs if not isinstance(run, str)]
    median = dict(sorted(figures, key=lambda run: run["seconds"])[(len(figures) - 1) // 2])
    if len(figures) > 1:
        median |= {"runs_s": [run["seconds"] for run in figures], "runs_peak_mib": [growth_mib(run) for run in figures]}
    return median


def machine() -> str:
    """CPU model, cores, memory and Python: the 'machine' of the docs' 'how it was made'."""
    models = [line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")]
    mem_kib = next((int(line.split()[1]) for line in _lines("/proc/meminfo") if line.startswith("MemTotal")), 0)
    model = models[0] if models else platform.machine()
    return f"{model}, {os.cpu_count()} CPUs, {mem_kib / 1024**2:.0f} GiB, Python {platform.python_version()}"


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def measure(route: str, path: Path, args: argparse.Namespace) -> Figures | str:
    """One route on one replica, in a fresh child process, within the limits of `args`."""
    load = os.getloadavg()[0]
    if route == "hta":
        from bench.hta import hta_timing_command

        figures = watched(hta_timing_command(path), args.hta_limit_gib * GiB, args.hta_timeout_s)
    elif route in ("analysis", "server"):
        command = [sys.executable, str(Path(__file__).resolve()), "--child-analysis", str(path)]
        command += ["--preloaded"] if route == "server" else []
        figures = watched(command, args.limit_gib * GiB, args.timeout_s)
    else:
        figures = watched(child_command(route, path), args.limit_gib * GiB, args.timeout_s)
    return figures if isinstance(figures, str) else figures | {"load": load}


def run(args: argparse.Namespace) -> list[Size]:
    """Every size, every route; prints each size's block as it is measured, then the tables and the verdict."""
    from bench.synthetic import replicate

    with tempfile.TemporaryDirectory() as folder:  # one copy as the replica writes it (compact JSON)
        copy_bytes = replicate(args.source, 1, Path(folder) / "one.json.gz")[1]
    plan = sizes(args.sizes, args.max_gib, copy_bytes)
    routes = [r for r in ROUTES if r != "hta" or not args.no_hta]
    print(f"{args.source.name} replicated {', '.join(f'{n}x' for n in plan)}; {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"machine: {machine()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"command: python bench/parse_scale.py {' '.join(sys.argv[1:])}", flush=True)
    stopped: dict[str, str] = {}
    results: list[Size] = []
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory() as folder:
        for copies in plan:
            path = Path(folder) / f"{args.source.name.split('.')[0]}_{copies}x.json.gz"
            events, json_bytes = replicate(args.source, copies, path)
            size = Size(copies, events, json_bytes, path.stat().st_size)
            print("\n" + size_heading(size))
            print(format_line([name for name, _ in COLUMNS]), flush=True)
            for route in routes:
                repeats = args.repeats if route in JUDGED and json_bytes >= JUDGED_FROM_BYTES else 1
                figures = stopped.get(route) or typical([measure(route, path, args) for _ in range(repeats)])
                if isinstance(figures, str) and route not in stopped:  # bigger sizes would fare no better
                    stopped[route] = f"stopped: at {copies}x it was {figures}"
                size.routes[route] = figures
                print(format_line(route_cells(route, figures, json_bytes, events)), flush=True)
            results.append(size)
            if not args.keep:
                path.unlink()
    print("\n" + markdown_tables(results) + "\n")
    print(verdict(results[-1]), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="a real trace to replicate")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="copies, comma-separated; max: fill --max-gib")
    parser.add_argument("--max-gib", type=float, default=1.0, help="largest replica, GiB of JSON (inflated)")
    parser.add_argument("--limit-gib", type=float, default=6.0, help="kill a route's child past this RSS")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="kill a route's child past this wall time")
    parser.add_argument("--no-hta", action="store_true", help="skip HTA")
    parser.add_argument("--hta-limit-gib", type=float, default=6.0, help="kill HTA past this RSS")
    parser.add_argument("--hta-timeout-s", type=float, default=300.0, help="kill HTA past this wall time")
    parser.add_argument("--keep", type=Path, help="write the replicas to this folder and keep them")
    parser.add_argument(
        "--repeats", type=int, default=DEFAULT_REPEATS, help="runs of each judged route at the ~1 GiB size"
    )
    parser.add_argument("--child-analysis", help=argparse.SUPPRESS)
    parser.add_argument("--preloaded", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: at least 1, got {args.repeats}")
    if args.child_analysis:
        child_analysis(args.child_analysis, args.preloaded)
        return
    run(args)


if __name__ == "__main__":
    main()
