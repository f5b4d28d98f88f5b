"""Precision: work done in FP32 where the model computes in low precision.

`fp32_upcast` speaks of three things, each where its evidence is:
- on CPU: the copies that turn bf16/fp16 inputs into float32 (SDPA's math backend on CPU does it);
- on a GPU, in a model whose GEMM time is mostly bf16, fp16, fp8 or fp4 (or our run's dtype says so):
  the FP32 elementwise and reduction kernels that float upcasts feed (`profiling.upcasts`), with
  the nn.Module they run in, where the trace names modules;
- GEMMs and convolutions on CUDA cores, where they hold at least 1% of GPU time (a 3.5 µs sgemm
  is no story next to a 19% upcast chain). TF32 kernels run on tensor cores: they are not among them.
`gpu_time_percent` is the time of the FP32 kernels it names.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiling.insights.base import (
    MAX_NAMES_DECODED,
    MAX_NAMES_IN_PROSE,
    NAME_IN_LIST,
    Evidence,
    Finding,
    Rule,
    gpu_share,
    short,
)
from profiling.step_breakdown import step_at
from profiling.upcasts import (
    LOW_PRECISION,
    UpcastChains,
    cuda_core_gemms,
    gemm_precision_us,
    kernel_owners,
    scopes,
    upcast_chains,
    upcast_rows,
)

LOW_PRECISION_DTYPES = ("bfloat16", "float16")  # our runs' dtypes that make the model low precision
LOW_PRECISION_GEMM_PERCENT = 50.0  # GEMM time in bf16/fp16/fp8/fp4 from which a model counts as low precision
# A part of the finding under this share of GPU time is left out (as find_insights drops whole findings
# under 1%; not imported, as that module imports this one).
MIN_PART_PERCENT = 1.0


def fp32_upcast(ev: Evidence) -> Finding | None:
    """FP32 work in a low-precision model: upcast copies on CPU; on a GPU, the FP32 kernels upcasts feed
    and GEMMs on CUDA cores."""
    if not ev.scope.on_gpu:
        return _cpu_upcasts(ev)
    upcast = _gpu_upcasts(ev)
    gemms = _cuda_core_gemms(ev)
    if upcast is None:
        return gemms
    if gemms is None:
        return upcast
    evidence = {**gemms.evidence, **upcast.evidence}  # ts_us and step: the upcast chain's
    busy = [p for p in (upcast.gpu_time_percent, gemms.gpu_time_percent) if p is not None]
    return Finding(upcast.title, f"{upcast.detail} Also: {gemms.detail}", evidence, sum(busy) if busy else None)


def _cpu_upcasts(ev: Evidence) -> Finding | None:
    copies = ev.ops_named("aten::copy_")
    upcasts = copies[upcast_rows(copies["input_type"].to_numpy())]
    if upcasts.empty:
        return None
    rows = upcasts.index.to_numpy()
    _, scope = scopes(ev.trace, rows)
    names = ev.trace.events["name"].to_numpy()
    inside = pd.Series(names[scope[scope >= 0]]).value_counts()
    where = f" inside {short(inside.index[0])}" if len(inside) else ""
    source = str(upcasts["input_type"].iloc[0][1]).removeprefix("c10::")
    first_ts = float(upcasts["ts"].min())
    return Finding(
        "FP32 upcast",
        f"{len(upcasts) / ev.per:g} copies {ev.unit} turn {source} inputs into float32{where}, "
        f"so the math after them runs in FP32, on {4 // (1 if 'Float8' in source else 2)}x the bytes.",
        {
            "op": "aten::_to_copy",
            "per_forward": len(upcasts) / ev.per,
            "scope": inside.index[0] if len(inside) else None,
            "ts_us": first_ts + ev.trace.ts_base_us,
            "step": step_at(ev.trace, first_ts),
        },
    )


def low_precision_model(ev: Evidence) -> tuple[bool, dict[str, float]]:
    """Whether the model computes in low precision: our run's dtype where there is one, else at least
    LOW_PRECISION_GEMM_PERCENT of GEMM kernel time in bf16/fp16/fp8/fp4; and the GEMM µs per precision."""
    per = gemm_precision_us(ev.trace, ev.scope.gpu)
    if ev.dtype is not None:
        return ev.dtype in LOW_PRECISION_DTYPES, per.to_dict()
    total = float(per.sum())
    low = float(per.reindex(list(LOW_PRECISION)).fillna(0.0).sum())
    return total > 0 and 100.0 * low / total >= LOW_PRECISION_GEMM_PERCENT, per.to_dict()


def _gpu_upcasts(ev: Evidence) -> Finding | None:
    low, per_precision = low_precision_model(ev)
    if not low:
        return None
    chains = upcast_chains(ev.trace, ev.scope.gpu)
    share = gpu_share(ev, chains.total_us) if chains else None
    if chains is None or share is None or share < MIN_PART_PERCENT:
        return None
    source = chains.source_types[0].removeprefix("c10::")
    return Finding(
        "FP32 work fed by upcasts",
        f"{share:.1f}% of GPU time is FP32 elementwise and reduction kernels fed by {chains.upcasts} upcasts from "
        f"{source}{_gemm_clause(per_precision)}. {_where(chains)}{_sequence(chains)}, each a kernel of its own on "
        f"4-byte floats.{_lost(ev, chains)} {_advice(chains, source)}",
        _upcast_evidence(ev, chains, per_precision),
        share,
    )


def _gemm_clause(per_precision: dict[str, float]) -> str:
    total = sum(per_precision.values())
    if total <= 0:
        return ""
    top, us = max(per_precision.items(), key=lambda kv: kv[1])
    return f", in a model whose GEMM time is {100 * us / total:.0f}% {top}"


def _where(chains: UpcastChains) -> str:
    """Where the chain runs: its main nn.Module and that module's share of the chain time traced to an op."""
    if chains.per_module.empty:
        return "The chain: "
    module, us = chains.per_module.index[0], float(chains.per_module.iloc[0])
    return f"In {short(module, NAME_IN_LIST)} ({100 * us / chains.launched_us:.0f}% of the time traced to an op): "


