"""How long a whole run will take, estimated from its shape before it starts.

A run is WARMUP_CALLS warm-up forwards and the profiler's WAIT + WARMUP + ACTIVE steps, each forward
followed by its backward in training; then the unprofiled timing loops (`profiling.timing.time_calls`:
the forward, and in training the backward, each after an untimed forward), each at most its budget
plus the call that crosses it, or MAX_CALLS calls, whichever is less; then the float64 reference.
Each forward costs its dense FLOPs (every (query, key) pair: only the fused kernels skip masked
blocks, and not on every device) at a share of this device's matmul rate, plus the least memory
traffic at its bandwidth (what decode is made of).

The shares are measured, not assumed: CPU, torch 2.13, 2 cores, 1x8xSx64 float32, S from 512 to
2048, forward time against `roofline.matmul_tflops` (`python bench/estimate.py` measures each
variant's whole run against this estimate; the goal is within 3x, both ways). A GPU gets the same shares of its vendor
peak: a rough guess there, which the worker's time limit backs up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attention import AttentionSpec
from attention.memory import FLOAT32_SCORES, score_kind, sdpa_mask_per_call_bytes
from profiling.roofline import device_name, peak_gbps, peak_tflops
from profiling.runner import ACTIVE, WAIT, WARMUP, WARMUP_CALLS, RunError
from profiling.timing import MAX_CALLS, timing_budget_s

# Share of the matmul rate a forward reaches on its dense FLOPs, by what decides its work.
MATMUL_SHARE = {"naive": 0.25, "inplace": 0.25, "math": 0.25, "flex": 0.15, "fused": 0.8}
BACKWARD_COST = 2.0  # a backward's time against its forward's (measured; the FLOPs ratio is 2.5)
# Masks whose blocks a fused kernel skips; a dense mask (window, padding) is applied to every pair.
SKIPPED_MASKS = ("causal", "causal_top_left")
REFERENCE_SHARE = 0.3  # the float64 reference, in blocks, against the float32 matmul rate
FIXED_S = 0.5  # starting the profiler, exporting and reading back the trace
FLEX_SETUP_S = 2.0  # flex_attention's block mask and first eager call (measured ~2 s at any size)
# torch.compile, paid in the first warm-up call: Dynamo's trace and Inductor's start (COMPILE_S), plus the
# C++ (on a GPU, Triton) kernels Inductor generates and builds around the matmuls (CODEGEN_S). A fused
# SDPA kernel is called as it is, so it generates nothing, unless a dense mask is converted around it or a
# backward is built. Measured on CPU here, torch 2.13, 1x4x256x64, each in a fresh process with an empty
# Inductor cache, the compiled run minus the eager one (2026-12-03, 2 cores shared with other jobs, load
# 3 to 4.6): SDPA flash 4.2 s, in training 19.8 s, SDPA auto with a padding mask 22.6 s, naive 16-31 s
# (21 s in training), in-place 38 s, math 34 s, flex 34-43 s. Warm it costs less: a later process with
# Inductor's disk cache full built naive in ~6 s and flex in under 1 s, a new shape in the same process
# took 2-15 s, the same shape again nothing. The estimate takes the cold cost: it guards the time limit,
# where too high only refuses a run that had little time left.
COMPILE_S = 4.0
CODEGEN_S = {"naive": 24.0, "inplace": 24.0, "math": 28.0, "flex": 34.0, "fused": 18.0}
FORWARDS = WARMUP_CALLS + WAIT + WARMUP + ACTIVE  # the warm-up and profiled steps; the timing loop apart


@dataclass(frozen=True)
class RunTime:
    """Seconds a run is expected to take, and its parts."""

    forward_s: float  # one forward (with its backward in training)
    calls: int  # forwards (and backwards) the run makes before the timing loop
    reference_s: float
    setup_s: float  # the profiler, the export, flex's block mask, and torch.compile
    timing_s: float = 0.0  # the unprofiled timing loops, at most (`timing_loop_s`)

    @property
    def seconds(self) -> float:
        return self.setup_s + self.calls * self.forward_s + self.timing_s + self.reference_s


def estimate_run_time(spec: AttentionSpec) -> RunTime:
    """The run's expected time on this machine (measures this device's matmul and copy rates once)."""
    gpu, kind = device_name(spec.device), score_kind(spec)
    # math and flex compute their scores in float32 whatever the inputs' dtype
    flops = peak_tflops(spec.device, gpu, "float32" if kind in FLOAT32_SCORES else spec.dtype)[0] * 1e12
    dense = 4 * spec.head_dim * spec.batch * spec.heads * spec.q_len * spec.seq_len
    work = spec.flops() if kind == "fused" and spec.mask in SKIPPED_MASKS else dense
    traffic = spec.bytes_moved() / (peak_gbps(spec.device, gpu)[0] * 1e9)
    forward_s = work / (flops * MATMUL_SHARE[kind]) + traffic
    # The forward timed alone, then in training the backward, each timed one after an untimed forward.
    budget = timing_budget_s()
    timing_s = timing_loop_s(forward_s, budget)
    if spec.training:
        timing_s += timing_loop_s(forward_s * (1 + BACKWARD_COST), budget)
        forward_s *= 1 + BACKWARD_COST
    reference_flops = dense * (1 + BACKWARD_COST if spec.training else 1)
    reference_rate = peak_tflops(spec.device, gpu, "float32")[0] * 1e12 * REFERENCE_SHARE
    setup_s = FIXED_S + (FLEX_SETUP_S if spec.variant == "flex" else 0.0) + compile_s(spec)
    return RunTime(forward_s, FORWARDS, reference_flops / reference_rate, setup_s, timing_s)


def timing_loop_s(call_s: float, budget_s: float) -> float:
    """The longest one timing loop takes: it stops once `budget_s` is spent, which the call that crosses
    it overruns, or at MAX_CALLS calls, whichever comes first (at least one call)."""
    if call_s <= 0:
        return 0.0
    return min(MAX_CALLS, max(1, math.ceil(budget_s / call_s))) * call_s


def compile_s(spec: AttentionSpec) -> float:
    """Seconds `torch.compile` adds to the run's first call, cold (see COMPILE_S); 0 without compile."""
    if not spec.compile:
        return 0.0
    kind = "flex" if spec.variant == "flex" else score_kind(spec)  # compiled flex is fused, but builds the most
    if kind == "fused" and not spec.training and not sdpa_mask_per_call_bytes(spec):
        return COMPILE_S  # one extern kernel: nothing to generate
    return COMPILE_S + CODEGEN_S[kind]


def refuse_if_too_long(spec: AttentionSpec, time_limit_s: float | None) -> None:
    """RunError, with the estimate, when `spec` cannot finish within `time_limit_s`."""
    if time_limit_s is None:
        return
    estimate = estimate_run_time(spec)
    if estimate.seconds > time_limit_s:
        raise RunError(
            f"time limit: this run would take about {estimate.seconds:.0f} s ({estimate.calls} forwards of "
            f"~{estimate.forward_s:.2f} s{_compiling(spec)}, ~{estimate.timing_s:.1f} s timing them without the "
            f"profiler, and the float64 reference), over the "
            f"{time_limit_s:.3g} s left; try a smaller seq_len or batch"
        )


def _compiling(spec: AttentionSpec) -> str:
    return f", ~{compile_s(spec):.0f} s to compile" if spec.compile else ""
