"""The typed decoder: a batch of events straight into Structs of only the fields the analysis reads.

msgspec decodes each event into an `_Event` (no dict per event or per `args`), skips every other key
without building it, and keeps the nested args (`Input Dims`, `grid`, ...) as raw JSON bytes
(`msgspec.Raw`), parsed once per distinct value. The schema is strict where the reference reader
(orjson into dicts, profiling/columns.py `DictRows`) is lenient: a value of any type it does not
take plainly (a bool or a string where a number goes, an integer past int64, a list where text goes,
an element that is no object, a null `args`) fails validation, and that batch is read by the
reference instead. So every odd value reads exactly as the reference reads it, and real traces take
the fast path (measured: no batch of tests/data, tests/data/gpu or the replicas falls back).

Known difference, kept: a number past float64's range (`1e400`) in a key the analysis does not read
is skipped here, where orjson refuses the whole document (the stdlib reads it as infinity).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import is_not
from typing import Annotated, Any

import numpy as np

from profiling.columns import (
    NUMERIC_ARGS,
    OBJECT_ARGS,
    OLD_ARG_SPELLINGS,
    ObjectColumn,
    _dumps,
    _loads,
    _numbers,
    _plain_numbers,
)
from profiling.lane_names import LANE_NAME_KINDS
from profiling.timestamps import rebased, relative_times

# A missing number reads as this one NaN object: numpy converts a list of floats many times faster
# than one holding None, and `list.count` finds it by identity when a whole column is missing.
MISSING = math.nan

try:
    import msgspec
except ImportError:  # pragma: no cover - a bare install reads through the reference path
    msgspec = None  # type: ignore[assignment]

if msgspec is not None:
    # orjson keeps integers from -2**63 to 2**64-1 and makes larger ones floats, whose text differs
    # ("1.8e+19"): a lane id outside int64 fails here and its batch takes the reference path.
    _Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
    # msgspec takes a JSON integer here as float(int), as numpy does. An args number is a float or null here, so
    # its column needs no check of each value's type (`_plain_numbers`); text there fails validation, and the
    # batch reads by the reference, except in the one key real traces write as text (ROCm's "bytes") and in
    # the times: there text reads as not a number in the column builder, as the reference reads it.
    _Number = float | None
    _NumberOrText = float | str | None
    _Text = str | None
    _Lane = _Int | float | str | None
    _Raw = msgspec.Raw
    NO_RAW = msgspec.Raw(b"")  # a missing object arg: one shared object, no JSON text is empty

    def _arg(key: str, default: Any = MISSING) -> Any:
        return msgspec.field(default=default, name=key)

    class _Args(msgspec.Struct, gc=False):
        """The `args` keys the analysis reads (profiling/columns.py NUMERIC_ARGS, OBJECT_ARGS), by their JSON names."""

        correlation: _Number = MISSING
        external_id: _Number = _arg("External id")
        external_id_old: _Number = _arg("external id")
        stream: _Number = MISSING
        device: _Number = MISSING
        registers: _Number = _arg("registers per thread")
        shared_memory: _Number = _arg("shared memory")
        occupancy: _Number = _arg("est. achieved occupancy %")
        blocks_per_sm: _Number = _arg("blocks per SM")
        bytes: _NumberOrText = MISSING
        total_allocated: _Number = _arg("Total Allocated")
        alloc_bytes: _Number = _arg("Bytes")
        device_type: _Number = _arg("Device Type")
        total_reserved: _Number = _arg("Total Reserved")
        device_id: _Number = _arg("Device Id")
        addr: _Number = _arg("Addr")
        python_id: _Number = _arg("Python id")
        python_parent_id: _Number = _arg("Python parent id")
        python_module_id: _Number = _arg("Python module id")
        in_msg_nelems: _Number = _arg("In msg nelems")
        out_msg_nelems: _Number = _arg("Out msg nelems")
        grid: _Raw = NO_RAW
        block: _Raw = NO_RAW
        input_dims: _Raw = _arg("Input Dims", NO_RAW)
        input_dims_old: _Raw = _arg("Input dims", NO_RAW)
        input_type: _Raw = _arg("Input type", NO_RAW)
        concrete_inputs: _Raw = _arg("Concrete Inputs", NO_RAW)
        msg_dtype: _Raw = _arg("dtype", NO_RAW)
        # A metadata event's lane name (lane_names.LANE_NAME_KINDS), of any JSON type: only `M` rows read it.
        meta_name: _Raw = _arg("name", NO_RAW)
        meta_labels: _Raw = _arg("labels", NO_RAW)

    class _Event(msgspec.Struct, gc=False):
        """The event fields the analysis reads."""

        name: _Text = None
        cat: _Text = None
        ph: _Text = None
        ts: _NumberOrText = MISSING
        dur: _NumberOrText = MISSING
        pid: _Lane = None
        tid: _Lane = None
        args: _Args = msgspec.field(default_factory=_Args)

    class _EventTsText(_Event, gc=False):
        """An `_Event` whose `ts` is kept as its JSON text, for `timestamps.relative_times` to read exactly."""

        ts: _Raw = NO_RAW

    _DECODER = msgspec.json.Decoder(list[_Event])
    _DECODER_TS_TEXT = msgspec.json.Decoder(list[_EventTsText])
    _ERRORS: tuple[type[Exception], ...] = (msgspec.ValidationError, msgspec.DecodeError)

# The numeric args keys typed to take text too (`_NumberOrText`); the others' values are floats or null.
TEXT_NUMBER_KEYS = frozenset({"bytes"})
# JSON key -> _Args attribute, for every key the columns read: each attribute is named as its column, an
# old spelling (torch 1.8-1.9) as its column with `_old`, and a metadata event's name key with `meta_`.
_ATTRIBUTES = {
    **NUMERIC_ARGS,
    **OBJECT_ARGS,
    **{old: f"{(NUMERIC_ARGS | OBJECT_ARGS)[new]}_old" for new, old in OLD_ARG_SPELLINGS.items()},
    **{key: f"meta_{key}" for key in set(LANE_NAME_KINDS.values())},
}


def available() -> bool:
    """Whether msgspec is installed (else every batch takes the reference path)."""
    return msgspec is not None


def typed_rows(text: bytes, base: int = 0) -> TypedRows | None:
    """The batch `[e1,...]` as typed rows, its `ts` relative to `base` µs as `timestamps.rebased` text reads,
    or None where the schema refuses it (read it by the reference then)."""
    if msgspec is None:
        return None
    if not text.isascii():
        try:  # msgspec skips the bytes of keys it does not read unchecked; orjson refuses bad UTF-8 anywhere
            text.decode()
        except UnicodeDecodeError:
            return None
    try:
        if base:
            rows = _rows_rebased(text, base)
            if rows is not None:
                return rows
            text = rebased(text, base)
        return TypedRows(_DECODER.decode(text))
    except _ERRORS:
        return None


def _rows_rebased(text: bytes, base: int) -> TypedRows | None:
    """The rows with each `ts` read from its own text relative to `base` (`relative_times`): no rewrite of the
    batch's text, which cost a regex pass over it. None unless every `"ts"` key in the text is an event's
    (`rebased` rewrites one inside args too, and the reference reads what it wrote) and written alike."""
    events = _DECODER_TS_TEXT.decode(text)
    raws = [event.ts for event in events]
    if text.count(b'"ts"') != len(raws) - raws.count(NO_RAW):
        return None
    times = relative_times(raws, base)
    return None if times is None else TypedRows(events, times)


class TypedRows:
    """Events decoded into `_Event` Structs; each Struct's fields are transposed into columns in C
    (`zip(*map(astuple, ...))`: three times faster than one `attrgetter` pass per field)."""

    def __init__(self, events: list[Any], times: list[float] | None = None) -> None:
        self.events = events
        self.times = times  # the `ts` column where read apart from the Structs (`_rows_rebased`)
        self._fields: dict[str, Sequence[Any]] | None = None
        self._args: dict[str, Sequence[Any]] | None = None

    def __len__(self) -> int:
        return len(self.events)

    def field(self, key: str) -> Sequence[Any]:
        if key == "ts" and self.times is not None:
            return self.times
        if self._fields is None:
            self._fields = _transposed(self.events, _Event.__struct_fields__)
        return self._fields[key]

    def take(self, rows: list[int]) -> TypedRows:
        times = None if self.times is None else [self.times[i] for i in rows]
        return TypedRows([self.events[i] for i in rows], times)

    def _arg_list(self, key: str) -> Sequence[Any]:
        if self._args is None:
            self._args = _transposed(self.field("args"), _Args.__struct_fields__)
        return self._args[_ATTRIBUTES[key]]

    def numbers(self, key: str) -> np.ndarray:
        values = self._arg_list(key)
        if values.count(MISSING) == len(values):  # by identity, in C: the key is in no event of the batch
            old = OLD_ARG_SPELLINGS.get(key)
            if old is None or self._arg_list(old).count(MISSING) == len(values):
                return np.full(len(values), math.nan)
        values = self._spelled(key, values)
        return _numbers(values) if key in TEXT_NUMBER_KEYS else _plain_numbers(values)

    def _spelled(self, key: str, values: Sequence[Any]) -> Sequence[Any]:
        """`values`, the old spelling's where they are missing or null (no JSON number is NaN, so NaN is missing)."""
        old = OLD_ARG_SPELLINGS.get(key)
        if old is None:
            return values
        olds = self._arg_list(old)
        if olds.count(MISSING) == len(olds):  # the old spelling is in no event of the batch (by identity, in C)
            return values
        return [v if v is not None and v == v else o for v, o in zip(values, olds, strict=True)]

    def arg_values(self, key: str) -> list[Any]:
        # Parsed here, for the few metadata rows that ask; orjson's error on what msgspec let through (`1e400`)
        # propagates, and the batch is read by the reference.
        return [None if raw is NO_RAW else _loads(bytes(raw)) for raw in self._arg_list(key)]

    def objects(self, key: str) -> ObjectColumn:
        column = _raw_codes(self._arg_list(key))
        old = OLD_ARG_SPELLINGS.get(key)
        if old is not None and (column[0] < 0).any():
            return or_old_spelling(column, _raw_codes(self._arg_list(old)))
        return column


