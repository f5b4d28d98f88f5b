"""Which `deviceProperties` entry describes the GPU each kernel ran on, and what that GPU is.

Kineto writes `deviceProperties` from the devices the process sees (`hipGetDeviceCount` or
`cudaGetDeviceCount`, ids 0, 1, ... in that order: libkineto/src/DeviceProperties.cpp,
`createDevicePropertiesJson`), while each kernel's `args.device` is the id its tracer reports.
On CUDA the two agree. On ROCm they need not: roctracer reports the agent's id among all GPUs of
the node, so a process pinned to one MI300X lists one entry with id 0 while its kernels say
device 2 (or 9). The mapping, in order:

- "same id": every kernel device has an entry with that id (at that position, for 2021 traces
  whose entries carry no id): each keeps its own, as before;
- "ascending order": otherwise, where there are as many distinct kernel devices as entries, the
  k-th smallest kernel device takes the entry with the k-th smallest id (visible devices are
  numbered in the order of the node's), the one reading that names every GPU;
- "unmatched": otherwise a device keeps only an entry with its own id, if any; the others are
  not described (a name, memory or SM count from another GPU would be a guess).

Each GPU's description: name, memory, SM (AMD: compute unit) count, and the architecture. For
AMD, `compute_capability` is None: HIP reports a major.minor (9.4 on an MI300X) that is no CUDA
compute capability and would read as Hopper; `gpu_arch` comes from `gcnArchName`, else a table of
product names. For NVIDIA, `gpu_arch` is `sm_<major><minor>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profiling.occupancy import LARGEST_LIMIT, whole_number

if TYPE_CHECKING:
    from profiling.trace import Trace

SAME_ID, ASCENDING, UNMATCHED = "same id", "ascending order", "unmatched"
# Instinct products by name, where an entry has no gcnArchName (Kineto's ROCm entries do not carry
# it): AMD's ROCm hardware-specifications table. Longest names first, so MI250X is not read as MI250.
AMD_ARCH_BY_PRODUCT = {
    "MI355X": "gfx950",
    "MI350X": "gfx950",
    "MI325X": "gfx942",
    "MI300X": "gfx942",
    "MI300A": "gfx942",
    "MI250X": "gfx90a",
    "MI250": "gfx90a",
    "MI210": "gfx90a",
    "MI100": "gfx908",
}
_PRODUCT = re.compile(r"\bMI\d{3}[AX]?\b")
_GCN_ARCH = re.compile(r"gfx[0-9a-f]{2,4}")
_AMD_NAME = re.compile(r"\b(AMD|Instinct|Radeon)\b", re.IGNORECASE)
AMD_WAVEFRONT = 64  # no NVIDIA GPU has a 64-thread warp; every AMD Instinct runs 64-wide wavefronts
NAME_CHARS = 200  # a device name from a trace is data: a hostile one is cut before any regex reads it


def device_ids(kernels: pd.DataFrame) -> np.ndarray:
    """Each kernel's device: `args.device` (as the plugin reads it), else a numeric pid; NaN where neither
    is a device index (a whole number from 0 to 2^31 - 1)."""
    device = _as_device_number(kernels["device"].to_numpy(dtype=np.float64))
    missing = np.isnan(device)
    if missing.any():  # pids are objects: read only where needed (a million kernels take a second)
        pids = pd.to_numeric(kernels["pid"].to_numpy()[missing], errors="coerce")
        device[missing] = _as_device_number(np.asarray(pids, dtype=np.float64))
    return device


def _as_device_number(values: np.ndarray) -> np.ndarray:
    whole = (values >= 0) & (values <= LARGEST_LIMIT) & (np.floor(values) == values)  # NaN compares False
    return np.where(whole, values, np.nan)


@dataclass(frozen=True)
class DeviceIndex:
    """`deviceProperties` indexed once: an entry per id, or by position where no entry has an id.

    Built in one pass (a trace may list 200,000 entries; looking each device up by a scan was
    quadratic). For an id listed twice, the first entry wins, as a scan from the top found it.
    """

    entries: list[dict[str, Any]]
    by_id: dict[float, dict[str, Any]] | None  # None: no entry has an id, look up by position

    @classmethod
    def of(cls, entries: list[dict[str, Any]]) -> DeviceIndex:
        with_ids = [p for p in entries if "id" in p]
        if not with_ids:
            return cls(entries, None)
        by_id: dict[float, dict[str, Any]] = {}
        for p in with_ids:  # ids that are not numbers (2021's computeProperties is unchecked) match no device
            if type(p["id"]) in (int, float):
                by_id.setdefault(p["id"], p)
        return cls(entries, by_id)

    def entry(self, device: float | None) -> dict[str, Any]:
        """The entry for `device` ({} where none); the first entry for no device."""
        if device is None:
            return self.entries[0] if self.entries else {}
        if self.by_id is not None:
            return self.by_id.get(float(device), {})
        return self.entries[int(device)] if 0 <= device < len(self.entries) else {}

    def keys(self) -> np.ndarray:
        """The ids a device can match, ascending: the entries' ids, or their positions."""
        if self.by_id is None:
            return np.arange(len(self.entries), dtype=np.float64)
        return np.sort(np.fromiter(self.by_id, dtype=np.float64, count=len(self.by_id)))


