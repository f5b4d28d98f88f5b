"""`fp32_upcast` on real GPU traces and small synthetic ones: the FP32 kernels float upcasts feed in a bf16
model, TF32 read as TF32, and CUDA-core GEMMs only where they hold real time.

Expected values come from plain loops over the raw JSON (`_Plain`), which share no code with profiling/.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from attention import AttentionSpec
from profiling.analysis import analyze
from profiling.insights import Evidence
from profiling.insights.base import jsonable
from profiling.insights.precision import fp32_upcast
from profiling.tables import kernel_table
from profiling.trace import load_trace, parse_trace
from profiling.upcasts import gemm_precision_us
from profiling.windows import window_stats
from tests.conftest import DATA

GPU = DATA / "gpu"
QWEN = GPU / "h100_qwen1.5-0.5b_prefill.json.gz"
BERT = GPU / "h100_bert-small_sdpa-flash.json.gz"
MHA = GPU / "h100_nn-mha_fp32.json.gz"
SIMPLE_ADD = DATA / "a100_simple_add.json.gz"
README_QWEN_UPCAST_PERCENT = 19.0  # tests/data/gpu/README.md: "about 19% of GPU time in FP32 elementwise kernels"
LOW = ("c10::BFloat16", "c10::Half")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def _finding(path: Path):
    """fp32_upcast on a whole trace, as an upload is analysed (the rule alone: it is what this file tests)."""
    trace = load_trace(path)
    return trace, fp32_upcast(Evidence(trace, window_stats(trace, None), kernel_table(trace)))


class _Plain:
    """The upcast chains of a trace by a plain reading of its events (the module docstring's definition,
    by another route): an upcast is a copy_ whose Input type is [float, bf16/fp16]; its chain is every op
    after its conversion (the enclosing to/_to_copy) inside the same nn.Module instance with a float
    tensor input; the chain's kernels are those its ops launched, GEMMs left out; kernels whose launch is
    missing count at their name's chain share among the kernels whose launch is there."""

    def __init__(self, path: Path) -> None:
        events = [e for e in _events(path) if e.get("ph") == "X"]
        self.gpu_us = sum(e["dur"] for e in events if e.get("cat") in GPU_CATEGORIES)
        self.kernels = [e for e in events if e.get("cat") == "kernel"]
        host = [e for e in events if e.get("cat") in ("cpu_op", "python_function", "cuda_runtime", "cuda_driver")]
        self.parent = self._parents(host)
        self.launch = {}
        for e in host:
            if e["cat"].startswith("cuda") and "correlation" in e.get("args", {}):
                self.launch.setdefault(e["args"]["correlation"], e)
        self.ops = [e for e in host if e["cat"] == "cpu_op"]
        self.module = {id(e): self._module_of(e) for e in self.ops}
        self.upcasts = [e for e in self.ops if e["name"] == "aten::copy_" and self._is_upcast(self._types(e))]

    @staticmethod
    def _types(e: dict) -> list:
        return e.get("args", {}).get("Input type") or []

    @staticmethod
    def _is_upcast(types: list) -> bool:
        return len(types) > 1 and types[0] == "float" and types[1] in LOW

    @staticmethod
    def _parents(host: list[dict]) -> dict[int, dict | None]:
        """Innermost enclosing host event on the same thread, by a stack over events sorted by start."""
        parent: dict[int, dict | None] = {}
        by_thread: dict[tuple, list[dict]] = defaultdict(list)
        for e in host:
            by_thread[(e["pid"], e["tid"])].append(e)
        for lane in by_thread.values():
            stack: list[dict] = []
            for e in sorted(lane, key=lambda e: (e["ts"], -e["dur"])):
                while stack:
                    end = stack[-1]["ts"] + stack[-1]["dur"]
                    if e["ts"] < end and e["ts"] + e["dur"] <= end + 1e-3:
                        break
                    stack.pop()
                parent[id(e)] = stack[-1] if stack else None
                stack.append(e)
        return parent

    def _module_of(self, e: dict) -> dict | None:
        p = self.parent.get(id(e))
        while p is not None and not p["name"].startswith("nn.Module: "):
            p = self.parent.get(id(p))
        return p

    def _float_input(self, e: dict) -> bool:
        dims = e.get("args", {}).get("Input Dims") or []
        return any(t == "float" and i < len(dims) and dims[i] for i, t in enumerate(self._types(e)))

    def chain_ops(self) -> dict[int, tuple[str | None, dict]]:
        """id of each chain op -> (its nn.Module's name, the conversion that starts its chain)."""
        found: dict[int, tuple[str | None, dict]] = {}
        for up in self.upcasts:
            top = up
            while (p := self.parent.get(id(top))) is not None and p["name"] in ("aten::to", "aten::_to_copy"):
                top = p
            module = self.module[id(up)]
            for e in self.ops:
                if self.module[id(e)] is module and e["ts"] >= top["ts"] and self._float_input(e):
                    found.setdefault(id(e), (module["name"] if module else None, top))
        return found

    def share(self) -> dict:
        chain_ops = self.chain_ops()
        chain, known, lost = defaultdict(float), defaultdict(float), defaultdict(float)
        lost_n, modules = defaultdict(int), defaultdict(float)
        for k in self.kernels:
            if "gemm" in k["name"] or "xmma" in k["name"]:
                continue
            launch = self.launch.get(k["args"].get("correlation"))
            if launch is None:
                lost[k["name"]] += k["dur"]
                lost_n[k["name"]] += 1
                continue
            known[k["name"]] += k["dur"]
            op = self.parent.get(id(launch))
            if op is not None and id(op) in chain_ops:
                chain[k["name"]] += k["dur"]
                modules[chain_ops[id(op)][0]] += k["dur"]
        estimated = sum(chain[n] / known[n] * lost[n] for n in chain)
        launched = sum(chain.values())
        return {
            "launched_us": launched,
            "estimated_us": estimated,
            "lost": sum(lost_n[n] for n in chain),
            "percent": 100 * (launched + estimated) / self.gpu_us,
            "modules": dict(modules),
            "starts": {top["ts"] for _, top in chain_ops.values()},
        }


