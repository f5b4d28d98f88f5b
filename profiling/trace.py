"""Load any Chrome trace written by torch.profiler (Kineto) into one columnar event table.

The same reader serves our own runs and user uploads, so it is defensive: gzip is inflated
in a stream with a hard limit, and events with missing or wrong-typed fields are skipped
and counted instead of crashing the analysis.
"""

from __future__ import annotations

import gc
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

try:  # orjson parses traces several times faster; the stdlib keeps the CLI working without it
    import orjson

    _loads, _JSONError = orjson.loads, orjson.JSONDecodeError
except ImportError:  # pragma: no cover - exercised on bare GPU images
    import json

    _loads, _JSONError = json.loads, json.JSONDecodeError  # type: ignore[assignment]

MAX_FILE_BYTES = 100 * 1024**2  # on disk, compressed or not
MAX_JSON_BYTES = 400 * 1024**2  # after inflating; a gzip bomb stops here
CHUNK_BYTES = 1024**2

# Device-side activity: what a GPU ran. Kineto writes the same categories for CUDA and ROCm.
GPU_ACTIVITY = ("kernel", "gpu_memcpy", "gpu_memset")
# Host-side calls that put work on a device; their `correlation` id names that work. ROCm traces
# use these categories too: Kineto's roctracer wrapper types HIP API calls (`hipLaunchKernel`,
# `hipExtModuleLaunchKernel`, ...) as CUDA_RUNTIME (libkineto/src/RoctracerActivity.h).
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")

# Every category spelling Kineto has written, as (spelling, canonical name, who writes it). The
# lookup ignores case, as the TensorBoard plugin's does (tb_plugin/torch_tb_profiler/profiler/
# trace.py, EventTypeMap). Categories not listed here are kept as written.
CATEGORY_SPELLINGS: tuple[tuple[str, str, str], ...] = (
    ("Kernel", "kernel", "torch 1.8-1.9 (Kineto 2021)"),
    ("kernel", "kernel", "torch >= 1.10"),
    ("Memcpy", "gpu_memcpy", "torch 1.8-1.9"),
    ("gpu_memcpy", "gpu_memcpy", "torch >= 1.10"),
    ("Memset", "gpu_memset", "torch 1.8-1.9"),
    ("gpu_memset", "gpu_memset", "torch >= 1.10"),
    ("Runtime", "cuda_runtime", "torch 1.8-1.9"),
    ("cuda_runtime", "cuda_runtime", "torch >= 1.10; ROCm builds too (hip* names)"),
    ("Driver", "cuda_driver", "the 1.8-1.9 style for driver calls; no such trace seen (no driver activity then)"),
    ("cuda_driver", "cuda_driver", "torch >= 2.1 (Triton's cuLaunchKernel)"),
    ("hip_runtime", "cuda_runtime", "not written by Kineto; third-party ROCm converters"),
    ("hip_driver", "cuda_driver", "not written by Kineto; third-party ROCm converters"),
    ("Operator", "cpu_op", "torch 1.8-1.9"),
    ("cpu_op", "cpu_op", "torch >= 1.10"),
    ("Python", "python_function", "torch 1.8-1.9 (with_stack)"),
    ("python_function", "python_function", "torch >= 1.10"),
    ("user_annotation", "user_annotation", "torch >= 1.10 (record_function, ProfilerStep#N)"),
    ("gpu_user_annotation", "gpu_user_annotation", "torch >= 1.10 (record_function on the GPU lane)"),
    ("async", "ac2g", "torch 1.8-1.9 launch flow arrows (ph s/f, name `launch`)"),
    ("ac2g", "ac2g", "torch >= 1.10 launch flow arrows"),
    ("cuda_sync", "cuda_sync", "torch >= 2.2 (cudaStreamSynchronize and friends)"),
    ("cpu_instant_event", "cpu_instant_event", "torch >= 1.10 ([memory] and other instants)"),
)
_CANONICAL_CATEGORY = {spelling.lower(): canonical for spelling, canonical, _ in CATEGORY_SPELLINGS}
# torch.profiler's step marker; torch 1.8-1.9 recorded it as an `Operator`, later as a `user_annotation`.
STEP_PREFIX = "ProfilerStep#"
# args key spellings: the older one on the left (torch 1.8-1.9), the one the analysis reads on the right.
ARG_SPELLINGS = {"external id": "External id", "Input dims": "Input Dims"}

