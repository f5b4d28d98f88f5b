"""The device's measured yardsticks, with their spread: a large matmul's TFLOP/s and a large copy's GB/s.

The roofline and the run-time estimate need this device's peaks where no vendor figure applies (a CPU,
an unknown GPU). They are measured once per process and device with `torch.utils.benchmark`'s
`blocked_autorange`, and kept as a distribution (median, p25, p75, n over its blocks), never a lone
number. Where they come from, first match wins:

1. `use(calibration)`: injected (tests); `use(None)` clears it.
2. `ATTENTION_PROFILER_CALIBRATION=path.json`: loaded, validated, for the device(s) it names (one
   calibration, or a list of them, as `to_json` writes). A bad file is a ValueError naming the variable.
3. Measured here, on first use, and cached for the rest of the process.

So a test suite, or a run to be reproduced, fixes the peaks instead of measuring a loaded machine.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

import numpy as np
import torch
import torch.utils.benchmark as benchmark

ENV = "ATTENTION_PROFILER_CALIBRATION"
MATMUL_SIZE = {"cpu": 1024, "cuda": 8192}
COPY_BYTES = {"cpu": 64 * 1024**2, "cuda": 1024**3}  # past the caches: a copy this size streams memory
MIN_RUN_TIME_S = 0.2  # blocked_autorange's budget per yardstick
MIN_BLOCKS = 5  # a spread needs several blocks: a slow machine may fit fewer in the budget, so more are run


def _positive_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


@dataclass(frozen=True)
class Rate:
    """A measured rate's distribution over blocked_autorange's blocks: median, quartiles and block count."""

    median: float
    p25: float
    p75: float
    n: int

    def __post_init__(self) -> None:
        values = (self.p25, self.median, self.p75)
        if not all(_positive_number(v) for v in values):
            raise ValueError(f"a rate's median and quartiles must be finite and > 0, got {values}")
        if not self.p25 <= self.median <= self.p75:
            raise ValueError(f"a rate needs p25 <= median <= p75, got {values}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"a rate's n must be an integer >= 1, got {self.n!r}")

    @classmethod
    def of(cls, measurement: benchmark.Measurement, work: float) -> Rate:
        """`work` units per second over `measurement`'s blocks; a slow block is a low rate, so the
        rate's p25 is work over the time's p75 (quantiles as Measurement takes them: linear)."""
        q25, q50, q75 = (float(q) for q in np.quantile(np.asarray(measurement.times, dtype=float), [0.25, 0.5, 0.75]))
        if q25 <= 0:
            raise ValueError(f"a measured time must be > 0, got {q25}")
        return cls(median=work / q50, p25=work / q75, p75=work / q25, n=len(measurement.times))

    @classmethod
    def exact(cls, value: float) -> Rate:
        """A rate known without spread (a fixed yardstick, e.g. for tests)."""
        return cls(value, value, value, 1)

    def as_dict(self) -> dict:
        return {"median": self.median, "p25": self.p25, "p75": self.p75, "n": self.n}


@dataclass(frozen=True)
class Calibration:
    """One device's yardsticks: matmul TFLOP/s per dtype name, and copy GB/s (read plus write)."""

    device: str
    matmul_tflops: Mapping[str, Rate]
    copy_gbps: Rate
    matmul_size: int = 1024  # the square matmul's side
    copy_bytes: int = COPY_BYTES["cpu"]
    origin: str = field(default="given in code", compare=False)  # for error messages: where it came from

    def __post_init__(self) -> None:
        rates = dict(self.matmul_tflops) if isinstance(self.matmul_tflops, Mapping) else None
        if not isinstance(self.device, str) or rates is None or not all(isinstance(k, str) for k in rates):
            raise ValueError("device must be a string and matmul_tflops a mapping of dtype name -> rate")
        if not all(isinstance(r, Rate) for r in (*rates.values(), self.copy_gbps)):
            raise ValueError("matmul_tflops' values and copy_gbps must be Rates")
        sizes = (self.matmul_size, self.copy_bytes)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
            raise ValueError(f"matmul_size and copy_bytes must be positive integers, got {sizes}")
        # Shared by the whole process: read-only, so no caller can change another's peaks.
        object.__setattr__(self, "matmul_tflops", MappingProxyType(rates))

    def matmul(self, dtype: str) -> Rate:
        """The matmul rate for `dtype`; a ValueError, naming where this calibration came from, if it has none."""
        if dtype not in self.matmul_tflops:
            raise ValueError(f"the calibration for {self.device} ({self.origin}) has no {dtype} matmul rate")
        return self.matmul_tflops[dtype]

    def to_json(self) -> str:
        return json.dumps(_as_dict(self), indent=1)

    @classmethod
    def from_json(cls, text: str, origin: str = "JSON") -> Calibration:
        """The calibration `to_json` wrote; a ValueError saying what is wrong with anything else."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{origin}: not JSON ({exc.msg}, line {exc.lineno})") from None
        return _checked(data, origin)


def _as_dict(cal: Calibration) -> dict:
    return {
        "device": cal.device,
        "matmul_tflops": {dtype: rate.as_dict() for dtype, rate in cal.matmul_tflops.items()},
        "copy_gbps": cal.copy_gbps.as_dict(),
        "matmul_size": cal.matmul_size,
        "copy_bytes": cal.copy_bytes,
    }


def _checked(d: object, origin: str) -> Calibration:
    try:
        return _from_dict(d, origin)
    except (TypeError, KeyError, ValueError) as exc:
        message = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{origin}: not a calibration: {message}") from None


def _rate(d: object) -> Rate:
    if not isinstance(d, dict) or set(d) != {"median", "p25", "p75", "n"}:
        raise ValueError(f"a rate is {{median, p25, p75, n}}, got {d!r:.200}")
    return Rate(**d)


def _from_dict(d: object, origin: str) -> Calibration:
    if not isinstance(d, dict):
        raise ValueError("expected an object")
    matmul = d["matmul_tflops"]
    if not isinstance(matmul, dict):
        raise ValueError("matmul_tflops must be an object of dtype name -> rate")
    rates = {dtype: _rate(r) for dtype, r in matmul.items()}
    sizes = (d.get("matmul_size", 1024), d.get("copy_bytes", COPY_BYTES["cpu"]))
    return Calibration(d["device"], rates, _rate(d["copy_gbps"]), *sizes, origin=origin)


def to_json_all(calibrations: Iterable[Calibration]) -> str:
    """Several devices' calibrations in one file (a JSON list), as ATTENTION_PROFILER_CALIBRATION reads."""
    return json.dumps([_as_dict(c) for c in calibrations], indent=1)


