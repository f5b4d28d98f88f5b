"""The plugin's training recommendations (profiling/insights/training.py) on real and hand-written traces.

Every number is checked against a plain reading of the raw events (`json.load(gzip.open(path))`), or against
what the plugin itself showed for the ResNet-50 trace (tests/data/tb_plugin/*.expected.jsonl).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from profiling.grouping import TC_ELIGIBLE_OPS
from profiling.insights import Evidence
from profiling.insights.base import Finding, jsonable
from profiling.insights.training import (
    amp_opportunity,
    dataloader_bound,
    low_gpu_utilization,
    memory_near_capacity,
)
from profiling.trace import Trace, load_trace, parse_trace
from profiling.windows import window_stats
from tests.gpu_oracle import union as _merge

DATA = Path(__file__).resolve().parents[1] / "data"
RESNET = DATA / "tb_plugin" / "resnet50_num_workers_4.pt.trace.json.gz"
PLUGIN_VIEWS = DATA / "tb_plugin" / "resnet50_num_workers_4.expected.jsonl"
OWLV2 = DATA / "gpu" / "h100_owlv2_eager-attn.json.gz"
MHA = DATA / "gpu" / "h100_nn-mha_fp32.json.gz"
SGLANG = DATA / "gpu" / "mi300x_sglang_qwen3-8b_decode.json.gz"
RUNTIME = ("cuda_runtime", "cuda_driver", "Runtime")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")


def _evidence(trace: Trace) -> Evidence:
    return Evidence(trace, window_stats(trace, None, None), None)


def _raw(path: Path) -> dict[str, Any]:
    return json.load(gzip.open(path))


@pytest.fixture(scope="module")
def resnet() -> Evidence:
    return _evidence(load_trace(RESNET))


@pytest.fixture(scope="module")
def owlv2() -> Evidence:
    return _evidence(load_trace(OWLV2))


def _checked(finding: Finding | None) -> Finding:
    assert finding is not None
    assert json.loads(json.dumps(jsonable(finding.evidence))) == jsonable(finding.evidence)
    return finding


# Plain interval arithmetic over lists, independent of profiling.intervals.
def _minus(spans: list[tuple[float, float]], cut: list[tuple[float, float]]) -> float:
    """Total length of `spans` (merged) outside `cut` (merged)."""
    left = 0.0
    for s, e in spans:
        covered = sum(max(0.0, min(e, ce) - max(s, cs)) for cs, ce in cut)
        left += (e - s) - covered
    return left


# --- dataloader_bound -------------------------------------------------------------------------------------


def test_dataloader_fires_on_owlv2_with_the_plain_share(owlv2: Evidence) -> None:
    found = _checked(dataloader_bound(owlv2))
    events = _raw(OWLV2)["traceEvents"]
    step = next(e for e in events if e.get("name") == "ProfilerStep#6" and e.get("cat") == "user_annotation")
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES and e.get("ph") == "X"]
    # The plugin's step ends at the later of its host end and the end of the GPU work (one step here).
    lo, hi = step["ts"], max(step["ts"] + step["dur"], max(e["ts"] + e["dur"] for e in gpu))
    loading = _merge(
        [
            (max(e["ts"], lo), min(e["ts"] + e["dur"], hi))
            for e in events
            if str(e.get("name", "")).startswith("enumerate(DataLoader)#") and e.get("cat") == "user_annotation"
        ]
    )
    busy = _merge([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in (*GPU_CATEGORIES, *RUNTIME)])
    plain_us = _minus(loading, busy)
    assert found.evidence["dataloader_us"] == pytest.approx(plain_us, rel=1e-6)
    assert found.evidence["step_us"] == pytest.approx(hi - lo, rel=1e-6)
    assert found.evidence["dataloader_percent"] == pytest.approx(100 * plain_us / (hi - lo), rel=1e-6)
    assert found.evidence["step"] == "ProfilerStep#6"
    assert found.gpu_time_percent is None


def test_dataloader_silent_on_resnet_as_in_the_plugin(resnet: Evidence) -> None:
    views = [json.loads(line) for line in PLUGIN_VIEWS.read_text().splitlines()]
    overview = next(v for v in views if "recommendations" in v)
    assert "DataLoader" not in overview["recommendations"]
    assert dataloader_bound(resnet) is None


def _step_with_loader(loader_us: float) -> list[dict[str, Any]]:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000, "pid": 1, "tid": 1}]
    if loader_us:
        name = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": name, "ts": 100, "dur": loader_us, "pid": 1, "tid": 1}
        )
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 500, "dur": 100, "pid": 1, "tid": 1})
    return events


def _parse(events: list[dict[str, Any]], **top: Any) -> Evidence:
    return _evidence(parse_trace(json.dumps({"traceEvents": events, **top}).encode()))


def test_dataloader_synthetic() -> None:
    found = _checked(dataloader_bound(_parse(_step_with_loader(200))))
    assert (found.evidence["dataloader_us"], found.evidence["step_us"]) == (200, 1000)
    assert found.evidence["dataloader_percent"] == pytest.approx(20.0)
    assert dataloader_bound(_parse(_step_with_loader(50))) is None  # 5%: not above the threshold
    assert dataloader_bound(_parse(_step_with_loader(0))) is None


# --- low_gpu_utilization ----------------------------------------------------------------------------------


def test_low_utilization_fires_on_owlv2_with_the_plain_share(owlv2: Evidence) -> None:
    found = _checked(low_gpu_utilization(owlv2))
    events = _raw(OWLV2)["traceEvents"]
    step = next(e for e in events if e.get("name") == "ProfilerStep#6" and e.get("cat") == "user_annotation")
    kernels = [e for e in events if e.get("cat") == "kernel"]
    lo, hi = step["ts"], max(step["ts"] + step["dur"], max(e["ts"] + e["dur"] for e in kernels))
    busy = _merge([(max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in kernels])
    plain = 100 * sum(e - s for s, e in busy) / (hi - lo)
    assert plain < 50
    [gpu] = found.evidence["gpus"]
    assert gpu["device"] == 0 and gpu["utilization_percent"] == pytest.approx(plain, rel=1e-6)
    gaps = [b[0] - a[1] for a, b in zip([(lo, lo), *busy], [*busy, (hi, hi)], strict=True)]
    assert found.evidence["widest_gap_us"] == pytest.approx(max(gaps), rel=1e-6)


def test_low_utilization_silent_on_resnet_and_where_a_sync_explains_it(resnet: Evidence) -> None:
    views = [json.loads(line) for line in PLUGIN_VIEWS.read_text().splitlines()]
    metrics = next(v for v in views if "gpu_metrics" in v)["gpu_metrics"]["data"]
    assert next(d for d in metrics if d["title"] == "GPU Utilization")["value"] == "70.27 %"
    assert low_gpu_utilization(resnet) is None
    # The SGLang decode: the GPU is busy ~2%, all of it explained by one blocking hipMemcpyWithStream.
    sglang = _evidence(load_trace(SGLANG))
    assert low_gpu_utilization(sglang) is None


def _sparse_step(sync: bool) -> list[dict[str, Any]]:
    host = {"pid": 1, "tid": 1}
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 10000, **host},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 50, **host},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 20, "dur": 10, **host},
        {"ph": "X", "cat": "kernel", "name": "my_kernel", "ts": 100, "dur": 1000, "pid": 0, "tid": 7},
    ]
    events[2]["args"] = {"correlation": 1}
    events[3]["args"] = {"correlation": 1, "device": 0, "stream": 7}
    if sync:
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 1200, "dur": 7800})
        events[-1].update(host)
    return events


def test_low_utilization_synthetic() -> None:
    found = _checked(low_gpu_utilization(_parse(_sparse_step(sync=False))))
    assert found.evidence["gpus"] == [{"device": 0, "utilization_percent": pytest.approx(10.0)}]
    assert found.evidence["widest_gap_us"] == pytest.approx(8900.0)
    # The same idle GPU, with a blocking sync that explains it: the blocking-sync finding speaks instead.
    assert low_gpu_utilization(_parse(_sparse_step(sync=True))) is None
    assert low_gpu_utilization(_parse(_step_with_loader(200))) is None  # no GPU at all


# --- memory_near_capacity ---------------------------------------------------------------------------------


def test_memory_silent_on_owlv2_whose_peak_is_far_below_capacity(owlv2: Evidence) -> None:
    raw = _raw(OWLV2)
    peak = max(
        e["args"]["Total Allocated"]
        for e in raw["traceEvents"]
        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1 and e["args"].get("Device Id") == 0
    )
    capacity = raw["deviceProperties"][0]["totalGlobalMem"]
    assert 0 < peak < 0.9 * capacity
    assert memory_near_capacity(owlv2) is None


def _memory(gpu_peak: int, cpu_peak: int = 10**12) -> Evidence:
    events = []
    for ts, (device_type, device_id, total) in enumerate([(1, 0, gpu_peak // 2), (1, 0, gpu_peak), (0, -1, cpu_peak)]):
        args = {"Device Type": device_type, "Device Id": device_id, "Total Allocated": total, "Bytes": 1}
        events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "ts": ts, "pid": 1})
        events[-1].update({"tid": 1, "args": args})
    props = [{"id": 0, "name": "GPU", "totalGlobalMem": 1000, "computeMajor": 8, "computeMinor": 0}]
    return _parse(events, deviceProperties=props)


def test_memory_synthetic() -> None:
    found = _checked(memory_near_capacity(_memory(950)))
    assert (found.evidence["peak_bytes"], found.evidence["capacity_bytes"]) == (950, 1000)
    assert found.evidence["peak_percent"] == pytest.approx(95.0)
    assert found.evidence["ts_us"] == 1  # the peak's event
    assert memory_near_capacity(_memory(900)) is None  # 90%: not above the threshold
    assert memory_near_capacity(_memory(100)) is None  # the CPU's 1 TB is not a GPU's memory


# --- amp_opportunity --------------------------------------------------------------------------------------


def test_amp_fires_on_resnet_as_the_plugin_did(resnet: Evidence) -> None:
    found = _checked(amp_opportunity(resnet))
    raw = _raw(RESNET)
    # 2021's Kineto: a kernel's op is the first Operator with its External id (the plugin's rule).
    op_of: dict[int, str] = {}
    for e in raw["traceEvents"]:
        if e.get("cat") == "Operator" and e.get("ph") == "X":
            op_of.setdefault(e["args"].get("External id"), e["name"])
    owned = eligible = 0.0
    for e in raw["traceEvents"]:
        if e.get("cat") == "Kernel" and e["args"].get("external id") in op_of:  # the launch's id, lower case
            owned += e["dur"]
            eligible += e["dur"] if op_of[e["args"]["external id"]] in TC_ELIGIBLE_OPS else 0
    assert found.evidence["op_kernel_us"] == pytest.approx(owned)
    assert found.evidence["eligible_kernel_us"] == pytest.approx(eligible)
    views = [json.loads(line) for line in PLUGIN_VIEWS.read_text().splitlines()]
    overview = next(v for v in views if "recommendations" in v)
    assert f"Kernels with {round(found.evidence['eligible_percent'])}% time" in overview["recommendations"]
    assert found.evidence["compute_capability"] == "7.0"
    all_kernels = sum(e["dur"] for e in raw["traceEvents"] if e.get("cat") in ("Kernel", "Memcpy", "Memset"))
    assert found.gpu_time_percent == pytest.approx(100 * eligible / all_kernels)


def test_amp_silent_where_tensor_cores_run() -> None:
    # nn.MultiheadAttention in FP32 on an H100: its GEMMs run TF32 on tensor cores.
    assert amp_opportunity(_evidence(load_trace(MHA))) is None


def _gemm(kernel: str, major: int) -> Evidence:
    host = {"pid": 1, "tid": 1}
    events = []
    for i, (op, name) in enumerate([("aten::mm", kernel), ("aten::add", "elementwise_add_kernel")]):
        events.append({"ph": "X", "cat": "cpu_op", "name": op, "ts": 100 * i, "dur": 50, **host})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 100 * i + 10, "dur": 5})
        events[-1].update({**host, "args": {"correlation": i + 1}})
        events.append({"ph": "X", "cat": "kernel", "name": name, "ts": 100 * i + 20, "dur": 60 + 20 * i, "pid": 0})
        events[-1].update({"tid": 7, "args": {"correlation": i + 1, "device": 0, "stream": 7}})
    props = [{"id": 0, "name": "GPU", "totalGlobalMem": 10**10, "computeMajor": major, "computeMinor": 0}]
    return _parse(events, deviceProperties=props)


def test_amp_synthetic() -> None:
    found = _checked(amp_opportunity(_gemm("volta_sgemm_128x64_nn", 8)))
    assert (found.evidence["eligible_kernel_us"], found.evidence["op_kernel_us"]) == (60, 140)
    assert found.evidence["ops"] == [{"op": "aten::mm", "kernel_us": 60.0}]
    assert found.gpu_time_percent == pytest.approx(100 * 60 / 140)
    assert amp_opportunity(_gemm("volta_sgemm_128x64_nn", 6)) is None  # Pascal: no tensor cores
    assert amp_opportunity(_gemm("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32", 8)) is None
