"""Trace readers side by side: seconds and peak RSS of each, in its own child process, on one trace.

    python bench/readers.py                # a ~200 MiB replica of tests/data/sampled_training_rank0
    python bench/readers.py --mib 50 --source PATH.json.gz

Every candidate ends in the same column builder (`profiling.reader.Columns`), so the figures
compare the parsers and their batching, not the table code:
- orjson / msgspec, whole file: inflate everything, parse one list of dicts, build the columns;
- ijson (yajl2_c), streamed: `ijson.items(..., "traceEvents.item")` in batches of 20,000 events;
- orjson over chunks: `profiling.reader.read_path`, the app's reader (structural scan, batches);
- stdlib json over chunks: the same reader without orjson, as on a bare torch install.
msgspec is not a project dependency: install it for the bench only (`pip install --target DIR
msgspec`, then `PYTHONPATH=DIR`); without it, its row says so.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.proc import peak_mib  # noqa: E402 - after the path above

CANDIDATES = (
    "orjson, whole file",
    "msgspec, whole file",
    "ijson yajl2_c, streamed",
    "orjson over chunks (profiling.reader)",
    "stdlib json over chunks (fallback)",
)
BATCH_EVENTS = 20_000


def _whole(loads: Callable[[bytes], object], path: Path) -> int:
    from profiling.reader import Columns, Limits

    data = gzip.decompress(path.read_bytes())
    events = loads(data)["traceEvents"]  # type: ignore[index]
    columns = Columns(Limits())
    columns.add(events, len(data))
    return len(columns.arrays()["ts"])


def _ijson(path: Path) -> int:
    import ijson

    from profiling.reader import Columns, Limits

    columns, batch = Columns(Limits()), []
    with gzip.open(path, "rb") as f:
        for event in ijson.items(f, "traceEvents.item", use_float=True):
            batch.append(event)
            if len(batch) == BATCH_EVENTS:
                columns.add(batch, 1 << 62)  # the tiny-event rule needs byte counts ijson does not give
                batch = []
    columns.add(batch, 1 << 62)
    return len(columns.arrays()["ts"])


def _chunks(path: Path) -> int:
    from profiling.reader import read_path

    return len(read_path(path).columns["ts"])


def child(name: str, path: Path) -> None:
    """Run one candidate in this process and print its figures as JSON."""
    if name.startswith("stdlib"):
        sys.modules["orjson"] = None  # type: ignore[assignment]  # import fails: the reader falls back
    if name.startswith("msgspec"):
        import msgspec

        run: Callable[[Path], int] = lambda p: _whole(msgspec.json.decode, p)  # noqa: E731
    elif name.startswith("orjson, whole"):
        import orjson

        run = lambda p: _whole(orjson.loads, p)  # noqa: E731
    else:
        run = _ijson if name.startswith("ijson") else _chunks
    import profiling.reader  # noqa: F401 - imported before the baseline, as the app has it

    baseline = peak_mib()
    start = time.perf_counter()
    rows = run(path)
    print(json.dumps({"seconds": time.perf_counter() - start, "peak": peak_mib(), "baseline": baseline, "rows": rows}))


def measure(name: str, path: Path) -> dict | str:
    """One candidate's figures, from a fresh child process; a string says why there are none."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", name, str(path)], capture_output=True, text=True, check=False
    )
    if done.returncode:
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=200, help="inflated size of the replica, MiB")
    parser.add_argument("--source", type=Path, default=ROOT / "tests/data/sampled_training_rank0.json.gz")
    parser.add_argument("--child", nargs=2, metavar=("NAME", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    from bench.synthetic import replicate

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "replica.json.gz"
        one_copy = len(gzip.decompress(args.source.read_bytes()))
        events, size = replicate(args.source, max(1, args.mib * 2**20 // one_copy), path)
        print(f"{events:,} events, {size / 2**20:.0f} MiB of JSON, {path.stat().st_size / 2**20:.1f} MiB gzip")
        print(f"{'reader':<40}{'seconds':>9}{'events/s':>12}{'peak MiB':>10}{'- baseline':>12}")
        for name in CANDIDATES:
            figures = measure(name, path)
            if isinstance(figures, str):
                print(f"{name:<40}  not run: {figures}")
                continue
            rate = figures["rows"] / figures["seconds"]
            growth = figures["peak"] - figures["baseline"]
            print(f"{name:<40}{figures['seconds']:>9.1f}{rate:>12,.0f}{figures['peak']:>10.0f}{growth:>12.0f}")


if __name__ == "__main__":
    main()