# -- measuring ---------------------------------------------------------------------------------------


def measure_matmul(device: str, dtype: str, min_run_time: float = MIN_RUN_TIME_S) -> Rate:
    """TFLOP/s of one large square matmul on `device` (2n³ FLOPs per call), over blocked_autorange's blocks."""
    n = MATMUL_SIZE.get(device, 1024)
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(n, n, device=device, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, dtype=torch_dtype)
    timer = benchmark.Timer("a @ b", globals={"a": a, "b": b}, num_threads=torch.get_num_threads())
    measurement = _blocks(timer, min_run_time)
    del a, b
    _give_back(device)
    return Rate.of(measurement, 2 * n**3 / 1e12)


def measure_copy(device: str, min_run_time: float = MIN_RUN_TIME_S) -> Rate:
    """GB/s of one large tensor copy on `device`, counting its read and its write."""
    n = COPY_BYTES.get(device, COPY_BYTES["cpu"])
    src = torch.ones(n // 4, device=device)
    dst = torch.empty_like(src)
    timer = benchmark.Timer("dst.copy_(src)", globals={"src": src, "dst": dst}, num_threads=torch.get_num_threads())
    measurement = _blocks(timer, min_run_time)
    del src, dst
    _give_back(device)
    return Rate.of(measurement, 2 * n / 1e9)


def _blocks(timer: benchmark.Timer, min_run_time: float) -> benchmark.Measurement:
    """blocked_autorange's blocks, topped up to MIN_BLOCKS blocks of the same size."""
    first = timer.blocked_autorange(min_run_time=min_run_time)
    raw = list(first.raw_times)
    while len(raw) < MIN_BLOCKS:
        raw += timer.timeit(first.number_per_run).raw_times
    return benchmark.Measurement(first.number_per_run, raw, first.task_spec)


def measure(device: str, dtypes: Iterable[str] = ("float32",), min_run_time: float = MIN_RUN_TIME_S) -> Calibration:
    """A fresh calibration of `device`: the copy and a matmul per dtype, each measured now."""
    matmul = {dtype: measure_matmul(device, dtype, min_run_time) for dtype in dtypes}
    return Calibration(
        device, matmul, measure_copy(device, min_run_time), MATMUL_SIZE.get(device, 1024),
        COPY_BYTES.get(device, COPY_BYTES["cpu"]), origin="measured here",
    )  # fmt: skip


def _give_back(device: str) -> None:
    """Return the yardstick's cached GPU blocks to the driver: the app process measures its yardsticks
    for the run-time estimate, and the run's worker process needs that memory."""
    if device == "cuda":
        torch.cuda.empty_cache()


# -- the process's calibration -----------------------------------------------------------------------

_lock = threading.Lock()  # the app measures from request threads: one measurement per device, not one each
_injected: Calibration | None = None
_measured: dict[str, Calibration] = {}
_loaded: dict[tuple[str, int], dict[str, Calibration]] = {}  # (path, mtime) -> device -> calibration


def use(cal: Calibration | None) -> None:
    """Inject `cal` as the calibration of its device for this process (tests); None clears the injection."""
    global _injected
    if cal is not None and not isinstance(cal, Calibration):
        raise TypeError(f"use() takes a Calibration or None, got {type(cal).__name__}")
    _injected = cal


def current(device: str) -> Calibration:
    """This device's calibration: injected, else from ATTENTION_PROFILER_CALIBRATION, else measured once here."""
    if _injected is not None and _injected.device == device:
        return _injected
    from_file = _from_env().get(device)
    if from_file is not None:
        return from_file
    with _lock:
        if device not in _measured:
            _measured[device] = measure(device)
        return _measured[device]


def matmul_rate(device: str, dtype: str) -> Rate:
    """`device`'s matmul rate for `dtype`; a measured calibration measures a dtype it lacks once, on demand."""
    cal = current(device)
    if dtype in cal.matmul_tflops or cal is not _measured.get(device):
        return cal.matmul(dtype)  # an injected or loaded one without it raises, naming its origin
    with _lock:
        cal = _measured[device]
        if dtype not in cal.matmul_tflops:
            rates = {**cal.matmul_tflops, dtype: measure_matmul(device, dtype)}
            cal = _measured[device] = replace(cal, matmul_tflops=rates)
        return cal.matmul_tflops[dtype]


def _from_env() -> dict[str, Calibration]:
    """The calibrations in ATTENTION_PROFILER_CALIBRATION's file by device (read again when it changes)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return {}
    path = Path(raw)
    try:
        key = (str(path.resolve()), path.stat().st_mtime_ns)
        found = _loaded.get(key)
        if found is None:
            found = _read(path.read_text(encoding="utf-8"), f"{ENV}={raw}")
            _loaded.clear()  # only the file as it is now
            _loaded[key] = found
    except OSError as exc:
        raise ValueError(f"{ENV}={raw}: cannot read it ({exc.strerror or exc})") from None
    return found


def _read(text: str, origin: str) -> dict[str, Calibration]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{origin}: not JSON ({exc.msg}, line {exc.lineno})") from None
    items = data if isinstance(data, list) else [data]
    cals = [_checked(item, origin) for item in items]
    if not cals or len({c.device for c in cals}) != len(cals):
        raise ValueError(f"{origin}: expected one calibration per device, got devices {[c.device for c in cals]}")
    return {c.device: c for c in cals}
