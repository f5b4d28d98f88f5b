"""Trace readers side by side: seconds and peak RSS of each, in its own child process, on one trace.

    python bench/readers.py                # a ~200 MiB replica of tests/data/sampled_training_rank0
    python bench/readers.py --mib 50 --source PATH.json.gz

Every route starts from the same gzip file and ends when its parse is done; none builds columns
except the app's reader, so the raw routes show what the parser alone costs:
- orjson: inflate the whole file, `orjson.loads` it into dicts (the parser today's reader uses);
- msgspec: inflate the whole file, decode it into typed Structs holding only name, ph, cat, ts,
  dur, pid, tid, with `args` kept as raw JSON bytes (`msgspec.Raw`), so no per-event dict is built;
- ijson (yajl2_c): stream `traceEvents.item` from the gzip, counting events;
- reader: `profiling.reader.read_path`, the app's reader, from gzip to event columns;
- fallback: the same reader with orjson and msgspec unimportable (the stdlib route of a bare CLI).
`bench/parse_scale.py` runs the same children over sizes from 1x to ~1 GiB.

Each child prints one JSON line: seconds (wall) and cpu_s from the start of the work, and, for the
whole-file routes, inflate_s and parse_s; baseline_mib (VmHWM after imports) and peak_mib (VmHWM
after the work). The parent polls the child's RSS plus the private memory of any process it starts
(a parallel reader's workers; pages they share with the child count once), so a peak spread over
several processes is not missed.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.proc import peak_mib, status_kib  # noqa: E402 - after the path above

ROUTES = {
    "orjson": "orjson.loads, whole file, into dicts",
    "msgspec": "msgspec, whole file, typed Structs (args as Raw)",
    "ijson": "ijson yajl2_c, streamed",
    "reader": "profiling.reader.read_path (ours)",
    "fallback": "read_path without orjson/msgspec (stdlib)",
}
POLL_S = 0.1
GiB, MiB = 1024**3, 1024**2
Figures = dict[str, Any]


def _inflated(path: Path) -> tuple[bytes, float]:
    start = time.perf_counter()
    return gzip.decompress(path.read_bytes()), time.perf_counter() - start


def _orjson(path: Path) -> Figures:
    import orjson

    data, inflate_s = _inflated(path)
    start = time.perf_counter()
    events = orjson.loads(data)["traceEvents"]
    return {"events": len(events), "inflate_s": inflate_s, "parse_s": time.perf_counter() - start}


def _msgspec_decoder() -> Callable[[bytes], Any]:
    import msgspec

    # Built with defstruct: class statements here would leave their annotations as strings (this module's
    # `from __future__ import annotations`) that msgspec cannot resolve inside a function.
    # gc=False: these Structs hold no cycles, so the collector need not track millions of them.
    fields = [("name", str, ""), ("ph", str, ""), ("cat", str, ""), ("ts", float | None, None)]
    fields += [("dur", float | None, None), ("pid", int | str | None, None), ("tid", int | str | None, None)]
    event = msgspec.defstruct("Event", [*fields, ("args", msgspec.Raw, msgspec.Raw())], gc=False)
    # Every other top-level key (deviceProperties, ...) is skipped unparsed.
    document = msgspec.defstruct("Document", [("traceEvents", list[event])], gc=False)
    return msgspec.json.Decoder(document).decode


def _msgspec(path: Path) -> Figures:
    decode = _msgspec_decoder()
    data, inflate_s = _inflated(path)
    start = time.perf_counter()
    events = decode(data).traceEvents
    return {"events": len(events), "inflate_s": inflate_s, "parse_s": time.perf_counter() - start}


def _ijson(path: Path) -> Figures:
    import ijson

    with gzip.open(path, "rb") as f:
        return {"events": sum(1 for _ in ijson.items(f, "traceEvents.item", use_float=True))}


def _reader(path: Path) -> Figures:
    from profiling.reader import read_path

    return {"events": len(read_path(path).columns["ts"])}


def child(name: str, path: Path) -> None:
    """Run one route in this process and print its figures as one JSON line."""
    if name == "fallback":  # imports of the fast parsers fail, so the reader takes its stdlib route
        sys.modules["orjson"] = sys.modules["msgspec"] = None  # type: ignore[assignment]
    run = {"orjson": _orjson, "msgspec": _msgspec, "ijson": _ijson, "reader": _reader, "fallback": _reader}[name]
    import profiling.reader  # noqa: F401 - imported before the baseline, as the app has it

    if name == "msgspec":
        import msgspec  # noqa: F401 - an import, not work: before the baseline like the others'

    baseline = peak_mib()
    start, cpu = time.perf_counter(), _cpu_s()
    figures = run(path)
    seconds, cpu = time.perf_counter() - start, _cpu_s() - cpu
    print(json.dumps(figures | {"seconds": seconds, "cpu_s": cpu, "baseline_mib": baseline, "peak_mib": peak_mib()}))


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that have exited (a parallel reader's workers)."""
    own, done = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + done.ru_utime + done.ru_stime


