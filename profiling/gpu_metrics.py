"""GPU metrics and the kernel table's extra columns, by the TensorBoard plugin's definitions.

Source (pytorch/kineto, `tb_plugin/torch_tb_profiler/profiler/`, before the plugin's removal):
- `gpu_metrics_parser.py`, `GPUMetricsParser.calculate_gpu_utilization`: the union of kernel
  intervals, clipped to the first step's start .. the last step's end, over that span;
- `calculate_approximated_sm_efficiency`: blocks per SM of concurrent kernels add up, the sum
  is clamped to 1 (`range_utils.merge_ranges_with_value`), clipped to the steps' span and
  divided by it; kernels with no or non-positive blocks per SM are left out (`parse_event`);
- `calculate_occupancy`: est. achieved occupancy weighted by each kernel's duration inside the
  steps' span, 0% values included, missing or negative values left out;
- `kernel_parser.py`, `KernelParser.parse_events`: per kernel name, max and min duration, and
  blocks per SM and occupancy averaged over calls weighted by duration, a missing value
  counting as 0; the tensor-core share is tensor-core kernel time over all kernel time.
Tensor-core kernels are named by our decoder (`profiling.kernels.decode`) rather than the
plugin's allow-list, which stopped at 2021's kernel names.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.kernels import decode
from profiling.step_breakdown import steps_span
from profiling.trace import Trace

METRICS = ("gpu_utilization_percent", "sm_efficiency_percent", "achieved_occupancy_percent", "tensor_core_time_percent")
DEVICE_FIELDS = ("gpu_name", "gpu_memory_bytes", "compute_capability", "sm_count")
KERNEL_STAT_COLUMNS = ["max (us)", "min (us)", "blocks per SM", "achieved occupancy (%)", "tensor cores"]


def _device_ids(kernels: pd.DataFrame) -> np.ndarray:
    """Each kernel's device: `args.device` (as the plugin reads it), else a numeric pid."""
    pid = pd.to_numeric(kernels["pid"], errors="coerce")
    return kernels["device"].fillna(pid).to_numpy()


def _described(trace: Trace, device: float | None) -> dict[str, Any]:
    """Name, memory, compute capability and SM count from `deviceProperties` (None when absent)."""
    props = trace.device_properties
    if not props:  # 2021 traces wrote `computeProperties` (the plugin's tests/gpu_metrics_input.json)
        listed = trace.metadata.get("computeProperties")
        props = [p for p in listed if isinstance(p, dict)] if isinstance(listed, list) else []
    p = _properties_of(props, device)
    major = p.get("computeMajor", p.get("major"))
    minor = p.get("computeMinor", p.get("minor"))
    return {
        "gpu_name": p.get("name") if isinstance(p.get("name"), str) else None,
        "gpu_memory_bytes": _int_or_none(p.get("totalGlobalMem")),
        "compute_capability": f"{major}.{minor}" if _int_or_none(major) is not None else None,
        "sm_count": _int_or_none(p.get("numSms", p.get("multiProcessorCount"))),
    }


