"""Precision: work done in FP32 where the inputs are low precision."""

from __future__ import annotations

from profiling.insights.base import MAX_NAMES_DECODED, Evidence, Finding, Rule, names_decoded, short
from profiling.kernels import decode

LOW_PRECISION_TYPES = ("c10::BFloat16", "c10::Half")


def fp32_upcast(ev: Evidence) -> Finding | None:
    """Low-precision inputs computed in float32: no tensor cores on a GPU."""
    if ev.scope.on_gpu:
        return _cuda_core_gemms(ev)
    copies = ev.ops_named("aten::copy_")
    upcasts = copies[
        [
            isinstance(t, list) and len(t) >= 2 and t[0] == "float" and t[1] in LOW_PRECISION_TYPES
            for t in copies["input_type"]
        ]
    ]
    if upcasts.empty:
        return None
    return Finding(
        "FP32 upcast",
        f"{len(upcasts) / ev.per:g} copies {ev.unit} turn {upcasts['input_type'].iloc[0][1]} inputs into float32, "
        "so the matmuls and softmax run in FP32 (on a GPU: sgemm on CUDA cores, no tensor cores).",
        {"op": "aten::_to_copy", "per_forward": len(upcasts) / ev.per},
    )


def _cuda_core_gemms(ev: Evidence) -> Finding | None:
    if ev.dtype not in (None, "bfloat16", "float16"):
        return None
    names, cut = names_decoded(ev.scope.gpu)
    fp32 = [n for n in names if decode(n).tensor_cores is False]
    if not fp32:
        return None
    among = f" among the {MAX_NAMES_DECODED:,} kernels with the most time" if cut else ""
    return Finding(
        "FP32 math, no tensor cores",
        f"{len(fp32)} GEMM/convolution kernel(s){among} run on CUDA cores ({short(fp32[0])})"
        + (f" although the inputs are {ev.dtype}." if ev.dtype else "."),
        {"kernels": fp32},
    )


RULES: tuple[Rule, ...] = (Rule("fp32_upcast", "copy_ from bf16/fp16 to float; sgemm kernels", fp32_upcast),)
