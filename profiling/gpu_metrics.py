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
Tensor-core kernels are named by our decoder (`profiling.kernels.decode`, its `engine`) rather than
the plugin's allow-list, which stopped at 2021's kernel names; the kernel time of the engines it cannot
tell is `tensor_core_unknown_percent`, so unknown never reads as "no".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.devices import describe, device_ids, device_index, device_mapping
from profiling.kernels import UNKNOWN, decode_most
from profiling.step_breakdown import steps_span
from profiling.trace import Trace, per_trace

METRICS = (
    "gpu_utilization_percent",
    "sm_efficiency_percent",
    "achieved_occupancy_percent",
    "tensor_core_time_percent",
    "tensor_core_unknown_percent",  # kernel time whose engine the decoder cannot tell: never read as "no"
)
# What `devices.describe` gives of a GPU; `gpu_arch` is "sm_90" on NVIDIA, "gfx942" on AMD (no compute capability).
DEVICE_FIELDS = ("gpu_name", "gpu_memory_bytes", "compute_capability", "sm_count", "gpu_arch")
# The most blocks one grid can hold (2^31 - 1 x 65,535 x 65,535): blocks per SM cannot pass it.
MAX_GRID_BLOCKS = (2**31 - 1) * 65535 * 65535
BLOCKS_PER_SM_CAP = 2.0**20
MAX_LISTED_GPUS = 64  # per-GPU entries in `gpus`; `gpu_count` counts them all
KERNEL_STAT_COLUMNS = ["max (us)", "min (us)", "blocks per SM", "achieved occupancy (%)", "tensor cores"]


def valid_occupancy(values: np.ndarray) -> np.ndarray:
    """Est. achieved occupancy % where it can be true, from 0 to 100; NaN where missing or out of that range.

    The plugin leaves negative values out (gpu_metrics_parser.py, `parse_event`); a value above 100%
    cannot be true either (a per-kernel estimate of active over possible warps), so it is left out
    the same way, never clamped: clamping would report 100% as if measured.
    """
    values = np.asarray(values, dtype=np.float64)
    return np.where((values >= 0) & (values <= 100), values, np.nan)


def valid_blocks_per_sm(values: np.ndarray) -> np.ndarray:
    """Blocks per SM where it can be true, from 0 to a whole grid on one SM; NaN elsewhere."""
    values = np.asarray(values, dtype=np.float64)
    return np.where((values >= 0) & (values <= MAX_GRID_BLOCKS), values, np.nan)