def _sequence(chains: UpcastChains) -> str:
    return " → ".join(name.removeprefix("aten::") for name in chains.ops)


def _lost(ev: Evidence, chains: UpcastChains) -> str:
    if not chains.lost_kernels:
        return ""
    share = gpu_share(ev, chains.estimated_us) or 0.0
    return (
        f" The trace lost the launches of {chains.lost_kernels} of these kernels: their {share:.1f} points "
        "are counted by kernel name, at each name's share among the kernels whose launch is known."
    )


def _advice(chains: UpcastChains, source: str) -> str:
    fix = f"torch.compile fuses such a chain into one kernel that reads and writes {source} once"
    modules = chains.per_module.index
    if len(modules) and "rmsnorm" in str(modules[0]).lower():
        return f"{fix}; so does a fused RMSNorm kernel, which keeps the FP32 math in registers."
    return f"{fix}."


def _upcast_evidence(ev: Evidence, chains: UpcastChains, per_precision: dict[str, float]) -> dict:
    return {
        "fp32_us": chains.total_us,
        "launched_us": chains.launched_us,
        "estimated_us": chains.estimated_us,
        "lost_launch_kernels": chains.lost_kernels,
        "upcasts": chains.upcasts,
        "source_types": chains.source_types,
        "gemm_precision_us": per_precision,
        "modules_us": chains.per_module.to_dict(),
        "module": chains.worst_module,
        "ops": chains.ops,
        "upcast_kernels": chains.per_name.index.tolist(),
        "ts_us": chains.worst_ts + ev.trace.ts_base_us,
        "step": step_at(ev.trace, chains.worst_ts),
    }


def _cuda_core_gemms(ev: Evidence) -> Finding | None:
    """GEMM/convolution kernels on CUDA cores, where they hold at least MIN_PART_PERCENT of GPU time."""
    if ev.dtype not in (None, *LOW_PRECISION_DTYPES):
        return None  # FP32 GEMMs are what a float32 run asked for
    simt = cuda_core_gemms(ev.scope.gpu)
    share = gpu_share(ev, float(np.nansum(simt["dur"].to_numpy())))
    if simt.empty or share is None or share < MIN_PART_PERCENT:
        return None
    per_name = simt.groupby("name", sort=False)["dur"].sum().sort_values(ascending=False, kind="stable")
    names = per_name.index.tolist()
    worst = simt.loc[simt["dur"].idxmax()]
    owner = int(kernel_owners(ev.trace, simt.loc[[worst.name]])[0])
    host_ts = float(ev.trace.events["ts"].iloc[owner]) if owner >= 0 else float(worst["ts"])
    listed = ", ".join(short(n, NAME_IN_LIST) for n in names[:MAX_NAMES_IN_PROSE])
    cut = ev.scope.gpu["name"].nunique() > MAX_NAMES_DECODED  # `cuda_core_gemms` decodes that many names
    among = f" among the {MAX_NAMES_DECODED:,} kernel names with the most time" if cut else ""
    return Finding(
        "FP32 math, no tensor cores",
        f"{len(names)} GEMM/convolution kernel(s){among} run on CUDA cores ({listed}), {share:.1f}% of GPU time"
        + (f", although the inputs are {ev.dtype}." if ev.dtype else "."),
        {
            "kernels": names,
            "cuda_core_us": float(per_name.sum()),
            "ts_us": float(worst["ts"]) + ev.trace.ts_base_us,
            "step": step_at(ev.trace, host_ts),
        },
        share,
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "fp32_upcast",
        "copy_ from bf16/fp16 to float; FP32 kernels those upcasts feed in a bf16/fp16 model; GEMMs on CUDA cores",
        fp32_upcast,
    ),
)