def child_command(name: str, path: Path) -> list[str]:
    """The command that runs route `name` (a key of ROUTES) on `path` in a fresh interpreter."""
    return [sys.executable, str(Path(__file__).resolve()), "--child", name, str(path)]


def _tree(root: int) -> list[int]:
    """`root` and every live process descended from it (read from /proc: no psutil needed)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited while we looked
            continue
        parents[int(text.split(" ", 1)[0])] = int(text.rsplit(")", 1)[1].split()[1])
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def _private_kib(pid: int) -> int:
    """Memory only `pid` holds: a forked worker's pages still shared with its parent are in the parent's RSS."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:  # exited while we looked
        return 0
    return sum(int(line.split()[1]) for line in lines if line.startswith(("Private_Clean:", "Private_Dirty:")))


def watched(command: list[str], limit_bytes: float = float("inf"), timeout_s: float = float("inf")) -> Figures | str:
    """Run `command` (which prints one JSON line last); kill it past `limit_bytes` of RSS or `timeout_s`.

    Returns its JSON with `tree_mib` (the most memory it and its descendants held at once, polled: its
    RSS plus their private pages) and `processes` (the most seen at once) added, or a string saying
    why there is none.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        start, why, tree_kib, processes = time.monotonic(), "", 0, 1
        while child.poll() is None:
            pids = _tree(child.pid)
            rss_kib = status_kib("VmRSS", child.pid) + sum(_private_kib(pid) for pid in pids[1:])
            tree_kib, processes = max(tree_kib, rss_kib), max(processes, len(pids))
            if rss_kib * 1024 > limit_bytes:
                why = f"killed past {limit_bytes / GiB:.1f} GiB RSS"
            elif time.monotonic() - start > timeout_s:
                why = f"killed past {timeout_s:.0f} s"
            if why:
                for pid in reversed(pids):  # this child's own workers, then the child
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                child.wait()
                return why
            time.sleep(POLL_S)
        out.seek(0), err.seek(0)
        lines = out.read().strip().splitlines()
        if child.returncode or not lines:
            tail = err.read().strip().splitlines()
            return f"failed: {tail[-1][:100] if tail else f'exit {child.returncode}'}"
        return json.loads(lines[-1]) | {"tree_mib": tree_kib / 1024, "processes": processes}


def growth_mib(figures: Figures) -> float:
    """Peak memory the work added: VmHWM growth; where it ran in several processes, the polled tree's, if larger.

    The tree's is sampled every POLL_S, so a shorter spike in a worker can be missed; the child's own
    VmHWM never misses one.
    """
    own = figures["peak_mib"] - figures["baseline_mib"]
    if figures.get("processes", 1) > 1:
        return max(own, figures["tree_mib"] - figures["baseline_mib"])
    return own


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
        events, size = replicate(args.source, max(1, args.mib * MiB // one_copy), path)
        print(f"{events:,} events, {size / MiB:.0f} MiB of JSON, {path.stat().st_size / MiB:.1f} MiB gzip")
        print(f"{'route':<50}{'seconds':>9}{'CPU s':>7}{'MB/s':>7}{'parse MB/s':>12}{'peak growth MiB':>17}")
        for name, label in ROUTES.items():
            figures = watched(child_command(name, path))
            if isinstance(figures, str):
                print(f"{label:<50}  not run: {figures}")
                continue
            seconds, rate = figures["seconds"], size / figures["seconds"] / 1e6  # MB/s: 10^6 bytes of JSON
            parse = f"{size / figures['parse_s'] / 1e6:.0f}" if "parse_s" in figures else "-"
            print(f"{label:<50}{seconds:>9.2f}{figures['cpu_s']:>7.2f}{rate:>7.0f}{parse:>12}", end="")
            print(f"{growth_mib(figures):>17,.0f}")


if __name__ == "__main__":
    main()
