"""RoPE applied in eager PyTorch, found through the frames that apply it (profiling/rotary.py)."""

import gzip
import json

import pytest

from profiling.analysis import analyze, analyze_file
from profiling.trace import parse_trace
from tests.conftest import DATA

GPU = DATA / "gpu"
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def plain_rotary(path):
    """(calls, kernels, their µs, all GPU µs) by a plain loop: RoPE frames, the launches inside each on its
    thread, and the GPU events with those launches' correlation ids."""
    with gzip.open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    frames = [e for e in events if e.get("cat") == "python_function" and "apply_rotary_pos_emb" in e["name"]]
    launches = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    ids = {
        launch["args"]["correlation"]
        for frame in frames
        for launch in launches
        if (launch["pid"], launch["tid"]) == (frame["pid"], frame["tid"])
        and frame["ts"] <= launch["ts"] <= frame["ts"] + frame["dur"]
    }
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    mine = [e for e in gpu if e.get("args", {}).get("correlation") in ids]
    return len(frames), len(mine), sum(e["dur"] for e in mine), sum(e["dur"] for e in gpu)


@pytest.mark.parametrize("name", ["h100_qwen1.5-0.5b_prefill", "mi300x_qwen1.5-0.5b_prefill"])
def test_transformers_rope_is_found_unfused_with_its_share(name):
    path = GPU / f"{name}.json.gz"
    calls, kernels, rope_us, gpu_us = plain_rotary(path)
    finding = {i.rule: i for i in analyze_file(path).insights}["unfused_rotary"]
    assert finding.evidence["calls"] == calls == 24 and finding.evidence["kernels"] == kernels
    assert finding.evidence["gpu_us"] == pytest.approx(rope_us)
    assert finding.gpu_time_percent == pytest.approx(100 * rope_us / gpu_us)
    assert finding.evidence["kernels_per_call"] == kernels / calls >= 2
    assert "lower bound" in finding.detail and finding.evidence["lost_launches"] > 0
    # The kinds named are those launched in the frames, each counted: none of the trace's other kernels at 0.
    named = finding.evidence["kernel_names"]
    assert sum(named.values()) == kernels and min(named.values()) > 0 and " x0" not in finding.detail


@pytest.mark.parametrize(
    "name", ["b200_vllm_gpt-oss_eager_rank0", "h100_owlv2_eager-attn", "h100_bert-small_sdpa-flash"]
)
def test_fused_rope_or_no_rope_frame_is_silent(name):
    # vLLM's rotary_embedding_kernel is one kernel per call; owlv2 and bert have no RoPE.
    assert "unfused_rotary" not in {i.rule for i in analyze_file(GPU / f"{name}.json.gz").insights}


def _trace(kernels_per_call: int, frame: str = "modeling_llama.py(150): apply_rotary_pos_emb", fused: bool = False):
    events, correlation = [], 0
    for call in range(2):
        start = 1000 * call
        events.append({"ph": "X", "cat": "python_function", "name": frame, "ts": start, "dur": 100, "pid": 1, "tid": 1})
        for k in range(kernels_per_call):
            correlation += 1
            launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1}
            events.append({**launch, "ts": start + 10 + 10 * k, "dur": 2, "args": {"correlation": correlation}})
            name = "void vllm::rotary_embedding_kernel<float>(int)" if fused else f"elementwise_kernel_{k}"
            kernel = {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7}
            events.append({**kernel, "ts": start + 50 + 10 * k, "dur": 5, "args": {"correlation": correlation}})
    # Work outside the frames: a GEMM launched after them, never counted as RoPE.
    gemm = {"ph": "X", "args": {"correlation": 999}}
    events.append({**gemm, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 5000, "dur": 2})
    events.append({**gemm, "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7, "ts": 5010, "dur": 40})
    return {i.rule: i for i in analyze(parse_trace(json.dumps({"traceEvents": events}).encode())).insights}


def test_synthetic_unfused_rope_present():
    finding = _trace(kernels_per_call=3)["unfused_rotary"]
    assert (finding.evidence["calls"], finding.evidence["kernels"], finding.evidence["gpu_us"]) == (2, 6, 30)
    assert finding.gpu_time_percent == pytest.approx(100 * 30 / 70) and finding.evidence["lost_launches"] == 0


@pytest.mark.parametrize(
    "case", [{"kernels_per_call": 1}, {"kernels_per_call": 3, "fused": True}, {"kernels_per_call": 3, "frame": "f()"}]
)
def test_synthetic_unfused_rope_absent(case):
    # One kernel per call, fused rotary kernels, or no RoPE frame: nothing to say.
    assert "unfused_rotary" not in _trace(**case)