def _properties_of(props: list[dict[str, Any]], device: float | None) -> dict[str, Any]:
    """The entry for `device` (by `id`, else by position when no entry has an id); the first without a device."""
    if device is None:
        return props[0] if props else {}
    if any("id" in p for p in props):
        return next((p for p in props if p.get("id") == device), {})
    return props[int(device)] if 0 <= device < len(props) else {}


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def sm_efficiency_ranges(kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time segments with their Est. SM Efficiency (0..1], as the plugin draws them on the timeline."""
    blocks = kernels["blocks_per_sm"].to_numpy()
    use = blocks > 0  # parse_event: missing or non-positive values are left out
    return iv.stacked_values(kernels["ts"].to_numpy()[use], kernels["end"].to_numpy()[use], blocks[use])


def _utilization(kernels: pd.DataFrame, lo: float, hi: float) -> float:
    busy = iv.clip(iv.union(kernels["ts"].to_numpy(), kernels["end"].to_numpy()), lo, hi)
    return 100.0 * iv.total(busy) / (hi - lo)


def _sm_efficiency(kernels: pd.DataFrame, lo: float, hi: float) -> float | None:
    s, e, v = sm_efficiency_ranges(kernels)
    s, e = np.clip(s, lo, hi), np.clip(e, lo, hi)
    inside = e > s
    if not inside.any():
        return None
    return 100.0 * float(((e - s) * v)[inside].sum()) / (hi - lo)


def _occupancy(kernels: pd.DataFrame, lo: float, hi: float) -> float | None:
    occ = kernels["occupancy"].to_numpy()
    use = occ >= 0  # NaN (missing) and negative values are left out, 0% counts
    weight = np.clip(np.minimum(kernels["end"].to_numpy(), hi) - np.maximum(kernels["ts"].to_numpy(), lo), 0, None)
    total = weight[use].sum()
    return float((occ[use] * weight[use]).sum() / total) if total > 0 else None


def _tensor_core_share(kernels: pd.DataFrame) -> float | None:
    per_name = kernels.groupby("name", sort=False)["dur"].sum()  # decode each name once, not each call
    total = float(per_name.sum())
    if total <= 0:
        return None
    uses = np.array([decode(name).tensor_cores is True for name in per_name.index], dtype=bool)
    return 100.0 * float(per_name[uses].sum()) / total


def _device_metrics(kernels: pd.DataFrame, span: tuple[float, float] | None) -> dict[str, float | None]:
    if span is None or span[1] <= span[0] or kernels.empty:
        return {**dict.fromkeys(METRICS), "tensor_core_time_percent": _tensor_core_share(kernels)}
    lo, hi = span
    return {
        "gpu_utilization_percent": _utilization(kernels, lo, hi),
        "sm_efficiency_percent": _sm_efficiency(kernels, lo, hi),
        "achieved_occupancy_percent": _occupancy(kernels, lo, hi),
        "tensor_core_time_percent": _tensor_core_share(kernels),
    }


def gpu_metrics(trace: Trace) -> dict[str, Any]:
    """Per-GPU metrics in `gpus`, and at the top level the first GPU's description and the mean over GPUs.

    Every key is None where its evidence is missing (no kernels, no steps span, no
    `deviceProperties`, no blocks-per-SM or occupancy args).
    """
    kernels = trace.kernels
    span = steps_span(trace)
    devices = _device_ids(kernels)
    gpus = []
    for device in np.unique(devices[~np.isnan(devices)]):
        mine = kernels[devices == device]
        gpus.append({"device": int(device), **_described(trace, device), **_device_metrics(mine, span)})
    top: dict[str, Any] = {**_described(trace, gpus[0]["device"] if gpus else None)}
    for key in METRICS:
        values = [g[key] for g in gpus if g[key] is not None]
        top[key] = float(np.mean(values)) if values else None
    top["gpus"] = gpus
    return top


def _weighted_mean(values: pd.Series, weights: pd.Series, names: pd.Series) -> pd.Series:
    """Per name, sum(value x duration) / sum(duration), a missing value counting as 0 (weighted_avg)."""
    frame = pd.DataFrame({"name": names, "vw": values.fillna(0).to_numpy() * weights.to_numpy(), "w": weights})
    sums = frame.groupby("name", sort=False)[["vw", "w"]].sum()
    # np.average raises ZeroDivisionError on zero total weight; the plugin then shows 0.
    return (sums["vw"] / sums["w"].where(sums["w"] > 0)).fillna(0.0)


def kernel_stats(trace: Trace) -> pd.DataFrame:
    """One row per kernel name: max/min µs, duration-weighted blocks per SM and occupancy, tensor cores."""
    k = trace.kernels
    if k.empty:
        return pd.DataFrame(columns=KERNEL_STAT_COLUMNS, index=pd.Index([], name="name"))
    grouped = k.groupby("name", sort=False)["dur"]
    stats = pd.DataFrame({"max (us)": grouped.max(), "min (us)": grouped.min()})
    stats["blocks per SM"] = _weighted_mean(k["blocks_per_sm"], k["dur"], k["name"])
    stats["achieved occupancy (%)"] = _weighted_mean(k["occupancy"], k["dur"], k["name"])
    stats["tensor cores"] = [_yes_no(decode(name).tensor_cores) for name in stats.index]
    stats.index.name = "name"
    return stats[KERNEL_STAT_COLUMNS]


def _yes_no(uses: bool | None) -> str:
    return {True: "yes", False: "no"}.get(uses, "unknown")
