"""Synthetic Kineto-style traces of any size, built from one real step pattern."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import orjson


def synthetic_trace(steps: int, ops_per_step: int = 40) -> dict:
    """`steps` profiler steps, each with nested aten ops, launches, kernels and flow ids.

    Each step has 1 step annotation + ops_per_step x (op, child op, launch, kernel) events.
    """
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}]
    t, correlation = 0.0, 0
    for step in range(steps):
        start = t
        body: list[dict] = []
        for i in range(ops_per_step):
            correlation += 1
            shapes = {"Input Dims": [[8, 16, 1024, 64], [8, 16, 64, 1024]], "Input type": ["c10::BFloat16"] * 2}
            body += [
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": f"aten::op{i % 9}",
                    "pid": 1,
                    "tid": 1,
                    "ts": t,
                    "dur": 9.0,
                    "args": shapes,
                },
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::bmm",
                    "pid": 1,
                    "tid": 1,
                    "ts": t + 1,
                    "dur": 6.0,
                    "args": shapes,
                },
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": 1,
                    "ts": t + 2,
                    "dur": 3.0,
                    "args": {"correlation": correlation},
                },
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn_{i % 5}",
                    "pid": 0,
                    "tid": 7,
                    "ts": t + 4,
                    "dur": 20.0,
                    "args": {
                        "correlation": correlation,
                        "device": 0,
                        "stream": 7,
                        "registers per thread": 128,
                        "shared memory": 49152,
                        "grid": [128, 16, 1],
                        "block": [128, 1, 1],
                        "est. achieved occupancy %": 12,
                    },
                },
            ]
            t += 10
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": t - start,
                "args": {},
            }
        )
        events += body
        t += 5
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": events}


def write_trace(path: Path, steps: int) -> int:
    """Write a gzipped synthetic trace; returns its event count."""
    trace = synthetic_trace(steps)
    path.write_bytes(gzip.compress(orjson.dumps(trace), compresslevel=6))
    return len(trace["traceEvents"])


_ID_ARGS = ("correlation", "External id", "external id")


def replicate(source: Path, copies: int, out: Path) -> tuple[int, int]:
    """Write `copies` of a real trace's events back to back, as one gzip trace; returns (events, JSON bytes).

    Each copy starts after the previous one ends; its correlation and External ids (and the ids of
    the flow arrows that pair launches with kernels) move past the previous copy's, and its
    `ProfilerStep#N` numbers follow on, so every copy analyses like the original.
    """
    document = orjson.loads(gzip.decompress(source.read_bytes()))
    events = [e for e in document.pop("traceEvents") if isinstance(e, dict)]
    times = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(end for _, end in times) - min(start for start, _ in times) + 1000
    if all(type(start) is int for start, _ in times):
        # Whole µs, so each copy's starts are written as the source wrote them: a `.0` on every one would make
        # the reader rewrite times (profiling/timestamps.py) that the source never asks it to.
        span = math.ceil(span)
    id_step = 1 + max(_ids(events), default=0)
    step_step = 1 + max((_step(e) for e in events), default=-1)
    head = orjson.dumps(document)[:-1] + (b',"traceEvents":[' if document else b'"traceEvents":[')
    written, count = 0, 0
    with gzip.open(out, "wb", compresslevel=1) as f:
        written += f.write(head)
        for copy in range(copies):
            shifted = [_shifted(e, copy * span, copy * id_step, copy * step_step) for e in events]
            block = (b"," if copy else b"") + b",".join(orjson.dumps(e) for e in shifted)
            written += f.write(block)
            count += len(shifted)
        written += f.write(b"]}")
    return count, written


def _ids(events: list[dict]) -> list[int]:
    ids = [e["id"] for e in events if isinstance(e.get("id"), int)]
    for e in events:
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        ids += [args[k] for k in _ID_ARGS if isinstance(args.get(k), int)]
    return ids


def _step(event: dict) -> int:
    name = event.get("name", "")
    prefix = "ProfilerStep#"
    return int(name[len(prefix) :]) if isinstance(name, str) and name.startswith(prefix) else -1


def _shifted(event: dict, dt: float, did: int, dstep: int) -> dict:
    event = dict(event)
    if isinstance(event.get("ts"), (int, float)) and event.get("ph") != "M":
        event["ts"] = event["ts"] + dt
    if isinstance(event.get("id"), int):
        event["id"] += did
    if isinstance(event.get("args"), dict) and any(k in event["args"] for k in _ID_ARGS):
        event["args"] = {k: v + did if k in _ID_ARGS and isinstance(v, int) else v for k, v in event["args"].items()}
    if (step := _step(event)) >= 0:
        event["name"] = f"ProfilerStep#{step + dstep}"
    return event
