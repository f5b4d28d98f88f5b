"""The TensorBoard plugin's training recommendations, each a finding with its evidence.

Source (pytorch/kineto, `tb_plugin/torch_tb_profiler/profiler/data.py`, `RunProfileData.analyze` and
`_analyze_gpu_metrics`, before the plugin's removal), with its thresholds:
- DataLoader time above 5% of the average step (`dataloader_ratio > 0.05`);
- a GPU whose utilization is under 50% (`gpu_utilization[gpu_id] < 0.5`);
- a device's peak allocated memory above 90% of its `totalGlobalMem` (`peak_mem > total_mem * 0.9`);
- AMP: compute capability >= 7, no kernel time on tensor cores (`tc_used_ratio == 0.0`), and kernel time
  launched by tensor-core-eligible ops above 0 (`tc_eligible_ops_kernel_ratio > 0.0`).
The plugin's communication recommendation (above 10% of the step) is the `communication` rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.devices import describe, device_ids, device_index
from profiling.gpu_metrics import gpu_metrics
from profiling.grouping import TC_ELIGIBLE_OPS  # the plugin's TC_OP_Allowlist, exact op names
from profiling.insights import host
from profiling.insights.base import NAME_IN_LIST, Evidence, Finding, Rule, fmt_bytes, gpu_share, short
from profiling.step_breakdown import POSITION, adjusted_steps, step_at, step_breakdown, steps_span
from profiling.upcasts import kernel_owners

DATALOADER_STEP_PERCENT = 5.0
LOW_UTILIZATION_PERCENT = 50.0
MEMORY_CAPACITY_PERCENT = 90.0
TENSOR_CORE_MAJOR = 7  # tensor cores exist from compute capability 7.0 (Volta)
CPU_DEVICE_TYPE = 0  # c10::DeviceType::CPU in a `[memory]` event's `Device Type`; CUDA is 1, HIP 6
MAX_DEVICES_CHECKED = 64  # devices whose peak is compared with their capacity (a node has 8)
MAX_OPS_LISTED = 5
MAX_GPUS_IN_PROSE = 8  # the evidence lists up to 10


def dataloader_bound(ev: Evidence) -> Finding | None:
    """The plugin's DataLoader share of the average step (its step breakdown) above DATALOADER_STEP_PERCENT."""
    breakdown = step_breakdown(ev.trace)
    step_us, loading_us = breakdown.average_step_time_us, breakdown.breakdown_us.get("dataloader")
    if not step_us or loading_us is None or 100.0 * loading_us / step_us <= DATALOADER_STEP_PERCENT:
        return None
    percent = 100.0 * loading_us / step_us
    per_step = breakdown.per_step
    worst = int(np.argmax(per_step["dataloader (us)"].to_numpy()))
    starts = adjusted_steps(ev.trace).set_index(POSITION)["start"]
    worst_start = float(starts[per_step[POSITION].iloc[worst]])
    return Finding(
        "DataLoader-bound",
        f"{percent:.1f}% of the average step ({loading_us / 1e3:.3f} of {step_us / 1e3:.3f} ms) is spent "
        "in the DataLoader's __next__ while no GPU work or launch ran (the plugin's step breakdown). Load data "
        "in worker processes (DataLoader(num_workers=N), with pin_memory=True and "
        "persistent_workers=True), or make each sample cheaper to prepare.",
        {
            "dataloader_percent": percent,
            "dataloader_us": loading_us,
            "step_us": step_us,
            "steps": len(per_step),
            "worst_step_dataloader_us": float(per_step["dataloader (us)"].iloc[worst]),
            "ts_us": worst_start + ev.trace.ts_base_us,
            "step": str(per_step["step"].iloc[worst]),
        },
        # About host time waiting for data, not about GPU events.
        None,
    )