def or_old_spelling(column: ObjectColumn, old: ObjectColumn) -> ObjectColumn:
    """`column`, the `old` spelling's value in the rows where it has none (or null)."""
    codes, keys, values = column
    old_codes, old_keys, old_values = old
    codes = np.where((codes < 0) & (old_codes >= 0), old_codes + len(keys), codes)
    return codes, keys + old_keys, values + old_values  # type: ignore[operator]


def _transposed(structs: Sequence[Any], names: tuple[str, ...]) -> dict[str, Sequence[Any]]:
    """Each field of `structs` as a tuple of its values, in row order."""
    if not structs:
        return {name: () for name in names}
    return dict(zip(names, zip(*map(msgspec.structs.astuple, structs), strict=True), strict=True))


def _raw_codes(raws: Sequence[Any]) -> ObjectColumn:
    """Raw JSON values (NO_RAW: missing) as an ObjectColumn; each distinct text is parsed once, and a null is
    missing. Every per-event step is a C call (`map`, `dict.fromkeys`, `list.count`)."""
    codes = np.full(len(raws), -1, np.intp)
    if raws.count(NO_RAW) == len(raws):
        return codes, [], []
    present = np.flatnonzero(np.fromiter(map(is_not, raws, repeat(NO_RAW)), bool, count=len(raws)))
    texts = list(map(bytes, map(raws.__getitem__, present.tolist())))
    distinct = list(dict.fromkeys(texts))
    at, keys, values = canonical(distinct)
    of_text = dict(zip(distinct, at, strict=True))  # raw text -> position in `values`, -1 for null
    codes[present] = np.fromiter(map(of_text.__getitem__, texts), np.intp, count=len(texts))
    return codes, keys, values


