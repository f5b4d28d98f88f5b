"""Kernel-table details mutation testing found untested: short names, and who launched a kernel."""

from __future__ import annotations

import json

from profiling.tables import SHORT_NAME, kernel_table, launching_ops, short_kernel_name
from profiling.trace import parse_trace


def test_short_names_cut_templates_arguments_and_void():
    assert short_kernel_name("void at::native::elementwise_kernel<128, 2, F>(int)") == "elementwise_kernel"
    assert short_kernel_name("void gemv2T_kernel(int, float)") == "gemv2T_kernel"
    assert short_kernel_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD"
    assert short_kernel_name("void cublasGemv(float (*)(int), int)") == "cublasGemv"  # at the first parenthesis
    # SHORT_NAME characters are kept whole; one more and the name ends in an ellipsis at that width.
    exact, over = "k" * SHORT_NAME, "k" * (SHORT_NAME + 1)
    assert short_kernel_name(exact) == exact
    assert short_kernel_name(over) == "k" * (SHORT_NAME - 1) + "…" and len(short_kernel_name(over)) == SHORT_NAME


def _event(name: str, cat: str, ts: float, dur: float, tid: int, **args: object) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def test_launched_by_is_the_op_around_the_launch_not_a_gpu_range_around_the_kernel():
    """A kernel inside a `gpu_user_annotation` on its stream was still launched by the CPU op.

    The GPU lane comes first in the file, so the kernel (nested in the GPU range) is met before its launch.
    """
    events = [
        _event("attention", "gpu_user_annotation", 100, 50, 7),
        _event("my_kernel", "kernel", 110, 20, 7, correlation=5, device=0, stream=7),
        _event("aten::mm", "cpu_op", 0, 40, 1),
        _event("cudaLaunchKernel", "cuda_runtime", 10, 5, 1, correlation=5),
    ]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    assert launching_ops(trace).to_dict() == {"my_kernel": "aten::mm"}
    row = kernel_table(trace).set_index("name").loc["my_kernel"]
    assert (row["launched by"], row["count"], row["total (us)"]) == ("aten::mm", 1, 20)


def test_an_op_that_is_the_traces_first_event_launches_too():
    events = [
        _event("aten::mm", "cpu_op", 0, 40, 1),
        _event("cudaLaunchKernel", "cuda_runtime", 10, 5, 1, correlation=5),
        _event("my_kernel", "kernel", 110, 20, 7, correlation=5, device=0, stream=7),
    ]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    assert launching_ops(trace).to_dict() == {"my_kernel": "aten::mm"}


def test_of_ops_tied_for_most_launches_the_one_whose_launch_came_first_wins():
    # `aten::a` is met first in the file (so its name has the smaller code), but `aten::b` launched the kernel
    # first: a count per (kernel, op) grouped in code order, or an unstable sort of the counts, names `aten::a`.
    events = [
        _event("aten::a", "cpu_op", 50, 40, 1),
        _event("cudaLaunchKernel", "cuda_runtime", 60, 5, 1, correlation=1),
        _event("aten::b", "cpu_op", 0, 40, 1),
        _event("cudaLaunchKernel", "cuda_runtime", 10, 5, 1, correlation=2),
        _event("my_kernel", "kernel", 110, 20, 7, correlation=2, device=0, stream=7),
        _event("my_kernel", "kernel", 140, 20, 7, correlation=1, device=0, stream=7),
    ]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    assert launching_ops(trace).to_dict() == {"my_kernel": "aten::b"}