# args keys lifted into columns, with their column names: the only ones the analysis reads.
NUMERIC_ARGS = {
    "correlation": "correlation",
    "External id": "external_id",
    "stream": "stream",
    "device": "device",
    "registers per thread": "registers",
    "shared memory": "shared_memory",
    "est. achieved occupancy %": "occupancy",
    "blocks per SM": "blocks_per_sm",
    "bytes": "bytes",
    "Total Allocated": "total_allocated",
    "Bytes": "alloc_bytes",
    "Device Type": "device_type",
}
OBJECT_ARGS = {"grid": "grid", "block": "block", "Input Dims": "input_dims", "Input type": "input_type"}
COLUMNS = ["name", "cat", "ph", "ts", "dur", "end", "pid", "tid", *NUMERIC_ARGS.values(), *OBJECT_ARGS.values()]


class TraceError(ValueError):
    """A trace that cannot be read. The message says what is wrong and what is allowed."""


@dataclass
class Trace:
    """A parsed trace: `events` has one row per usable event, in file order."""

    events: pd.DataFrame
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0
    source: str = "trace"
    cache: dict[str, Any] = field(default_factory=dict, repr=False)  # derived structures, computed once

    def _cached(self, key: str, make: Any) -> pd.DataFrame:
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def of_category(self, *categories: str) -> pd.DataFrame:
        return self.events[self.events["cat"].isin(categories)]

    @property
    def complete(self) -> pd.DataFrame:
        """Duration ("X") events: the ones with a start and an end."""
        return self._cached("complete", lambda: self.events[self.events["ph"] == "X"])

    @property
    def gpu_activity(self) -> pd.DataFrame:
        return self._cached("gpu", lambda: self.complete[self.complete["cat"].isin(GPU_ACTIVITY)])

    @property
    def kernels(self) -> pd.DataFrame:
        return self._cached("kernels", lambda: self.complete[self.complete["cat"] == "kernel"])

    @property
    def devices(self) -> list[str]:
        """Names of the devices that ran something; else those the trace describes; else `cpu`."""
        names = {int(p.get("id", i)): str(p.get("name", f"device {i}")) for i, p in enumerate(self.device_properties)}
        ids = sorted(int(d) for d in self.gpu_activity["device"].dropna().unique())
        found = [names.get(i, f"device {i}") for i in ids] or list(names.values())
        # Eight identical GPUs in deviceProperties are one kind of device to the reader.
        return list(dict.fromkeys(found)) or ["cpu"]