def low_gpu_utilization(ev: Evidence) -> Finding | None:
    """GPUs busy under LOW_UTILIZATION_PERCENT of the steps' span (the plugin's GPU utilization), where neither
    a blocking sync nor launch-bound execution (the host rules) already explains the idle time."""
    low = [g for g in gpu_metrics(ev.trace)["gpus"] if _utilization(g) < LOW_UTILIZATION_PERCENT]
    if not low or host.blocking_sync(ev) is not None or host.launch_bound(ev) is not None:
        return None
    worst = min(low, key=_utilization)
    gap = _widest_gap(ev, worst["device"])
    listed = ", ".join(f"GPU {g['device']} ({g['gpu_utilization_percent']:.1f}%)" for g in low[:MAX_GPUS_IN_PROSE])
    return Finding(
        "Low GPU utilization",
        f"{listed} ran a kernel for under {LOW_UTILIZATION_PERCENT:.0f}% of the steps' span (the plugin's GPU "
        "utilization), and no single sync or launch cadence explains the idle time"
        + (f"; the widest idle gap on GPU {worst['device']} is {gap[1] / 1e3:.3f} ms" if gap else "")
        + ". Give each step more work (a larger batch, which may change convergence), or see the idle-time "
        "breakdown for what the GPU waited on.",
        {
            "gpus": [{"device": g["device"], "utilization_percent": g["gpu_utilization_percent"]} for g in low],
            "threshold_percent": LOW_UTILIZATION_PERCENT,
            "widest_gap_us": gap[1] if gap else None,
            "ts_us": gap[0] + ev.trace.ts_base_us if gap else None,
            "step": step_at(ev.trace, gap[0], device_side=True) if gap else None,
        },
        # About idle time, not about GPU events.
        None,
    )


def _utilization(gpu: dict[str, Any]) -> float:
    value = gpu["gpu_utilization_percent"]
    return float("inf") if value is None else float(value)


def _widest_gap(ev: Evidence, device: int) -> tuple[float, float] | None:
    """Start and length of the widest stretch of the steps' span with no kernel on `device`."""
    span = steps_span(ev.trace)
    kernels = ev.trace.kernels
    if span is None:
        return None
    mine = device_ids(kernels) == device
    busy = iv.clip(iv.union(kernels["ts"].to_numpy()[mine], kernels["end"].to_numpy()[mine]), *span)
    edges = np.concatenate([[span[0]], busy[1]]), np.concatenate([busy[0], [span[1]]])
    widths = edges[1] - edges[0]
    if not len(widths) or widths.max() <= 0:
        return None
    k = int(np.argmax(widths))
    return float(edges[0][k]), float(widths[k])


def memory_near_capacity(ev: Evidence) -> Finding | None:
    """A GPU whose peak allocated memory (max `Total Allocated` of its `[memory]` events) is above
    MEMORY_CAPACITY_PERCENT of its `totalGlobalMem`."""
    trace = ev.trace
    events = trace.events
    id_column = "device_id" if "device_id" in events.columns else "device"
    memory = events[(events["name"].to_numpy() == "[memory]") & (events["device_type"].to_numpy() != CPU_DEVICE_TYPE)]
    device = memory[id_column].to_numpy(dtype=np.float64)
    whole = (device >= 0) & (np.floor(device) == device)  # a device index; NaN compares False
    memory = memory[whole & memory["total_allocated"].notna().to_numpy() & memory["device_type"].notna().to_numpy()]
    if memory.empty:
        return None
    peak_rows = memory.groupby([memory["device_type"], memory[id_column]], sort=False)["total_allocated"].idxmax()
    peaks = memory.loc[peak_rows.to_numpy()].sort_values("total_allocated", ascending=False, kind="stable")
    index = device_index(trace)
    full = []
    for row in peaks.head(MAX_DEVICES_CHECKED).itertuples():
        capacity = describe(index.entry(float(getattr(row, id_column))))["gpu_memory_bytes"]
        if capacity and row.total_allocated > capacity * MEMORY_CAPACITY_PERCENT / 100:
            full.append((row, capacity))
    if not full:
        return None
    row, capacity = full[0]
    percent = 100.0 * row.total_allocated / capacity
    return Finding(
        "Memory near capacity",
        f"GPU {int(getattr(row, id_column))} held {fmt_bytes(row.total_allocated)} allocated at its peak, "
        f"{percent:.1f}% of its {fmt_bytes(capacity)} (above {MEMORY_CAPACITY_PERCENT:.0f}%): a larger batch will "
        "not fit. Activation checkpointing (torch.utils.checkpoint) or mixed precision (torch.autocast) frees "
        "memory for one.",
        {
            "devices": [
                {"device": int(getattr(r, id_column)), "peak_bytes": r.total_allocated, "capacity_bytes": c}
                for r, c in full
            ],
            "peak_bytes": row.total_allocated,
            "capacity_bytes": capacity,
            "peak_percent": percent,
            "ts_us": row.ts + trace.ts_base_us,
            "step": step_at(trace, row.ts),
        },
        # About memory, not about GPU time.
        None,
    )


