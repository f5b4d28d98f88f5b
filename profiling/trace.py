"""Load any Chrome trace written by torch.profiler (Kineto) into one columnar event table.

The same reader serves our own runs and user uploads, so it is defensive: `profiling/reader.py`
streams the bytes into columns within hard limits, events with missing or wrong-typed fields are
skipped and counted, and category spellings of every Kineto vintage are normalised here, once.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pandas as pd

from profiling.admission import settle_read
from profiling.column_store import MISSING_VALUE
from profiling.event_texts import EventTexts, factorized_objects, recoded
from profiling.reader import (
    COLUMNS,
    MAX_INFLATED_BYTES,
    MAX_UPLOAD_BYTES,
    NUMERIC_ARGS,
    OBJECT_ARGS,
    Limits,
    Progress,
    RawTrace,
    TraceError,
    read_path,
    read_text,
)

__all__ = [
    "COLUMNS",
    "MAX_INFLATED_BYTES",
    "MAX_UPLOAD_BYTES",
    "NUMERIC_ARGS",
    "OBJECT_ARGS",
    "Trace",
    "TraceError",
    "load_trace",
    "parse_trace",
    "rows_of",
    "rows_where",
]

# Device-side activity: what a GPU ran. Kineto writes the same categories for CUDA and ROCm.
GPU_ACTIVITY = ("kernel", "gpu_memcpy", "gpu_memset")
# Host-side calls that put work on a device; their `correlation` id names that work. ROCm traces
# use these categories too: Kineto's roctracer wrapper types HIP API calls (`hipLaunchKernel`,
# `hipExtModuleLaunchKernel`, ...) as CUDA_RUNTIME (libkineto/src/RoctracerActivity.h). MTIA, XPU
# and PrivateUse1 backends write their own runtime/driver categories, read as these two below.
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
    # Kineto's ActivityType names for other accelerators (libkineto/include/ActivityType.h).
    ("mtia_runtime", "cuda_runtime", "Kineto MTIA_RUNTIME (Meta's MTIA)"),
    ("xpu_runtime", "cuda_runtime", "Kineto XPU_RUNTIME (Intel GPUs)"),
    ("xpu_driver", "cuda_driver", "Kineto XPU_DRIVER (Intel GPUs)"),
    ("privateuse1_runtime", "cuda_runtime", "Kineto PRIVATEUSE1_RUNTIME (out-of-tree backends)"),
    ("privateuse1_driver", "cuda_driver", "Kineto PRIVATEUSE1_DRIVER (out-of-tree backends)"),
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
# The 2021 spellings exactly as written (`Kernel`, `Runtime`, `Operator`, ...). In those traces a
# launch's `external id` is the op that made it; later, Kineto wrote the correlation id there.
KINETO_2021_SPELLINGS = frozenset(s for s, _, who in CATEGORY_SPELLINGS if who.startswith("torch 1.8-1.9"))
# torch.profiler's step marker; torch 1.8-1.9 recorded it as an `Operator`, later as a `user_annotation`.
STEP_PREFIX = "ProfilerStep#"
# The other `record_function` ranges torch itself opens, which torch 1.8-1.9 also recorded as an
# `Operator`: the optimizer's step and zero_grad, and the DataLoader's and DataPipe's next().
# Annotations, not ops (the TensorBoard plugin lists none of them as an op: node.py,
# `create_operator_node` and `is_operator_node`).
ANNOTATION_PREFIXES = (STEP_PREFIX, "Optimizer.", "enumerate(DataLoader)#", "enumerate(DataPipe)#")


if TYPE_CHECKING:
    from profiling.structure import Structure


@dataclass
class Derived:
    """What later stages compute from a trace once and reuse: one typed slot each, filled on first use
    by the module that owns it (`structure`, `step_breakdown`, `launches`)."""

    lanes: np.ndarray | None = None  # an integer per (pid, tid) lane, per event
    processes: np.ndarray | None = None  # an integer per pid, per event
    structure: Structure | None = None
    aten_rows: np.ndarray | None = None  # positions of the aten:: ops
    launch_work: tuple[np.ndarray, dict[str, np.ndarray]] | None = None  # launches' rows, the work each caused
    launch_owners: np.ndarray | None = None  # per event, the row of the op that made it (launches only)
    plugin_steps: pd.DataFrame | None = None
    attention: Any = None  # attention_found.AttentionFound: the fused kernels and unfused matches
    copy_table: pd.DataFrame | None = None  # copy_causes.copy_table: every copy with its cause
    factorized: dict[str, tuple[np.ndarray, pd.Index]] = field(default_factory=dict)  # column -> codes, values
    # windows.LaneTimes of a set of rows, by (id of the rows array, whether by process), with the array itself
    lane_times: dict[tuple[int, bool], tuple[np.ndarray, Any]] = field(default_factory=dict)
    # Whole-trace results that the summary and several insight rules each ask for (`per_trace`), by function.
    results: dict[str, Any] = field(default_factory=dict)


_Result = TypeVar("_Result")


def per_trace(compute: Callable[[Trace], _Result]) -> Callable[[Trace], _Result]:
    """`compute(trace)` once per trace, kept in `trace.derived.results`: the summary and three insight rules
    each read `gpu_metrics`, `launch_stats`, `idle_breakdown_us`, ... of the same trace. A dict result is
    handed out as a deep copy, so a caller that changes it changes no other caller's."""
    key = f"{compute.__module__}.{compute.__qualname__}"

    @functools.wraps(compute)
    def once(trace: Trace) -> _Result:
        results = trace.derived.results
        if key not in results:
            results[key] = compute(trace)
        value = results[key]
        return copy.deepcopy(value) if isinstance(value, dict) else value

    return once


