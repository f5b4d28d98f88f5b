"""Events into numpy columns: step 4 of the reader (profiling/reader.py), the same for every parser.

A batch of events arrives as `Rows` (dicts from orjson or the stdlib, or typed Structs from msgspec,
profiling/decode.py); `block_of` turns it into a `Block` without touching any shared state, so a
worker process can build it; `Columns.append` (profiling/column_store.py) then interns its strings
and object args (one object per distinct value) and appends it. Only the fields and `args` keys the
analysis reads are kept, and names are cut to `MAX_NAME_CHARS` (profiling/names.py) before anything else sees them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from profiling.lane_names import LaneNames, lane_names
from profiling.names import cut_name
from profiling.timestamps import MAX_TIME_US

try:  # orjson parses several times faster; the stdlib keeps the CLI working on a bare torch install
    import orjson

    _loads: Callable[[Any], Any] = orjson.loads
    _dumps: Callable[[Any], bytes] = orjson.dumps
    _JSONError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - exercised by tests/test_layering.py in a child without orjson
    _loads = json.loads
    _JSONError = json.JSONDecodeError

    def _dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()


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
    # float64 keeps integers exactly up to 2**53: a Linux address (user space is below 2**47, CUDA's
    # allocator maps there too) and Python ids (addresses, or small counters) stay exact; memory_view
    # pairs allocations and frees by this value, so a larger one could merge two addresses there.
    "Total Reserved": "total_reserved",
    "Device Id": "device_id",
    "Addr": "addr",
    "Python id": "python_id",
    "Python parent id": "python_parent_id",
    "Python module id": "python_module_id",
    # A collective kernel's message (torch >= 2.1 with record_shapes): its bytes, for a job's bandwidth table.
    "In msg nelems": "in_msg_nelems",
    "Out msg nelems": "out_msg_nelems",
}
OBJECT_ARGS = {
    "grid": "grid",
    "block": "block",
    "Input Dims": "input_dims",
    "Input type": "input_type",
    "Concrete Inputs": "concrete_inputs",  # scalar arguments as text (torch >= 2.1): SDPA's is_causal
    "dtype": "msg_dtype",  # a collective's element type ("BFloat16"), beside its nelems above
}
# args key spellings: the one the analysis reads, and the older one (torch 1.8-1.9) read where it is missing.
OLD_ARG_SPELLINGS = {"External id": "external id", "Input Dims": "Input dims"}
TEXT_FIELDS = ("name", "cat", "ph")
# Names are cut here, once per distinct name, so no regex, cache, groupby or table downstream ever
# sees more than MAX_NAME_CHARS of one (profiling/names.py).
_TEXT_CUTS: dict[str, Callable[[str], str]] = {"name": cut_name}
COLUMNS = ["name", "cat", "ph", "ts", "dur", "end", "pid", "tid", *NUMERIC_ARGS.values(), *OBJECT_ARGS.values()]
_OBJECT_COLUMNS = {*TEXT_FIELDS, "pid", "tid", *OBJECT_ARGS.values()}
_NONE = type(None)
# Value types whose batch takes the vectorised path (exact type: a bool is not an int here, as
# JSON's true is not a number); any other type in a batch sends that field to the per-value path.
_PLAIN_NUMBERS = frozenset({int, float, _NONE})
_PLAIN_TEXTS = frozenset({str, _NONE})
# int and str never compare equal, so one hash table tells them apart; 1 and 1.0 (and True) would not.
_PLAIN_LANES = frozenset({int, str, _NONE})
_LANE_TYPES = (str, int, float)
_EMPTY: dict[str, Any] = {}
# One object-arg column of a batch: each row's index into the batch's distinct values (-1: none),
# those values as compact JSON (the key they are shared by) and as parsed (None: not sent, `Block.__getstate__`).
ObjectColumn = tuple[np.ndarray, list[bytes], list[Any] | None]
# One text column of a batch: each row's index into its distinct texts (the last is the missing text).
TextColumn = tuple[np.ndarray, list[str]]


class Rows(Protocol):
    """A batch of events as some parser left them; what `block_of` reads of it."""

    def __len__(self) -> int: ...

    def field(self, key: str) -> list[Any]:
        """The top-level field `key` of each event (None where missing)."""
        ...

    def numbers(self, key: str) -> np.ndarray:
        """The numeric args key `key` of each event as float64 (`_numbers`), its old spelling where it is
        missing or null."""
        ...

    def objects(self, key: str) -> ObjectColumn:
        """The object args key `key` of each event, its old spelling where it is missing or null."""
        ...

    def arg_values(self, key: str) -> list[Any]:
        """The args key `key` of each event as parsed (None where missing); read only for metadata events."""
        ...

    def take(self, rows: list[int]) -> Rows:
        """These rows only, in this order."""
        ...


class DictRows:
    """Events parsed into dicts (orjson or the stdlib): the reference every other parser must match."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self._args: list[dict[str, Any]] | None = None
        self._present: set[str] | None = None

    def __len__(self) -> int:
        return len(self.events)

    def field(self, key: str) -> list[Any]:
        return [e.get(key) for e in self.events]

    def take(self, rows: list[int]) -> DictRows:
        return DictRows([self.events[i] for i in rows])

    def _wanted(self, key: str) -> bool:
        # Only keys some event of the batch has are gathered (one C-level pass over the keys);
        # a kernel-free batch skips the kernel keys, and so on.
        if self._args is None:
            self._args = [a if type(a) is dict else _EMPTY for a in self.field("args")]
            self._present = set().union(*self._args)
        return key in self._present or OLD_ARG_SPELLINGS.get(key) in self._present  # type: ignore[operator]

    def numbers(self, key: str) -> np.ndarray:
        if not self._wanted(key):
            return np.full(len(self), math.nan)
        return _numbers(_arg_values(self._args, key))  # type: ignore[arg-type]

    def objects(self, key: str) -> ObjectColumn:
        if not self._wanted(key):
            return np.full(len(self), -1, np.intp), [], []
        return object_codes(_arg_values(self._args, key))  # type: ignore[arg-type]

    def arg_values(self, key: str) -> list[Any]:
        return [a.get(key) if type(a) is dict else None for a in self.field("args")]