@pytest.fixture(scope="module")
def qwen():
    return (*_finding(QWEN), _Plain(QWEN).share())


def test_qwen_prefill_names_the_rmsnorm_upcast_and_its_share(qwen):
    trace, found, plain = qwen
    assert found is not None and found.title == "FP32 work fed by upcasts"
    assert plain["percent"] == pytest.approx(README_QWEN_UPCAST_PERCENT, abs=2)  # the oracle agrees with the README
    assert found.gpu_time_percent == pytest.approx(plain["percent"], abs=0.05)
    evidence = found.evidence
    assert evidence["launched_us"] == pytest.approx(plain["launched_us"])
    assert evidence["estimated_us"] == pytest.approx(plain["estimated_us"])
    assert evidence["lost_launch_kernels"] == plain["lost"] > 0
    assert evidence["source_types"] == ["c10::BFloat16"] and evidence["upcasts"] == 49
    # Every chain kernel with a known launch ran inside a Qwen2RMSNorm instance.
    assert set(plain["modules"]) == {m for m in plain["modules"] if m.startswith("nn.Module: Qwen2RMSNorm_")}
    assert evidence["modules_us"] == {"Qwen2RMSNorm": pytest.approx(sum(plain["modules"].values()))}
    assert evidence["module"].startswith("Qwen2RMSNorm_") and "Qwen2RMSNorm" in found.detail
    assert evidence["ops"][0] == "aten::copy_" and {"aten::pow", "aten::mean", "aten::rsqrt"} <= set(evidence["ops"])
    assert evidence["ts_us"] - trace.ts_base_us in plain["starts"] and evidence["step"] == "ProfilerStep#6"
    json.dumps(jsonable(found.evidence), allow_nan=False)


def test_qwen_prefill_says_nothing_of_the_tiny_sgemm(qwen):
    """The 3.5 µs CUDA-core sgemm holds 0.01% of GPU time: no word about it next to the 19% chain."""
    _, found, _ = qwen
    assert "sgemm" not in found.detail and "kernels" not in found.evidence and "CUDA cores" not in found.detail


def test_rocm_qwen_prefill_finds_the_same_chain():
    """The same workload on an MI300X: other kernel names, the same chain, its own share."""
    mi300x = GPU / "mi300x_qwen1.5-0.5b_prefill.json.gz"
    _, found = _finding(mi300x)
    plain = _Plain(mi300x).share()
    assert found.gpu_time_percent == pytest.approx(plain["percent"], abs=0.05) and plain["percent"] > 10
    assert list(found.evidence["modules_us"]) == ["Qwen2RMSNorm"]