def sm_efficiency_ranges(kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time segments with their Est. SM Efficiency (0..1], as the plugin draws them on the timeline."""
    blocks = valid_blocks_per_sm(kernels["blocks_per_sm"].to_numpy())
    use = blocks > 0  # parse_event: missing or non-positive values are left out
    # The sum over concurrent kernels is clamped to 1, so capping each value changes no result, and a
    # huge one can no longer swamp the small ones it overlaps in floating point (1e19 + 0.5 - 1e19 is 0).
    # The cap sits far above real values (7,585 the most in our traces), whose sums stay bit for bit.
    capped = np.minimum(blocks[use], BLOCKS_PER_SM_CAP)
    return iv.stacked_values(kernels["ts"].to_numpy()[use], kernels["end"].to_numpy()[use], capped)


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
    occ = valid_occupancy(kernels["occupancy"].to_numpy())
    use = ~np.isnan(occ)  # missing and impossible values are left out, 0% counts
    weight = np.clip(np.minimum(kernels["end"].to_numpy(), hi) - np.maximum(kernels["ts"].to_numpy(), lo), 0, None)
    total = weight[use].sum()
    # A mean of values in 0..100 is in 0..100; the cap only takes off the last bit's rounding.
    return min(float((occ[use] * weight[use]).sum() / total), 100.0) if total > 0 else None


def tensor_core_use(kernels: pd.DataFrame) -> dict[str, bool | None]:
    """Whether each kernel name runs on tensor cores, by our decoder: each name decoded once, however many
    devices or tables ask; a name past the MAX_NAMES_DECODED with the most time is not here: unknown."""
    return {name: info.tensor_cores for name, info in decode_most(kernels["name"], kernels["dur"]).items()}


def kernel_engines(kernels: pd.DataFrame) -> dict[str, str]:
    """What each kernel name runs on (tensor, simt, copy, unknown), for the names `tensor_core_use` holds."""
    return {name: info.engine for name, info in decode_most(kernels["name"], kernels["dur"]).items()}


def _tensor_core_share(kernels: pd.DataFrame, uses: Mapping[str, bool | None]) -> float | None:
    """Tensor-core kernel time over all kernel time, in % (the plugin's definition; `uses` from `tensor_core_use`)."""
    return _share(kernels, lambda name: uses.get(name) is True)


def _unknown_engine_share(kernels: pd.DataFrame, engines: Mapping[str, str] | None) -> float | None:
    """Kernel time whose engine the decoder cannot tell (or did not decode) over all kernel time, in %."""
    engines = kernel_engines(kernels) if engines is None else engines
    return _share(kernels, lambda name: engines.get(name, UNKNOWN) == UNKNOWN)


def _share(kernels: pd.DataFrame, counted: Callable[[str], bool]) -> float | None:
    per_name = kernels.groupby("name", sort=False)["dur"].sum()
    total = float(per_name.sum())
    if total <= 0:
        return None
    chosen = np.array([counted(name) for name in per_name.index], dtype=bool)
    return 100.0 * float(per_name[chosen].sum()) / total


def _engine_shares(
    kernels: pd.DataFrame, uses: Mapping[str, bool | None], engines: Mapping[str, str] | None
) -> dict[str, float | None]:
    return {
        "tensor_core_time_percent": _tensor_core_share(kernels, uses),
        "tensor_core_unknown_percent": _unknown_engine_share(kernels, engines),
    }


def _device_metrics(
    kernels: pd.DataFrame,
    span: tuple[float, float] | None,
    uses: Mapping[str, bool | None],
    engines: Mapping[str, str] | None = None,
) -> dict[str, float | None]:
    """`engines` (`kernel_engines` of the names) where the caller has it; decoded here otherwise."""
    if span is None or span[1] <= span[0] or kernels.empty:
        return {**dict.fromkeys(METRICS), **_engine_shares(kernels, uses, engines)}
    lo, hi = span
    return {
        "gpu_utilization_percent": _utilization(kernels, lo, hi),
        "sm_efficiency_percent": _sm_efficiency(kernels, lo, hi),
        "achieved_occupancy_percent": _occupancy(kernels, lo, hi),
        **_engine_shares(kernels, uses, engines),
    }


@per_trace
def gpu_metrics(trace: Trace) -> dict[str, Any]:
    """Per-GPU metrics in `gpus`, and at the top level the first GPU's description and the mean over GPUs.

    Every key is None where its evidence is missing (no kernels, no steps span, no
    `deviceProperties`, no blocks-per-SM or occupancy args). `gpu_count` GPUs ran kernels; `gpus`
    lists the MAX_LISTED_GPUS with the most kernel time (a node has 8; a trace can name millions). Each
    entry is described by the `deviceProperties` entry `profiling.devices` maps its kernels' device to, and
    records that mapping in `device_mapping` (kernel_device, properties_id, rule).
    """
    kernels = trace.kernels
    span = steps_span(trace)
    devices = device_ids(kernels)
    mapping = device_mapping(device_index(trace), devices)
    known = np.flatnonzero(~np.isnan(devices))
    ids, of_kernel = np.unique(devices[known], return_inverse=True)
    listed = _most_kernel_time(ids, of_kernel, kernels["dur"].to_numpy()[known])
    rows_of = np.split(known[np.argsort(of_kernel, kind="stable")], np.cumsum(np.bincount(of_kernel))[:-1])
    mine = [kernels.iloc[rows_of[i]] for i in listed]
    uses, engines = tensor_core_use(kernels), kernel_engines(kernels)  # the listed devices' names are among them
    gpus = [
        {
            "device": int(ids[i]),
            "device_mapping": mapping.record(ids[i]),
            **describe(mapping.entry(ids[i])),
            **_device_metrics(frame, span, uses, engines),
        }
        for i, frame in zip(listed, mine, strict=True)
    ]
    top: dict[str, Any] = {**describe(mapping.entry(gpus[0]["device"] if gpus else None))}
    for key in METRICS:
        values = [g[key] for g in gpus if g[key] is not None]
        top[key] = float(np.mean(values)) if values else None
    top["gpu_count"] = len(ids)
    top["gpus"] = gpus
    return top


def _most_kernel_time(ids: np.ndarray, of_kernel: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Positions in `ids` of the MAX_LISTED_GPUS devices with the most kernel time, in id order."""
    if len(ids) <= MAX_LISTED_GPUS:
        return np.arange(len(ids))
    busy = np.bincount(of_kernel, weights=dur, minlength=len(ids))
    return np.sort(np.argsort(-busy, kind="stable")[:MAX_LISTED_GPUS])


def _weighted_mean(values: np.ndarray, weights: pd.Series, names: pd.Series) -> pd.Series:
    """Per name, sum(value x duration) / sum(duration), a missing value counting as 0 (weighted_avg)."""
    frame = pd.DataFrame({"name": names, "vw": np.nan_to_num(values, nan=0.0) * weights.to_numpy(), "w": weights})
    sums = frame.groupby("name", sort=False)[["vw", "w"]].sum()
    # np.average raises ZeroDivisionError on zero total weight; the plugin then shows 0.
    return (sums["vw"] / sums["w"].where(sums["w"] > 0)).fillna(0.0)


def kernel_stats(trace: Trace, uses: Mapping[str, bool | None] | None = None) -> pd.DataFrame:
    """One row per kernel name: max/min µs, duration-weighted blocks per SM and occupancy, tensor cores
    (from `uses`, `tensor_core_use` of the names, where the caller has it)."""
    k = trace.kernels
    if k.empty:
        return pd.DataFrame(columns=KERNEL_STAT_COLUMNS, index=pd.Index([], name="name"))
    grouped = k.groupby("name", sort=False)["dur"]
    stats = pd.DataFrame({"max (us)": grouped.max(), "min (us)": grouped.min()})
    stats["blocks per SM"] = _weighted_mean(valid_blocks_per_sm(k["blocks_per_sm"]), k["dur"], k["name"])
    occupancy = _weighted_mean(valid_occupancy(k["occupancy"]), k["dur"], k["name"])
    stats["achieved occupancy (%)"] = occupancy.clip(upper=100.0)  # rounding only: a mean of 0..100
    uses = tensor_core_use(k) if uses is None else uses
    stats["tensor cores"] = [_yes_no(uses.get(name)) for name in stats.index]
    stats.index.name = "name"
    return stats[KERNEL_STAT_COLUMNS]


def _yes_no(uses: bool | None) -> str:
    return {True: "yes", False: "no"}.get(uses, "unknown")
