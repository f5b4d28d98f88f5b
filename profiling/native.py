"""The native decoder: a batch of plainly written events straight into a Block, in compiled code.

The typed decoder (profiling/decode.py) still builds a Python object per event and per value; here one
compiled pass (profiling/native_scan.py, numba) writes each event's numbers and the byte spans of its texts
into arrays, spans are coded by their bytes in compiled code too, and Python touches only the distinct
texts and object args (a few hundred per batch). A batch written in any way the pass does not take plainly
(an escape, a number not exactly readable in one division, a bool where a number goes, ...) is refused, and
reads by the typed route: every odd value reads as the reference reads it, and the tests hold both to the
same blocks on every real trace and on fuzzed ones (tests/profiling/test_native.py). The few metadata events
(lane names) are parsed whole, by the reference parser, for their args.

Without numba (a bare CLI, the GPU machine's torch) `warm()` is False and every batch reads the typed way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from profiling.columns import (
    NUMERIC_ARGS,
    OBJECT_ARGS,
    OLD_ARG_SPELLINGS,
    Block,
    ObjectColumn,
    TextColumn,
    _decoded,
    _loads,
    usable,
    within_time_range,
)
from profiling.decode import TEXT_NUMBER_KEYS, _parsed, canonical_parsed, or_old_spelling
from profiling.lane_names import lane_names
from profiling.names import cut_name

try:
    from profiling import native_json, native_scan, native_structure
    from profiling.native_texts import text_cache
except ImportError:  # pragma: no cover - exercised by tests/test_layering.py in a child without numba
    native_json = native_scan = native_structure = text_cache = None  # type: ignore[assignment]

# (level, key, kind): the spans and the numbers the pass writes, in their column order (the kinds and levels:
# native_scan's); empty without numba, where nothing reads them.
_SPAN_KEYS: list[tuple[int, str, int]] = []
_NUMBER_KEYS: list[tuple[int, str, int]] = []
if native_scan is not None:
    _EVENT, _IN_ARGS = native_scan.EVENT_LEVEL, native_scan.ARGS_LEVEL
    _SPAN_KEYS = [
        *((_EVENT, key, native_scan.TEXT) for key in ("name", "cat", "ph")),
        *((_EVENT, key, native_scan.LANE) for key in ("pid", "tid")),
        *((_IN_ARGS, key, native_scan.RAW) for key in OBJECT_ARGS),
        *((_IN_ARGS, OLD_ARG_SPELLINGS[key], native_scan.RAW) for key in OBJECT_ARGS if key in OLD_ARG_SPELLINGS),
    ]
    _NUMBER_KEYS = [
        (_EVENT, "ts", native_scan.TIME),
        (_EVENT, "dur", native_scan.NUMBER),
        *(
            (_IN_ARGS, key, native_scan.NUMBER_OR_TEXT if key in TEXT_NUMBER_KEYS else native_scan.NUMBER)
            for key in NUMERIC_ARGS
        ),
        *((_IN_ARGS, OLD_ARG_SPELLINGS[key], native_scan.NUMBER) for key in NUMERIC_ARGS if key in OLD_ARG_SPELLINGS),
    ]
# The row arrays take 440 bytes per `{` in the batch (30 spans, 25 numbers): a batch with a `{` in fewer than
# this many bytes (real traces: ~165, two per event) reads the typed way, so a batch of `{}` holds no more here
# than about 14 times its bytes.
MIN_BYTES_PER_BRACE = 32
_OPEN_BRACE = ord("{")
SPAN = {key: 2 * at for at, (_, key, _) in enumerate(_SPAN_KEYS)}  # key -> its start's column (end: +1)
SPAN_COLUMNS = 2 * len(_SPAN_KEYS) + 2  # and the event's own span, last
NUMBER = {key: at for at, (_, key, _) in enumerate(_NUMBER_KEYS)}


def _tables() -> tuple[np.ndarray, ...]:
    """The known keys as the pass reads them: (lut, keys, words, levels, kinds, slots); `lut` maps a key's
    `native_scan.slot` to the key, with no two keys on one entry, and ends with its bits."""
    known = [(*key, 2 * at) for at, key in enumerate(_SPAN_KEYS)] + [(*key, at) for at, key in enumerate(_NUMBER_KEYS)]
    known.append((native_scan.EVENT_LEVEL, "args", native_scan.ARGS, 0))
    encoded = [key.encode() for _, key, _, _ in known]
    padded = (np.frombuffer(key + bytes(native_json.PADDING), np.uint8) for key in encoded)
    words = np.array([native_scan.packed(key, 0, len(key) - native_json.PADDING) for key in padded], np.uint64)
    bits = 6
    while len({native_scan.slot(*word, bits) for word in words}) < len(words):
        bits += 1
    lut = np.full(2**bits + 1, -1, np.int64)
    lut[-1] = bits
    keys = np.zeros((len(known), max(map(len, encoded))), np.uint8)
    for at, key in enumerate(encoded):
        lut[native_scan.slot(*words[at], bits)] = at
        keys[at, : len(key)] = np.frombuffer(key, np.uint8)
    levels, kinds, slots = (np.array([entry[i] for entry in known], np.int64) for i in (0, 2, 3))
    return lut, keys, words, levels, kinds, slots


_TABLES = _tables() if native_scan is not None else ()


def warm() -> bool:
    """Load the compiled code (from numba's cache, else compiling it: ~4 s), so a forked helper shares it;
    whether the native decoder is available."""
    if native_scan is None:
        return False
    text = b'[{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1,"args":{"grid":[1]}}]'
    native_block(text)
    size = len(text)
    marks = np.empty(size, np.int64), np.empty(size, np.uint8), np.empty(size, np.int32)
    native_structure.structure(np.frombuffer(text, np.uint8), False, False, 0, 2, *marks)  # the splitter's scan
    return True


def native_block(text: bytes, base: int = 0) -> Block | None:
    """The batch `[e1,...]` as a Block, its `ts` relative to `base` µs as `timestamps.rebased` text reads; None
    where the batch is not plainly written (read it the typed way then)."""
    if native_scan is None:
        return None
    if not text.isascii():
        try:  # the pass takes any byte inside a string; orjson refuses bad UTF-8 anywhere
            text.decode()
        except UnicodeDecodeError:
            return None
    buf = np.frombuffer(text + bytes(native_json.PADDING), np.uint8)
    capacity = int(np.count_nonzero(buf == _OPEN_BRACE))  # each event opens with one; 5x bytes.count's speed
    if capacity > len(text) // MIN_BYTES_PER_BRACE:  # tiny events: rows of 440 bytes would be many times the JSON
        return None
    spans = np.empty((capacity, SPAN_COLUMNS), np.int64)
    numbers = np.empty((capacity, len(_NUMBER_KEYS)))
    status, rows, ts_keys = native_scan.scan(buf, base, *_TABLES, spans, numbers)
    # The typed route reads a batch whose `"ts"` texts are not all events' keys by rewriting it (`rebased`).
    if status != native_scan.OK or (base and text.count(b'"ts"') != ts_keys):
        return None
    try:
        return _block(_Spans(text, buf, spans[:rows]), numbers[:rows], base)
    except _Refused:
        return None


class _Refused(Exception):
    """A batch the native decoder leaves to the typed one."""


class _Spans:
    """A batch's text and its span columns."""

    def __init__(self, text: bytes, buf: np.ndarray, spans: np.ndarray) -> None:
        self.text, self.buf, self.spans = text, buf, spans

    def take(self, rows: np.ndarray) -> _Spans:
        return _Spans(self.text, self.buf, self.spans[rows])

    def distinct(self, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's code into the distinct texts of `key` (-1: missing), and those texts' spans (starts, ends)
        in order of first appearance."""
        starts, ends = self.spans[:, SPAN[key]], self.spans[:, SPAN[key] + 1]
        codes, firsts = np.empty(len(starts), np.int64), np.empty(len(starts), np.int64)
        table = np.full(1 << (2 * len(starts)).bit_length(), -1, np.int64)
        count = native_scan.distinct(self.buf, starts, ends, codes, firsts, table)
        if count < 0:
            raise _Refused
        at = firsts[:count]
        return codes, starts[at], ends[at]

    def decoded(self, key: str, decode: Callable[[bytes], Any]) -> tuple[np.ndarray, list[Any]]:
        """`distinct`, each text decoded by `decode`: a text this process has decoded before is not decoded
        again (profiling/native_texts.py)."""
        codes, starts, ends = self.distinct(key)
        texts = text_cache(decode).decoded(self.buf, starts, ends)
        if texts is None:  # more distinct texts than the cache holds: this batch's own
            texts = [decode(self.text[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
        return codes, texts

    def texts(self, key: str, missing: str, decode: Callable[[bytes], str] = bytes.decode) -> TextColumn:
        codes, texts = self.decoded(key, decode)
        return codes, [*texts, missing]

    def lanes(self, key: str) -> TextColumn:
        codes, texts = self.decoded(key, _lane)
        return codes, [*texts, "?"]

    def arg_values(self, key: str) -> list[Any]:
        """The args key `key` of each row as parsed (None where missing), for the few metadata rows
        (`lane_names.lane_names`): each event parsed whole, by the reference parser."""
        events = (_loads(self.text[s:e]) for s, e in self.spans[:, -2:].tolist())
        return [event.get("args", {}).get(key) for event in events]

    def objects(self, key: str) -> ObjectColumn:
        codes, parsed = self.decoded(key, _parsed)
        at, keys, values = canonical_parsed(parsed)
        return np.array([*at, -1], np.intp)[codes], keys, values


def _name(text: bytes) -> str:
    return cut_name(text.decode())


def _lane(text: bytes) -> str:
    # A text lane's span keeps its quotes, so 7 and "7" were coded apart, as the reference codes them.
    return text.strip(b'"').decode()


def _block(spans: _Spans, numbers: np.ndarray, base: int) -> Block:
    """Block, as `columns.block_of` builds one from rows."""
    names = {"name": spans.texts("name", "", _name), "cat": spans.texts("cat", ""), "ph": spans.texts("ph", "")}
    ts = within_time_range(numbers[:, NUMBER["ts"]].copy(), base)
    dur = within_time_range(numbers[:, NUMBER["dur"]].copy())
    ph = _decoded(names["ph"])
    keep, times = usable(names, ph, ts, dur)
    seen = len(numbers)
    if len(keep) < seen:
        spans, numbers = spans.take(keep), numbers[keep]
        names = {field: (codes[keep], texts) for field, (codes, texts) in names.items()}
    names |= {lane: spans.lanes(lane) for lane in ("pid", "tid")}
    times |= {column: _number_column(numbers, key) for key, column in NUMERIC_ARGS.items()}
    objects = {column: _object_column(spans, key) for key, column in OBJECT_ARGS.items()}
    lanes = lane_names(spans, names, np.flatnonzero(ph[keep] == "M"))  # type: ignore[arg-type]
    return Block(seen, seen - len(keep), len(keep), names, times, objects, lanes)


def _number_column(numbers: np.ndarray, key: str) -> np.ndarray:
    values = numbers[:, NUMBER[key]]
    old = OLD_ARG_SPELLINGS.get(key)
    if old is None:
        return values.copy()
    return np.where(np.isnan(values), numbers[:, NUMBER[old]], values)


def _object_column(spans: _Spans, key: str) -> ObjectColumn:
    column = spans.objects(key)
    old = OLD_ARG_SPELLINGS.get(key)
    if old is not None and (column[0] < 0).any():
        return or_old_spelling(column, spans.objects(old))
    return column