def canonical(texts: Sequence[bytes]) -> tuple[list[int], list[bytes], list[Any]]:
    """Distinct raw JSON texts as (each one's position among the distinct values, -1 for null; the values'
    canonical compact JSON; the values), the values in order of first appearance."""
    return canonical_parsed(map(_parsed, texts))


def canonical_parsed(parsed: Iterable[tuple[bytes | None, Any]]) -> tuple[list[int], list[bytes], list[Any]]:
    """`canonical` of texts already `_parsed`."""
    index: dict[bytes, int] = {}  # canonical compact JSON -> position in `values`
    at: list[int] = []
    values: list[Any] = []
    for key, value in parsed:
        if key is None:
            at.append(-1)
            continue
        if key not in index:
            index[key] = len(values)
            values.append(value)
        at.append(index[key])
    return at, list(index), values


# Raw text -> (canonical compact JSON or None for null, value), across batches and reads: a real trace
# repeats its shapes every step. Emptied past _CACHE_BYTES of texts, so a hostile trace of distinct
# values costs a parse each (bounded by the columns' own cap on distinct values), never more memory.
_CACHE: dict[bytes, tuple[bytes | None, Any]] = {}
_CACHE_BYTES = 16 * 1024**2
_cached_bytes = 0


def _parsed(text: bytes) -> tuple[bytes | None, Any]:
    """The value of one raw JSON text and its canonical key (None for null); orjson's error on what msgspec
    let through (`1e400`) propagates, and the batch is read by the reference."""
    global _cached_bytes
    hit = _CACHE.get(text)
    if hit is not None:
        return hit
    value = _loads(text)
    parsed = (None if value is None else _dumps(value), value)
    _cached_bytes += len(text)
    if _cached_bytes > _CACHE_BYTES:
        _CACHE.clear()
        _cached_bytes = len(text)
    _CACHE[text] = parsed
    return parsed