def test_bf16_bert_has_no_upcast():
    plain = _Plain(BERT)
    assert not plain.upcasts  # the oracle: no copy_ from bf16 to float
    _, found = _finding(BERT)
    assert found is None or found.gpu_time_percent < 1


def test_fp32_model_is_silent_and_its_gemms_read_tf32():
    """nn.MultiheadAttention in FP32: TF32 GEMMs on tensor cores, nothing upcast, nothing on CUDA cores."""
    _, found = _finding(MHA)
    assert found is None
    trace = load_trace(MHA)
    per = gemm_precision_us(trace, trace.gpu_activity)
    kernels = [e for e in _events(MHA) if e.get("cat") == "kernel"]
    tf32 = sum(e["dur"] for e in kernels if "tf32" in e["name"] or "s1688gemm" in e["name"])
    assert tf32 > 0 and per.to_dict() == {"tf32": pytest.approx(tf32)}


def test_cuda_core_gemms_that_hold_time_are_named_with_their_share():
    _, found = _finding(SIMPLE_ADD)
    events = _events(SIMPLE_ADD)
    gpu_us = sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES)
    simt = sum(e["dur"] for e in events if e.get("cat") == "kernel" and ("sgemm" in e["name"] or "scudnn" in e["name"]))
    assert (
        found.title == "FP32 math, no tensor cores" and "ampere_sgemm_32x32_sliced1x4_tn" in found.evidence["kernels"]
    )
    assert found.gpu_time_percent == pytest.approx(100 * simt / gpu_us)
    assert f"{100 * simt / gpu_us:.1f}% of GPU time" in found.detail


# Synthetic traces: one thread of ops and launches (pid 1), one stream of kernels (pid 0).
BF16, F32 = "c10::BFloat16", "float"
SHAPE = [8, 64]


def _op(name, ts, dur, types, dims=None):
    dims = dims if dims is not None else [SHAPE if t in (BF16, F32) else [] for t in types]
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {"Input type": types, "Input Dims": dims}}  # fmt: skip


def _launched(op, correlation, kernel, dur, at, launch=True):
    """`op`, a launch inside it with `correlation`, and the kernel it caused (the launch left out: lost)."""
    events = [op]
    if launch:
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": op["ts"] + 1, "dur": 1,
                       "pid": 1, "tid": 1, "args": {"correlation": correlation}})  # fmt: skip
    events.append({"ph": "X", "cat": "kernel", "name": kernel, "ts": at, "dur": dur, "pid": 0, "tid": 7,
                   "args": {"correlation": correlation, "device": 0, "stream": 7}})  # fmt: skip
    return events


def _rmsnorm(upcast=True, gemm=("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", BF16), modules=True, lost=False):
    """An RMSNorm-like chain inside `nn.Module: RMSNorm_0`: to(float) -> pow -> mul (float) -> cast back ->
    bf16 weight mul, then a GEMM. Kernel µs: upcast copy 10, pow 20, float mul 15, cast back 5, weight mul
    30, GEMM 100 (of 180). `upcast=False` makes it all bf16; `lost` drops the pow's launch."""
    src, mid = (F32, BF16) if upcast else (BF16, BF16)
    work = F32 if upcast else BF16
    events = []
    if modules:
        events.append({"ph": "X", "cat": "python_function", "name": "nn.Module: RMSNorm_0", "ts": 0, "dur": 100,
                       "pid": 1, "tid": 1, "args": {}})  # fmt: skip
    events += [_op("aten::to", 10, 10, [BF16, "Scalar"]), _op("aten::_to_copy", 11, 8, [BF16, "Scalar"])]
    events += _launched(_op("aten::copy_", 12, 6, [src, mid, "Scalar"]), 1, "direct_copy_kernel_cuda_up", 10, 1000)
    events += _launched(_op("aten::pow", 25, 5, [work, "Scalar"]), 2, "pow_tensor_scalar_kernel", 20, 1020, not lost)
    events += _launched(_op("aten::mul", 32, 5, [work, work]), 3, "MulFunctor_float", 15, 1050)
    events += _launched(_op("aten::copy_", 40, 5, [BF16, work, "Scalar"]), 4, "bfloat16_copy_kernel_cuda", 5, 1070)
    events += _launched(_op("aten::mul", 50, 5, [BF16, BF16]), 5, "MulFunctor_bf16", 30, 1080)
    kernel, dtype = gemm
    events += _launched(_op("aten::mm", 200, 10, [dtype, dtype]), 6, kernel, 100, 1200)
    return events