def amp_opportunity(ev: Evidence) -> Finding | None:
    """Compute capability >= 7, no kernel time on tensor cores, and kernel time launched by tensor-core-eligible
    ops (the plugin's allow-list) above 0."""
    metrics = gpu_metrics(ev.trace)
    capability = metrics["compute_capability"]
    shares = [g["tensor_core_time_percent"] for g in metrics["gpus"]]
    if capability is None or int(capability.split(".")[0]) < TENSOR_CORE_MAJOR:
        return None
    if not shares or any(s is None or s > 0 for s in shares):
        return None
    eligible = _eligible_kernels(ev)
    if eligible is None:
        return None
    kernels, owned_us = eligible
    eligible_us = float(kernels["dur"].sum())
    percent = 100.0 * eligible_us / owned_us
    by_op = kernels.groupby("op", sort=False)["dur"].sum().sort_values(ascending=False, kind="stable")
    longest = kernels.loc[kernels["dur"].idxmax()]
    unknown = metrics["tensor_core_unknown_percent"] or 0.0
    ops = ", ".join(f"{short(op, NAME_IN_LIST)} ({us / 1e3:.3f} ms)" for op, us in by_op.head(3).items())
    return Finding(
        "Mixed precision (AMP)",
        f"{percent:.0f}% of the kernel time launched by ops is launched by ops that could use tensor cores ({ops}), "
        f"yet no kernel ran on them, on a GPU of compute capability {capability}"
        + (f" (the decoder cannot tell the engine of {unknown:.0f}% of kernel time)" if unknown else "")
        + ". Run the model under torch.autocast with float16 or bfloat16 (torch.amp), or allow TF32 matmuls "
        '(torch.set_float32_matmul_precision("high")).',
        {
            "eligible_percent": percent,
            "eligible_kernel_us": eligible_us,
            "op_kernel_us": owned_us,
            "compute_capability": capability,
            "tensor_core_time_percent": 0.0,
            "tensor_core_unknown_percent": metrics["tensor_core_unknown_percent"],
            "ops": [{"op": op, "kernel_us": float(us)} for op, us in by_op.head(MAX_OPS_LISTED).items()],
            "longest": {"name": longest["name"], "dur_us": float(longest["dur"])},
            "ts_us": float(longest["ts"]) + ev.trace.ts_base_us,
            "step": step_at(ev.trace, float(longest["ts"]), device_side=True),
        },
        gpu_share(ev, eligible_us),
    )


def _eligible_kernels(ev: Evidence) -> tuple[pd.DataFrame, float] | None:
    """The kernels whose launching op is tensor-core eligible (with that op in column `op`), and the kernel time
    of all kernels launched by an op: the plugin's ratio, whose denominator is the ops' kernels. None where no
    eligible op launched a kernel."""
    trace = ev.trace
    kernels = trace.kernels
    owners = kernel_owners(trace, kernels)
    owned = owners >= 0
    owned_us = float(np.nansum(kernels["dur"].to_numpy()[owned]))
    if owned_us <= 0:
        return None
    op = pd.Series(trace.events["name"].to_numpy()[owners[owned]], index=kernels.index[owned])
    eligible = op[op.isin(TC_ELIGIBLE_OPS).to_numpy()]
    chosen = kernels.loc[eligible.index].assign(op=eligible.to_numpy())
    chosen = chosen[chosen["dur"].to_numpy() > 0]
    return (chosen, owned_us) if len(chosen) else None


RULES: tuple[Rule, ...] = (
    Rule("dataloader_bound", "DataLoader time > 5% of the step (the plugin's threshold)", dataloader_bound),
    Rule(
        "low_gpu_utilization",
        "a GPU busy < 50% of the steps' span, unexplained by a blocking sync or launch-bound execution",
        low_gpu_utilization,
    ),
    Rule("memory_near_capacity", "peak allocated memory > 90% of a GPU's totalGlobalMem", memory_near_capacity),
    Rule(
        "amp_opportunity",
        "compute capability >= 7, no tensor-core kernel time, kernels from tensor-core-eligible ops",
        amp_opportunity,
    ),
)
