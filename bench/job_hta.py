"""A whole job against HTA: our `analyze_job` on Dask (its LocalCluster's start-up counted) beside HTA's
`TraceAnalysis(trace_dir=...)` parse, temporal breakdown and comm/comp overlap, on the same rank traces.

    python bench/job_hta.py DIR                        # the rank traces bench/make_ranks.py wrote
    python bench/job_hta.py DIR --make SRC --copies 64 --ranks 8 --straggler 3
        # first: SRC replicated 64 times (bench.synthetic.replicate), then 8 ranks made from it into DIR

HTA runs in its own virtualenv (bench/hta.py), in a child process, and times its own work only, as ours
is timed from the call, not the interpreter's start. A benchmark, not a test: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.hta import hta_python  # noqa: E402 - after the path above

HTA_CHILD = """
import json, sys, time
from hta.trace_analysis import TraceAnalysis
start = time.perf_counter()
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
parsed = time.perf_counter()
analyzer.get_temporal_breakdown(visualize=False)
temporal = time.perf_counter()
overlap = analyzer.get_comm_comp_overlap(visualize=False)
done = time.perf_counter()
print(json.dumps({"parse_s": parsed - start, "temporal_s": temporal - parsed, "overlap_s": done - temporal,
                  "total_s": done - start, "overlap": overlap.to_dict(orient="records")}))
"""


def make_job(source: Path, copies: int, ranks: int, straggler: int, out: Path) -> None:
    """`ranks` traces in `out`, each `copies` back-to-back copies of `source`, one of them a straggler."""
    from bench import make_ranks
    from bench.synthetic import replicate

    with tempfile.TemporaryDirectory() as scratch:
        replica = Path(scratch) / "replica.json.gz"
        events, json_bytes = replicate(source, copies, replica)
        print(f"replica: {events:,} events, {json_bytes / 2**20:.1f} MiB of JSON per rank")
        make_ranks.main([str(replica), str(out), "--ranks", str(ranks), "--straggler", str(straggler)])


def ours(folder: Path) -> tuple[float, object]:
    from profiling.job.run import analyze_job, job_files

    start = time.perf_counter()
    result = analyze_job(job_files(str(folder)))
    return time.perf_counter() - start, result


def hta(folder: Path) -> dict:
    done = subprocess.run(
        [str(hta_python()), "-c", HTA_CHILD, str(folder)], capture_output=True, text=True, timeout=3600
    )
    if done.returncode != 0:
        raise RuntimeError(f"HTA failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--make", type=Path, help="a real rank trace to build the job from first")
    parser.add_argument("--copies", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--straggler", type=int, default=3)
    options = parser.parse_args(argv)
    if options.make:
        make_job(options.make, options.copies, options.ranks, options.straggler, options.folder)
    ours_s, result = ours(options.folder)
    theirs = hta(options.folder)
    print(
        f"ours ({result.engine}, start-up included): {ours_s:.1f} s; findings {[f.title for f in result.view.findings]}"
    )
    print(
        f"HTA 0.5.0: {theirs['total_s']:.1f} s (parse {theirs['parse_s']:.1f}, temporal {theirs['temporal_s']:.1f}, "
        f"overlap {theirs['overlap_s']:.1f}); HTA / ours = {theirs['total_s'] / ours_s:.2f}x"
    )
    print("HTA's comm/comp overlap per rank:", json.dumps(theirs["overlap"]))


if __name__ == "__main__":  # Dask's and the pool's workers import this module again: nothing runs at import
    main()
