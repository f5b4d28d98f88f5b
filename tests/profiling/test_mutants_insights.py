"""The occupancy insight's per-kernel rows on a small hand-written trace (gaps mutation testing found)."""

from __future__ import annotations

import json

import pytest

from attention import AttentionSpec
from profiling.analysis import analyze
from profiling.insights import Evidence
from profiling.insights.occupancy import LOW_OCCUPANCY_PERCENT
from profiling.insights.precision import fp32_upcast
from profiling.tables import kernel_table
from profiling.trace import parse_trace
from profiling.windows import window_stats
from tests.profiling.test_mutants_occupancy import fill_one_block_at_a_time

# name, registers, block, (occupancy %, dur) per launch; None: the field is not in the trace.
KERNELS = [
    ("flash_fwd_kernel_weighted", 255, [128, 1, 1], [(10, 10), (20, 30)]),
    ("flash_fwd_kernel_one_thread", 32, [1, 1, 1], [(None, 5)]),
    ("flash_fwd_kernel_no_block", 64, None, [(50, 5)]),
    ("flash_fwd_kernel_zero_time", 64, [256, 1, 1], [(30, 0), (50, 0)]),
    ("my_gemm_kernel", 255, [128, 1, 1], [(10, 10)]),  # low occupancy, but not attention: no note
]
ATTENTION = ("flash_fwd_kernel_weighted", "flash_fwd_kernel_one_thread", "flash_fwd_kernel_zero_time")


def _trace_events() -> list[dict]:
    events, ts, correlation = [], 0, 0
    for name, registers, block, launches in KERNELS:
        for occupancy, dur in launches:
            correlation += 1
            args = {"correlation": correlation, "device": 0, "stream": 7, "registers per thread": registers}
            if block is not None:
                args["block"] = block
            if occupancy is not None:
                args["est. achieved occupancy %"] = occupancy
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7})
            events[-1]["args"] = args
            ts += 100
    return events


def test_occupancy_rows_per_kernel():
    events = _trace_events()
    insights = {i.rule: i for i in analyze(parse_trace(json.dumps({"traceEvents": events}).encode())).insights}
    rows = {r["kernel"]: r for r in insights["occupancy"].evidence["kernels"]}
    # A kernel without a block shape has no thread count, so no occupancy; one thread is a shape.
    with_block = {name for name, _, block, _ in KERNELS if block is not None}
    assert set(rows) == with_block
    for name, registers, block, launches in KERNELS:
        if block is None:
            continue
        blocks, _ = fill_one_block_at_a_time(registers, block[0] * block[1] * block[2], 0, None)
        warps = -(-block[0] * block[1] * block[2] // 32)
        assert rows[name]["blocks_per_sm"] == blocks
        assert rows[name]["theoretical_percent"] == pytest.approx(100 * blocks * warps / 64)
        measured = [(o, d) for o, d in launches if o is not None]
        total = sum(d for _, d in measured)
        if not measured:
            expected = None  # nothing measured: no number, not NaN
        elif total > 0:
            expected = sum(o * d for o, d in measured) / total  # weighted by duration
        else:
            expected = sum(o for o, _ in measured) / len(measured)  # no time to weigh by: the plain mean
        assert rows[name]["achieved_percent"] == (None if expected is None else pytest.approx(expected)), name
    # Under LOW_OCCUPANCY_PERCENT theoretical: "by design" for attention (flash's big tiles), "limited" for others.
    detail = insights["occupancy"].detail
    for name, registers, block, _ in KERNELS:
        if block is None:
            continue
        threads = block[0] * block[1] * block[2]
        percent = 100 * fill_one_block_at_a_time(registers, threads, 0, None)[0] * -(-threads // 32) / 64
        low = percent < LOW_OCCUPANCY_PERCENT
        assert (f"{name} holds" in detail) == (low and name in ATTENTION), name
        assert (f"{name} is limited to" in detail) == (low and name not in ATTENTION), name


def _sgemm_trace():
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 20, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "dur": 5, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "ts": 30, "dur": 10, "pid": 0, "tid": 7},
    ]
    events[1]["args"] = {"correlation": 1}
    events[2]["args"] = {"correlation": 1, "device": 0, "stream": 7}
    return parse_trace(json.dumps({"traceEvents": events}).encode())


@pytest.mark.parametrize(("dtype", "flagged"), [("float16", True), ("bfloat16", True), ("float32", False)])
def test_fp32_gemm_is_flagged_when_the_inputs_are_half_precision(dtype, flagged):
    """sgemm is FP32 on CUDA cores: worth saying for bf16/fp16 inputs, expected for float32 ones."""
    trace = _sgemm_trace()
    scope = window_stats(trace, None, "cuda")
    spec = AttentionSpec(variant="sdpa", backend="math", dtype=dtype, device="cuda")
    found = fp32_upcast(Evidence(trace, scope, kernel_table(trace), spec))
    assert (found is not None) == flagged
    if flagged:
        assert found.evidence["kernels"] == ["ampere_sgemm_128x64_tn"] and dtype in found.detail
        assert isinstance(found.title, str) and found.title