def device_index(trace: Trace) -> DeviceIndex:
    """The trace's `deviceProperties`, indexed; 2021 traces wrote `computeProperties` (the plugin's
    tests/gpu_metrics_input.json)."""
    props = trace.device_properties
    if not props:
        listed = trace.metadata.get("computeProperties")
        props = [p for p in listed if isinstance(p, dict)] if isinstance(listed, list) else []
    return DeviceIndex.of(props)


@dataclass(frozen=True)
class DeviceMapping:
    """Kernel device ids to `deviceProperties` entries, by one rule for the whole trace (module docstring)."""

    index: DeviceIndex
    rule: str
    ascending: dict[float, float]  # kernel device -> the entry's id (or position); "ascending order" only

    def key(self, device: float) -> float | None:
        """The id (or position) of the entry describing `device`, None where no entry does."""
        if self.rule == ASCENDING:
            return self.ascending.get(float(device))
        return float(device) if self.index.entry(device) else None

    def entry(self, device: float | None) -> dict[str, Any]:
        """The entry describing `device` ({} where none); the first entry for no device."""
        if device is None:
            return self.index.entry(None)
        key = self.key(device)
        return self.index.entry(key) if key is not None else {}

    def record(self, device: float) -> dict[str, Any]:
        """What a `gpus` entry says of its mapping: the kernel device, the entry's id, and the rule."""
        key = self.key(device)
        rule = UNMATCHED if key is None else ASCENDING if self.rule == ASCENDING else SAME_ID
        return {"kernel_device": int(device), "properties_id": None if key is None else int(key), "rule": rule}


def device_mapping(index: DeviceIndex, devices: np.ndarray) -> DeviceMapping:
    """The mapping of the distinct kernel device ids `devices` (NaN ignored) to `index`'s entries."""
    ids = np.unique(devices[~np.isnan(devices)])
    keys = index.keys()
    if np.isin(ids, keys).all():
        return DeviceMapping(index, SAME_ID, {})
    if len(ids) == len(keys):  # as many devices as entries, so both lists are bounded by the entries
        return DeviceMapping(index, ASCENDING, dict(zip(ids.tolist(), keys.tolist(), strict=True)))
    return DeviceMapping(index, UNMATCHED, {})


def trace_mapping(trace: Trace) -> DeviceMapping:
    """The trace's mapping, from the devices its kernels ran on."""
    return device_mapping(device_index(trace), device_ids(trace.kernels))


def describe(p: dict[str, Any]) -> dict[str, Any]:
    """Name, memory, compute capability (NVIDIA only), SM or compute-unit count and architecture of one
    `deviceProperties` entry; None for each field absent or unusable."""
    name = p.get("name") if isinstance(p.get("name"), str) else None
    major = _int_or_none(p.get("computeMajor", p.get("major")))
    minor = _int_or_none(p.get("computeMinor", p.get("minor")))
    nvidia_version = major is not None and minor is not None and not is_amd(p)
    return {
        "gpu_name": name,
        "gpu_memory_bytes": _int_or_none(p.get("totalGlobalMem")),
        "compute_capability": f"{major}.{minor}" if nvidia_version else None,
        "sm_count": _int_or_none(p.get("numSms", p.get("multiProcessorCount"))),
        "gpu_arch": amd_arch(p) if is_amd(p) else f"sm_{major}{minor}" if nvidia_version else None,
    }


def is_amd(p: dict[str, Any]) -> bool:
    """An AMD GPU: a `gcnArchName`, an AMD product name, or 64-wide wavefronts."""
    name = p.get("name")
    named = isinstance(name, str) and _AMD_NAME.search(name[:NAME_CHARS]) is not None
    return "gcnArchName" in p or named or p.get("warpSize") == AMD_WAVEFRONT


def amd_arch(p: dict[str, Any]) -> str | None:
    """`gfx942` from a `gcnArchName` such as "gfx942:sramecc+:xnack-", else from the product name."""
    arch = p.get("gcnArchName")
    if isinstance(arch, str) and (found := _GCN_ARCH.match(arch[:NAME_CHARS])):
        return found.group()
    name = p.get("name")
    product = _PRODUCT.search(name[:NAME_CHARS]) if isinstance(name, str) else None
    return AMD_ARCH_BY_PRODUCT.get(product.group()) if product else None


def _int_or_none(value: object) -> int | None:
    """A whole number from 0 to 2^63 (a JSON number, not a bool), as every count and size of a device is;
    None for anything else, NaN and infinity included."""
    return int(value) if whole_number(value, 2**63, smallest=0) else None  # type: ignore[call-overload]


def device_names(trace: Trace) -> list[str]:
    """Names of the devices that ran something (through the trace's mapping); else those the trace
    describes; else `cpu`. Eight identical GPUs are one kind of device to the reader."""
    mapping = trace_mapping(trace)
    ran = _as_device_number(trace.gpu_activity["device"].to_numpy(dtype=np.float64))
    found = [_name(mapping.entry(d), int(d)) for d in np.unique(ran[~np.isnan(ran)]).tolist()]
    described = [_name(p, p["id"] if type(p.get("id")) is int else i) for i, p in enumerate(mapping.index.entries)]
    return list(dict.fromkeys(found or described)) or ["cpu"]


def _name(p: dict[str, Any], number: int) -> str:
    """The entry's name, or `device N` where it has none (N: the kernel device, or the entry's id)."""
    name = p.get("name")
    return name if isinstance(name, str) else f"device {number}"