def _upload(events):
    return analyze(parse_trace(json.dumps({"traceEvents": events}).encode()))


def _rule(events):
    return {i.rule: i for i in _upload(events).insights}.get("fp32_upcast")


def test_synthetic_upcast_chain_fires_with_its_kernels():
    found = _rule(_rmsnorm())
    # Upcast copy, pow, float mul and the cast back: 10 + 20 + 15 + 5 of 180 µs; not the bf16 mul, not the GEMM.
    assert found.gpu_time_percent == pytest.approx(100 * 50 / 180)
    assert found.evidence["modules_us"] == {"RMSNorm": 50} and found.evidence["module"] == "RMSNorm_0"
    assert found.evidence["ops"] == ["aten::copy_", "aten::pow", "aten::mul", "aten::copy_"]
    assert found.evidence["gemm_precision_us"] == {"bf16": 100} and found.evidence["lost_launch_kernels"] == 0
    assert "BFloat16" in found.detail and "RMSNorm" in found.detail


def test_synthetic_without_an_upcast_is_silent():
    assert _rule(_rmsnorm(upcast=False)) is None


def test_synthetic_fp32_gemms_make_no_upcast_finding():
    """An FP32 model (its GEMM FP32 or TF32) has nothing upcast from low precision to speak of."""
    assert _rule(_rmsnorm(gemm=("cutlass_80_tensorop_s1688gemm_128x64_16x6_tn_align4", F32))) is None  # TF32
    found = _rule(_rmsnorm(gemm=("ampere_sgemm_128x64_tn", F32)))
    assert found.title == "FP32 math, no tensor cores" and "upcast_kernels" not in found.evidence
    assert found.gpu_time_percent == pytest.approx(100 * 100 / 180)


def test_synthetic_chain_without_modules_still_counts():
    found = _rule(_rmsnorm(modules=False))
    assert found.gpu_time_percent == pytest.approx(100 * 50 / 180) and found.evidence["module"] is None


def test_synthetic_lost_launch_counts_by_name():
    """The pow kernel's launch is missing: a second pow kernel, launched inside the chain, gives its name a
    chain share of 1, so the lost one counts in full, and the finding says it was estimated."""
    events = _rmsnorm(lost=True)
    events += _launched(_op("aten::pow", 60, 5, [F32, "Scalar"]), 7, "pow_tensor_scalar_kernel", 20, 1500)
    found = _rule(events)
    assert found.evidence["estimated_us"] == 20 and found.evidence["lost_launch_kernels"] == 1
    # Known chain kernels 10 + 20 + 15 + 5, the lost pow 20; all GPU time 180 + 20.
    assert found.gpu_time_percent == pytest.approx(100 * 70 / 200) and "lost the launches of 1" in found.detail


@pytest.mark.parametrize(("dtype", "fires"), [("bfloat16", True), ("float32", False)])
def test_our_run_dtype_decides_low_precision(dtype, fires):
    trace = parse_trace(json.dumps({"traceEvents": _rmsnorm(gemm=("ampere_sgemm_128x64_tn", F32))}).encode())
    spec = AttentionSpec(variant="sdpa", backend="math", dtype=dtype, device="cuda")
    found = fp32_upcast(Evidence(trace, window_stats(trace, None, "cuda"), kernel_table(trace), spec))
    if fires:
        assert "upcast_kernels" in found.evidence and "kernels" in found.evidence  # and the sgemm note
    else:
        assert found is None  # float32 GEMMs are what a float32 run asked for


def test_crafted_input_types_are_data():
    """Input types of every shape a crafted trace can hold: none is an upcast, none breaks the rule."""
    events = _rmsnorm()
    crafted = [["float", ["c10::BFloat16"]], ["float", 5], "float", None, [None, "c10::Half"], [["float"], BF16], []]
    for i, types in enumerate(crafted):
        events.append(_op("aten::copy_", 300 + 10 * i, 5, types, dims=[[1], 7]))
    assert _rule(events).evidence["upcasts"] == 1
