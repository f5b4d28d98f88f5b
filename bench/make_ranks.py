"""Build a job of N rank traces from one real rank trace, with a known straggler and seeded jitter.

    python bench/make_ranks.py SRC OUT_DIR --ranks 8 --straggler 3 --factor 1.5 --jitter 0.02 --seed 0

Each rank is the source trace with:
- its clock shifted (a rank's clock is its own: a whole offset plus seeded skew, as real jobs show);
- its correlation and External ids offset, so no two ranks share one;
- `distributedInfo` {backend, rank, world_size} written (left out with --no-info: ranks come from the names);
- its timeline dilated: each compute kernel lasts `factor` × (1 + U(0, jitter)) longer on the straggler
  (1 + U(0, jitter) elsewhere), each collective 1 + U(0, jitter) longer, and every later event moves by
  the time added before it, so nesting, order and launch-to-kernel links stay as they were.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiling.communication import NOT_COMPUTATION, is_collective  # noqa: E402

ID_STRIDE = 10**9  # ids offset per rank: above any id a real trace has written (HTA's ranks reach 7e6)
CLOCK_STEP_US = 1_000_000.0  # rank r's clock starts r seconds later ...
CLOCK_SKEW_US = 5_000.0  # ... give or take this much, seeded
ID_ARGS = ("correlation", "External id", "external id")


def read_trace(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _is_kernel(event: dict[str, Any]) -> bool:
    return event.get("ph") == "X" and str(event.get("cat", "")).lower() == "kernel" and "dur" in event


def stretch_factors(events: list[dict[str, Any]], factor: float, jitter: float, rng: np.random.Generator) -> list:
    """(kernel, extra µs) for each kernel given more time: compute kernels by `factor`, all by the jitter."""
    out = []
    for event in events:
        if not _is_kernel(event) or float(event["dur"]) <= 0:
            continue
        name = str(event.get("name", ""))
        compute = not is_collective(name) and NOT_COMPUTATION.search(name) is None
        scale = (factor if compute else 1.0) * (1.0 + rng.uniform(0.0, jitter))
        out.append((event, float(event["dur"]) * (scale - 1.0)))
    return out


def dilation(stretched: list, base: float) -> Any:
    """t -> t + Σ extra_k × clip((t − s_k) ÷ d_k, 0, 1): time grows inside each stretched kernel, never shrinks;
    times (t and the kernels') counted from `base`.

    Σ rate_k × (min(t, e_k) − min(t, s_k)), each sum by sorted prefix sums (O(n log n), not O(n × kernels))."""
    starts = np.array([float(e["ts"]) for e, _ in stretched]) - base
    ends = starts + np.array([float(e["dur"]) for e, _ in stretched])
    rates = np.array([x for _, x in stretched]) / np.maximum(ends - starts, 1e-9)

    def clipped_sum(edges: np.ndarray, t: np.ndarray) -> np.ndarray:
        order = np.argsort(edges)
        x, r = edges[order], rates[order]
        before = np.concatenate([[0.0], np.cumsum(r * x)])  # Σ r x over edges ≤ t
        after = np.concatenate([np.cumsum(r[::-1])[::-1], [0.0]])  # Σ r over edges > t
        k = np.searchsorted(x, t, side="right")
        return before[k] + t * after[k]

    def shift(t: np.ndarray) -> np.ndarray:
        if not len(starts):
            return t
        return t + clipped_sum(ends, t) - clipped_sum(starts, t)

    return shift


def make_rank(source: dict[str, Any], rank: int, world: int, options: argparse.Namespace) -> dict[str, Any]:
    """One rank's trace (a new object; `source` is not changed)."""
    rng = np.random.default_rng([options.seed, rank])
    trace = orjson.loads(orjson.dumps(source))
    events = trace["traceEvents"]
    factor = options.factor if rank == options.straggler else 1.0
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    # Times relative to the first: epoch µs (1.7e15) times a rate would leave float64 ~0.25 µs of precision,
    # and the sums below would reorder events a few µs apart.
    base = min(float(e["ts"]) for e in timed)
    shift = dilation(stretch_factors(events, factor, options.jitter, rng), base)
    ts = np.array([float(e["ts"]) for e in timed]) - base
    end = ts + np.array([float(e.get("dur", 0.0)) for e in timed])
    new_ts, new_end = shift(ts), shift(end)
    offset = base + rank * CLOCK_STEP_US + rng.uniform(-CLOCK_SKEW_US, CLOCK_SKEW_US)
    # ns digits where float64 holds them; whole µs past 2^53 ns (epoch µs), ends rounded as starts so that
    # a child still ends inside its parent.
    digits = 3 if abs(base) < 2**53 / 1e3 else 0
    for event, start, stop in zip(timed, new_ts.tolist(), new_end.tolist(), strict=True):
        event["ts"] = round(start + offset, digits)
        if "dur" in event:
            event["dur"] = round(round(stop + offset, digits) - event["ts"], digits)
    _offset_ids(events, rank * ID_STRIDE)
    if options.no_info:
        trace.pop("distributedInfo", None)
    else:
        backend = (source.get("distributedInfo") or {}).get("backend", "nccl")
        trace["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world}
    return trace


def _offset_ids(events: list[dict[str, Any]], offset: int) -> None:
    for event in events:
        if event.get("ph") in ("s", "f") and isinstance(event.get("id"), int):
            event["id"] += offset  # flow arrows name their correlation id here
        args = event.get("args")
        if isinstance(args, dict):
            for key in ID_ARGS:
                if isinstance(args.get(key), int) and args[key] >= 0:
                    args[key] += offset


def kineto_json(trace: dict[str, Any]) -> bytes:
    """`trace` as JSON with `distributedInfo` first and spaced as Kineto writes it (`"rank": 3`): HTA finds a
    file's rank with the regex `"rank":\\s+(\\d+)` and takes every file without a match as rank 0."""
    info = trace.get("distributedInfo")
    if info is None:
        return orjson.dumps(trace)
    rest = orjson.dumps({k: v for k, v in trace.items() if k != "distributedInfo"})
    return b'{"distributedInfo": ' + json.dumps(info).encode() + (b", " + rest[1:] if len(rest) > 2 else b"}")


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--straggler", type=int, default=None, help="the rank whose compute is stretched")
    parser.add_argument("--factor", type=float, default=1.5, help="the straggler's compute kernels last this much")
    parser.add_argument("--jitter", type=float, default=0.02, help="every kernel lasts up to this fraction more")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-info", action="store_true", help="leave distributedInfo out")
    options = parser.parse_args(argv)
    source = read_trace(options.source)
    options.out.mkdir(parents=True, exist_ok=True)
    written = []
    for rank in range(options.ranks):
        path = options.out / f"job_rank-{rank}.json.gz"
        path.write_bytes(gzip.compress(kineto_json(make_rank(source, rank, options.ranks, options)), 1))
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in main():
        print(written_path)