def object_codes(values: list[Any]) -> ObjectColumn:
    """Parsed values (None: missing) as an ObjectColumn: each distinct value once, by its compact JSON."""
    codes = np.full(len(values), -1, np.intp)
    present = [i for i, value in enumerate(values) if value is not None]
    if not present:
        return codes, [], []
    given = [values[i] for i in present]
    keys = list(map(_dumps, given))
    index: dict[bytes, int] = {}
    distinct: list[Any] = []
    for key, value in zip(keys, given, strict=True):
        if key not in index:
            index[key] = len(distinct)
            distinct.append(value)
    codes[present] = np.fromiter(map(index.__getitem__, keys), np.intp, count=len(keys))
    return codes, list(index), distinct


@dataclass
class Block:
    """One batch's usable events as columns, built without the reader's shared state."""

    seen: int  # elements of the batch, usable or not
    skipped: int
    rows: int
    texts: dict[str, TextColumn]
    numbers: dict[str, np.ndarray | None]  # None: missing in every row (a block from the helper, below)
    objects: dict[str, ObjectColumn]
    lane_names: LaneNames = field(default_factory=dict)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (from the decode helper, profiling/reader_pool.py) in half the bytes of its arrays:
        - without the object args' parsed values: the reader holds a value for nearly every key already, as a
          trace repeats its shapes every step, and unpickling them was two thirds of a block's cost; `Columns`
          parses the keys it has not seen;
        - a numeric column missing in every row as None (most args are: a kernel has no `Addr`), which
          `Columns` reads as missing, as it reads such a column;
        - codes as int32 (a batch holds far fewer than 2**31 distinct values)."""
        state = self.__dict__.copy()
        state["texts"] = {name: (codes.astype(np.int32), texts) for name, (codes, texts) in self.texts.items()}
        state["numbers"] = {name: _unless_missing(values) for name, values in self.numbers.items()}
        objects = self.objects.items()
        state["objects"] = {name: (codes.astype(np.int32), keys, None) for name, (codes, keys, _) in objects}
        return state


def _unless_missing(values: np.ndarray | None) -> np.ndarray | None:
    return None if values is None or np.isnan(values).all() else values


def block_of(rows: Rows, seen: int, base: int = 0, absolute: bool = False) -> Block:
    """The usable rows of a batch of `seen` elements (`rows`: its objects) as columns.

    `ts` are relative to `base` µs (rewritten so by `Rebase`), or `absolute` as the file wrote them."""
    names = {field: _texts(rows.field(field), _TEXT_CUTS.get(field, str)) for field in TEXT_FIELDS}
    ph = _decoded(names["ph"])
    ts, dur = _times(rows.field("ts"), 0 if absolute else base), _times(rows.field("dur"))
    if absolute and base:
        ts -= base
    keep, numbers = usable(names, ph, ts, dur)
    if len(keep) < len(rows):
        rows = rows.take(keep.tolist())
        names = {field: (codes[keep], texts) for field, (codes, texts) in names.items()}
    names |= {lane: _lanes(rows.field(lane)) for lane in ("pid", "tid")}
    numbers |= {column: rows.numbers(key) for key, column in NUMERIC_ARGS.items()}
    objects = {column: rows.objects(key) for key, column in OBJECT_ARGS.items()}
    lanes = lane_names(rows, names, np.flatnonzero(ph[keep] == "M"))
    return Block(seen, seen - len(keep), len(keep), names, numbers, objects, lanes)


def usable(
    names: dict[str, TextColumn], ph: np.ndarray, ts: np.ndarray, dur: np.ndarray
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The rows of a batch the analysis can use, and their times ("ts", "dur", "end"), from each row's texts,
    `ph` and times (NaN: missing): every block is cut by this one rule, whichever decoder read it."""
    complete, metadata = ph == "X", ph == "M"
    # Metadata ("M") events carry no time; every other usable event needs a finite start, and a
    # duration event also a non-negative duration and a name.
    keep = np.flatnonzero(metadata | (~np.isnan(ts) & (~complete | ((dur >= 0) & (_decoded(names["name"]) != "")))))
    if len(keep) < len(ts):
        ts, dur, complete = ts[keep], dur[keep], complete[keep]
    dur = np.where(complete, dur, 0.0)
    return keep, {"ts": ts, "dur": dur, "end": ts + dur}