def read_bytes(path: str | Path, max_file_bytes: int = MAX_FILE_BYTES, max_json_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The trace's JSON text, inflating gzip in a stream that stops at `max_json_bytes`."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceError(f"trace: cannot read {path.name}: {exc.strerror}") from None
    if size > max_file_bytes:
        raise TraceError(
            f"trace: the file is {size / 1024**2:.1f} MiB; the limit is {max_file_bytes / 1024**2:.0f} MiB"
        )
    with path.open("rb") as f:
        head = f.read(2)
        f.seek(0)
        if head != b"\x1f\x8b":
            return f.read()
        return _inflate(f, max_json_bytes)


def _inflate(f: Any, limit: int) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    try:
        while chunk := f.read(CHUNK_BYTES):
            # max_length bounds each step, so a bomb never inflates past the limit in memory.
            data = chunk
            while data:
                out += inflater.decompress(data, limit + 1 - len(out))
                if len(out) > limit:
                    raise TraceError(
                        f"trace: inflates to more than {limit / 1024**2:.0f} MiB of JSON (the limit); "
                        "is it a gzip bomb? Trim the trace or profile fewer steps"
                    )
                data = inflater.unconsumed_tail
            if inflater.eof:
                break
    except zlib.error as exc:
        raise TraceError(f"trace: the gzip data is corrupt ({exc})") from None
    if not inflater.eof:
        raise TraceError("trace: the gzip file is truncated; upload the whole .json.gz")
    return bytes(out)


@contextmanager
def _no_gc() -> Any:
    # Parsing builds millions of small objects and no cycles; the cyclic collector would
    # rescan them again and again and make parse time grow faster than the trace.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_trace(path: str | Path, **limits: int) -> Trace:
    """Read a `.json` or `.json.gz` Chrome trace from disk."""
    return parse_trace(read_bytes(path, **limits), source=Path(path).name)


def parse_trace(data: bytes, source: str = "trace") -> Trace:
    """Parse Chrome-trace JSON text: an object with `traceEvents`, or a bare list of events."""
    with _no_gc():
        try:
            document = _loads(data)
        except (_JSONError, UnicodeDecodeError) as exc:
            raise TraceError(f"trace: {source} is not valid JSON ({exc})") from None
        return _document_to_trace(document, source)


def _document_to_trace(document: Any, source: str) -> Trace:
    if isinstance(document, list):
        raw_events, metadata = document, {}
    elif isinstance(document, dict):
        if "traceEvents" not in document:
            raise TraceError(f"trace: {source} is JSON but has no `traceEvents`; is it a torch.profiler trace?")
        raw_events = document["traceEvents"]
        metadata = {k: v for k, v in document.items() if k != "traceEvents"}
        if not isinstance(raw_events, list):
            raise TraceError(f"trace: `traceEvents` must be a list, got {type(raw_events).__name__}")
    else:
        raise TraceError(f"trace: {source} must hold a JSON object or list, got {type(document).__name__}")
    properties = metadata.get("deviceProperties")
    properties = [p for p in properties if isinstance(p, dict)] if isinstance(properties, list) else []
    events, skipped = _event_table(raw_events)
    return Trace(events=events, device_properties=properties, metadata=metadata, skipped=skipped, source=source)


def _event_table(raw_events: list[Any]) -> tuple[pd.DataFrame, int]:
    dicts = [e for e in raw_events if type(e) is dict]
    skipped = len(raw_events) - len(dicts)
    frame = pd.DataFrame(dicts, columns=["name", "cat", "ph", "ts", "dur", "pid", "tid", "args"])
    for column in ("name", "cat", "ph"):
        good = frame[column].map(type).eq(str)
        frame[column] = frame[column].where(good, "")
    frame["cat"] = canonical_categories(frame["cat"], frame["name"])
    frame["ts"] = _numeric(frame["ts"])
    frame["dur"] = _numeric(frame["dur"])
    is_complete = frame["ph"].eq("X")
    # Metadata ("M") events carry no time; every other usable event needs a finite start,
    # and a duration event also a non-negative duration.
    usable = frame["ph"].eq("M") | (frame["ts"].notna() & (~is_complete | frame["dur"].ge(0)))
    usable &= frame["name"].ne("") | ~is_complete
    skipped += int((~usable).sum())
    frame = frame[usable].reset_index(drop=True)
    frame["dur"] = frame["dur"].where(frame["ph"].eq("X"), 0.0).fillna(0.0)
    frame["end"] = frame["ts"] + frame["dur"]
    for column in ("pid", "tid"):
        frame[column] = frame[column].map(_lane_id).astype(str)  # str even when empty
    args = pd.DataFrame(
        [_respelled(a) if type(a) is dict else {} for a in frame["args"]],
        columns=[*NUMERIC_ARGS, *OBJECT_ARGS],
    )
    for key, column in NUMERIC_ARGS.items():
        frame[column] = _numeric(args[key]).to_numpy()
    for key, column in OBJECT_ARGS.items():
        frame[column] = args[key].to_numpy()
    return frame[COLUMNS], skipped


def canonical_categories(cat: pd.Series, name: pd.Series) -> pd.Series:
    """Categories in today's spelling (CATEGORY_SPELLINGS); a step recorded as an op becomes an annotation."""
    unique = pd.unique(cat)  # a handful of spellings per trace: look each up once
    mapping = {c: _CANONICAL_CATEGORY.get(c.lower(), c) for c in unique}
    canonical = cat.map(mapping)
    # The analysis finds profiler steps among user annotations, as torch >= 1.10 records them.
    is_step = canonical.eq("cpu_op") & name.str.startswith(STEP_PREFIX)
    return canonical.mask(is_step, "user_annotation")


def _respelled(args: dict[str, Any]) -> dict[str, Any]:
    # Only old traces carry an old spelling; the current one wins where both appear.
    for old, new in ARG_SPELLINGS.items():
        if old in args and new not in args:
            args = {**args, new: args[old]}
    return args


def _numeric(column: pd.Series) -> pd.Series:
    # Booleans and strings are not times or ids: coerce them to NaN rather than to 1 or 0.
    kind = column.map(type)
    ok = kind.isin((int, float))
    return pd.to_numeric(column.where(ok), errors="coerce").astype("float64").replace([np.inf, -np.inf], np.nan)


def _lane_id(value: Any) -> str:
    return str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else "?"