@dataclass
class Trace:
    """A parsed trace: `events` has one row per usable event, in file order."""

    events: pd.DataFrame
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0
    source: str = "trace"
    spellings: frozenset[str] = frozenset()  # the categories as the file spells them, before normalising
    # `events.ts` and `end` are µs since this many µs: 0, or the first start's whole µs where the file
    # writes epoch µs with ns digits, which float64 cannot hold (`timestamps.Rebase`). Add it back to show
    # an absolute time; differences of times need nothing.
    ts_base_us: int = 0
    # (kind, pid, tid) -> name, from the `thread_name`, `process_name` and `process_labels` metadata events
    # (pid and tid as the event columns' text; tid "0" for a process): the timeline's lane names.
    lane_names: dict[tuple[str, str, str], str] = field(default_factory=dict)
    distinct_texts: int = 0  # distinct names, categories and lanes the reader kept (the memory admission counts)
    derived: Derived = field(default_factory=Derived, repr=False)

    @property
    def kineto_2021(self) -> bool:
        """Whether the file uses the 2021 spellings (torch 1.8-1.9), where `external id` names a launch's op."""
        return not self.spellings.isdisjoint(KINETO_2021_SPELLINGS)

    @property
    def python_spelled_2021(self) -> bool:
        """Whether the `python_function` rows were all `Python` in the file: torch 1.8-1.9's with_stack
        events, CPU work to the TensorBoard plugin (its PYTHON type), unlike today's `python_function`
        (PYTHON_FUNCTION, which it leaves out). A file with both spellings has lost which row was which."""
        spelled = {s.lower() for s in self.spellings}
        return "python" in spelled and "python_function" not in spelled

    def of_category(self, *categories: str) -> pd.DataFrame:
        return rows_where(self.events, self.texts.isin("cat", categories))

    @functools.cached_property
    def texts(self) -> EventTexts:
        """The text columns as codes, made once each (`isin` and `equals` by code, not by hashing strings)."""
        return EventTexts(self.events)

    @functools.cached_property
    def complete(self) -> pd.DataFrame:
        """Duration ("X") events: the ones with a start and an end.

        A copy of nearly every row: the analysis reads `complete_rows` and `complete_column`
        instead, and the views below select from `events` directly, so it is made only on demand.
        """
        return rows_of(self.events, self.complete_rows)

    @functools.cached_property
    def complete_rows(self) -> np.ndarray:
        """Positions in `events` of the duration ("X") events, ascending."""
        return np.flatnonzero(self.texts.equals("ph", "X"))

    @functools.cached_property
    def _complete_categories(self) -> np.ndarray:
        return self.events["cat"].to_numpy()[self.complete_rows]

    def complete_column(self, name: str) -> np.ndarray:
        """One column of `complete` as an array (the other columns are not copied).

        Only `cat` is kept, as every view below reads it; others are gathered again when asked (a
        few ms), so that a big trace does not hold a copy of each column the analysis once read.
        """
        if name == "cat":
            return self._complete_categories
        return self.events[name].to_numpy()[self.complete_rows]

    def complete_codes(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """Per complete event, the code of its `column` value (int32, -1 where missing), and the distinct
        values in order of first sight: `pd.factorize` of `complete_column(column)`, made once per trace."""
        factorized = self.derived.factorized
        if column not in factorized:
            codes, uniques = self.texts.of_rows(column, self.complete_rows)
            factorized[column] = codes.astype(np.int32), uniques  # a few thousand distinct values: int32 halves it
        return factorized[column]

    @functools.cached_property
    def _sorted_name_codes(self) -> tuple[np.ndarray, np.ndarray]:
        codes, uniques = self.complete_codes("name")
        # Compared as Python strings: a fixed-width copy (`astype(str)`) would take 4 bytes per character of
        # the longest name (MAX_NAME_CHARS) for every distinct name. Missing names are not among `uniques`.
        order = np.argsort(uniques, kind="stable")
        rank = np.empty(len(order) + 1, dtype=np.int32)
        rank[order], rank[-1] = np.arange(len(order), dtype=np.int32), -1  # code -1 (missing) reads the last
        return rank[codes], uniques[order]

    def _complete_where(self, categories: tuple[str, ...]) -> pd.DataFrame:
        """The complete events of `categories`, their names a Categorical (sorted, as `pd.Categorical` makes it).

        The kernel and GPU frames are grouped by name a dozen times (tables, GPU metrics, insights); a
        Categorical is grouped by its integer codes, made once here from the trace's one factorization of
        names, instead of hashing every name again each time (40x faster per group-by)."""
        selected = self.texts.isin("cat", categories, self.complete_rows)
        frame = rows_of(self.events.drop(columns="name"), self.complete_rows[selected])  # names: codes below
        codes, names = self._sorted_name_codes
        name = pd.Categorical.from_codes(codes[selected], categories=names).remove_unused_categories()
        frame.insert(self.events.columns.get_loc("name"), "name", name)
        return frame

    @functools.cached_property
    def gpu_activity(self) -> pd.DataFrame:
        return self._complete_where(GPU_ACTIVITY)

    @functools.cached_property
    def kernels(self) -> pd.DataFrame:
        return self._complete_where(("kernel",))

    @functools.cached_property
    def annotations(self) -> pd.DataFrame:
        """CPU-side `user_annotation` duration events (record_function ranges, profiler steps)."""
        return self._complete_where(("user_annotation",))

    @property
    def devices(self) -> list[str]:
        """Names of the devices that ran something; else those the trace describes; else `cpu`.

        Kernel devices find their `deviceProperties` entry as the GPU metrics do (`profiling.devices`):
        a ROCm kernel on device 2 is named by the one entry, id 0, of the GPU the process saw."""
        from profiling.devices import device_names  # devices.py reads a Trace: imported here, not at the top

        return device_names(self)


def rows_of(frame: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """`frame.iloc[rows]`, where a numeric or object column that is missing in every row taken (NaN, None) is
    that missing value repeated by a zero stride: no memory.

    Most args columns are empty for most kinds of event (a kernel has no `Input Dims`, an op no `grid`), and
    the reader leaves a column that no event filled as such a repeat (`column_store.Columns.arrays`): the frames
    of ops and kernels of a big trace would otherwise spend a third of their bytes on missing values. Taken
    a column at a time, so a frame's columns are never all copied at once before the empty ones are dropped."""
    size = len(rows)
    index = frame.index[rows]
    columns: dict[str, Any] = {}
    for name, column in frame.items():
        if not isinstance(column.dtype, np.dtype):  # text: pandas' own array
            columns[name] = column.array.take(rows)
            continue
        values = column.to_numpy()
        if len(values) > 1 and values.strides == (0,):  # a repeat already
            columns[name] = pd.Series(np.broadcast_to(values[:1].reshape(()), (size,)), index=index, copy=False)
            continue
        taken = values[rows]
        # The first row tells most columns apart before a pass over all of them: a full pass of `isna` over
        # each object column was a tenth of the frames' cost.
        if size > 1 and values.dtype.kind in MISSING_VALUE and pd.isna(taken[:1])[0] and pd.isna(taken).all():
            taken = np.broadcast_to(MISSING_VALUE[values.dtype.kind].astype(values.dtype), (size,))
        # Typed as the source column: a bare object array of texts and None would be inferred as `str`, None as NaN.
        columns[name] = pd.Series(taken, index=index, dtype=values.dtype, copy=False)
    return pd.DataFrame(columns, index=index, copy=False)


def codes_of(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """`pd.factorize(column.to_numpy())`: per row the code of its value (-1 where missing), and the distinct
    values in order of first sight; a Categorical's from its integer codes, without hashing its texts."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return pd.factorize(column.to_numpy())
    return recoded(column.cat.codes.to_numpy(), column.cat.categories.to_numpy(dtype=object))


def rows_where(frame: pd.DataFrame, mask: np.ndarray | pd.Series) -> pd.DataFrame:
    """`frame[mask]` as `rows_of` takes rows: a column missing in every row kept costs no memory."""
    return rows_of(frame, np.flatnonzero(np.asarray(mask, dtype=bool)))


def load_trace(path: str | Path, progress: Progress | None = None, **limits: int) -> Trace:
    """Read a `.json` or `.json.gz` Chrome trace from disk; `limits` override fields of `reader.Limits`.

    `progress(fraction, message)` hears the bytes read out of the file's size as it streams. In the server's
    analysis process the read then asks for the memory its analysis needs (`admission.settle_read`).
    """
    path = Path(path)
    trace = _trace(read_path(path, Limits(**limits), progress), source=path.name)
    settle_read(trace, path)
    return trace


def parse_trace(data: bytes, source: str = "trace", **limits: int) -> Trace:
    """Parse Chrome-trace JSON text (or its gzip): an object with `traceEvents`, or a bare list of events."""
    return _trace(read_text(data, Limits(**limits), source), source=source)


def _trace(raw: RawTrace, source: str) -> Trace:
    spellings, canonical = canonical_categories(raw.columns["cat"], raw.columns["name"])
    # The columns are ours: no second copy. The categories are respelled before the frame infers their type: once,
    # where a respelled Series, masked and set into the frame, took 0.43 s of a 1 GiB trace's frame, against 0.34.
    events = pd.DataFrame(raw.columns | {"cat": canonical}, columns=COLUMNS, copy=False)
    properties = device_properties(raw.metadata.get("deviceProperties"))
    return Trace(
        events=events,
        device_properties=properties,
        metadata=raw.metadata,
        skipped=raw.skipped,
        source=source,
        spellings=spellings,
        ts_base_us=raw.ts_base_us,
        lane_names=raw.lane_names,
        distinct_texts=raw.distinct_texts,
    )


def canonical_categories(cat: np.ndarray, name: np.ndarray) -> tuple[frozenset[str], np.ndarray]:
    """The categories as the file spells them (a handful per trace, missing left out), and each event's in
    today's spelling (CATEGORY_SPELLINGS), a step recorded as an op made an annotation; from the reader's object
    columns (None where missing).

    Each distinct category is respelled once and taken per event by its code: a dict lookup per event
    (`Series.map`) cost a fifth of a second per million events."""
    codes, distinct = factorized_objects(cat)
    respelled = np.array([*(_CANONICAL_CATEGORY.get(c.lower(), c) for c in distinct), None], dtype=object)
    canonical = respelled[codes]  # code -1 (missing) reads None
    # The analysis finds steps and torch's own ranges among user annotations, as torch >= 1.10 records them.
    # The prefixes are tested once per distinct name of the ops, not per event (a string method per event
    # cost a tenth of a second per 300k events).
    ops = np.flatnonzero(np.append(respelled == "cpu_op", False)[codes])
    op_codes, names = factorized_objects(np.asarray(name, dtype=object)[ops])  # a missing name is -1
    prefixed = [isinstance(n, str) and n.startswith(ANNOTATION_PREFIXES) for n in names]
    canonical[ops[np.array([*prefixed, False], dtype=bool)[op_codes]]] = "user_annotation"
    return frozenset(distinct), canonical


def device_properties(value: Any) -> list[dict[str, Any]]:
    """`deviceProperties`, checked: a list of objects whose `id`, where given, is a whole number."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise TraceError(f"trace: `deviceProperties` must be a list of objects, got {type(value).__name__}")
    for i, device in enumerate(value):
        if not isinstance(device, dict):
            raise TraceError(f"trace: `deviceProperties[{i}]` must be an object, got {type(device).__name__}")
        if "id" in device and type(device["id"]) is not int:
            raise TraceError(f"trace: `deviceProperties[{i}].id` must be a whole number, got {device['id']!r:.40}")
    return value