def _decoded(column: TextColumn, at: np.ndarray | None = None) -> np.ndarray:
    """The column's texts, of the rows `at` only where given."""
    codes, texts = column
    return np.array(texts, dtype=object)[codes if at is None else codes[at]]


def _texts(values: list[Any], text: Callable[[str], str]) -> TextColumn:
    try:
        distinct = dict.fromkeys(values)
        # No value of another type equals a string: the distinct values' types tell whether all are text.
        plain = set(map(type, distinct)) <= _PLAIN_TEXTS
    except TypeError:  # a list or an object: unhashable
        plain = False
    if not plain:  # numbers, bools, lists: only strings are names
        values = [v if type(v) is str else None for v in values]
        distinct = dict.fromkeys(values)
    return _coded(values, distinct, "", text)


def _lanes(values: list[Any]) -> TextColumn:
    # A lane is its id's text: 1 and 1.0 are different lanes, as their text says. A bool or a
    # container is no lane ("?"). Every value's type is checked: 1.0 and True equal 1, so the distinct
    # values would hide them.
    if not set(map(type, values)) <= _PLAIN_LANES:
        values = [str(v) if type(v) in _LANE_TYPES else None for v in values]
    return _coded(values, dict.fromkeys(values), "?", str)


def _coded(values: list[Any], distinct: dict[Any, None], missing: str, text: Callable[[Any], str]) -> TextColumn:
    """Codes into the `distinct` values (their texts by `text`, in order of first appearance), `missing` last,
    for None. A dict, not `pd.factorize`: the values are hashed once, and no object array is built (half the
    time on real batches, docs/benchmarks.md)."""
    distinct.pop(None, None)
    code = {value: at for at, value in enumerate(distinct)}
    code[None] = -1
    codes = np.fromiter(map(code.__getitem__, values), np.intp, count=len(values))
    return codes, [*map(text, distinct), missing]


def _arg_values(args: list[dict[str, Any]], key: str) -> list[Any]:
    old = OLD_ARG_SPELLINGS.get(key)
    if old is None:
        return [a.get(key) for a in args]
    return [value if (value := a.get(key)) is not None else a.get(old) for a in args]


def _numbers(values: list[Any]) -> np.ndarray:
    """float64, NaN where missing, not a number (a bool, a string) or infinite."""
    out = None
    if set(map(type, values)) <= _PLAIN_NUMBERS:  # the common case: numbers and None (NaN) only
        try:
            out = np.array(values, dtype=np.float64)
        except OverflowError:  # an integer past float64's range
            out = None
    if out is None:
        out = np.array([_float(v) if type(v) is int or type(v) is float else math.nan for v in values], np.float64)
    return _finite(out)


def _plain_numbers(values: Sequence[float | None]) -> np.ndarray:
    """`_numbers` of values known to be floats or None (a typed decoder's), with no check of each value's type."""
    return _finite(np.array(values, dtype=np.float64))


def _finite(out: np.ndarray) -> np.ndarray:
    out[np.isinf(out)] = np.nan
    return out


def _times(values: list[Any], base: int = 0) -> np.ndarray:
    """Microseconds since `base`; NaN past MAX_TIME_US from 0, so `ts + dur` and every difference of times
    stay finite."""
    return within_time_range(_numbers(values), base)


def within_time_range(times: np.ndarray, base: int = 0) -> np.ndarray:
    """`times` (µs since `base`, changed in place), NaN past MAX_TIME_US from 0."""
    times[np.abs(times + base) > MAX_TIME_US] = np.nan
    return times


def _float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer past float64's range
        return math.nan
