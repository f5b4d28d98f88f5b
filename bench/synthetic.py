"""Synthetic Kineto-style traces of any size, built from one real step pattern."""

from __future__ import annotations

import gzip
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
