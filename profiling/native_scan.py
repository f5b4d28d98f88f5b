"""The compiled half of the native decoder (profiling/native.py): one pass over a batch's bytes, in numba.

`scan` walks a batch of plainly written events (`[e1,...]`) and writes, per event, the byte spans of its
texts and object args and the values of its numbers; `distinct` codes spans by their bytes. Both refuse
(status `REFUSED`) anything outside the plain grammar below rather than guess, and the batch then takes the
typed route (profiling/decode.py), which reads every odd value as the reference does:
- strings without escapes or control bytes; numbers as JSON writes them, kept where exactly readable
  (at most 2**53 units of 10**-k, k <= 22: one correctly rounded division, as a parser rounds them);
- the known keys with the types the typed schema takes plainly (texts as strings, lanes as int64 or
  strings, args as an object, numeric args as numbers or null); any other key's value is validated as
  JSON and skipped.
The tokens, and the bounds every read keeps, are profiling/native_json.py's.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from profiling.native_json import (
    PADDING,
    exact_value,
    integer_end,
    literal_end,
    number_end,
    skip_value,
    string_end,
    word,
    ws,
)

OK, REFUSED = 0, 1
# What a known key's value is read as (the key tables: profiling/native.py).
TEXT, LANE, TIME, NUMBER, RAW, ARGS, NUMBER_OR_TEXT = range(7)
EVENT_LEVEL, ARGS_LEVEL = 0, 1  # where a known key is read: an event's own keys, or its `args`
MAX_PROBES = 64  # a longer chain in `distinct`'s table is refused: a crafted flood costs a typed read, no more


@njit(cache=True, nogil=True, _nrt=False)
def _span_hash(buf: np.ndarray, start: int, end: int) -> np.uint64:
    """A span's hash from its length and four words of it (first, a third in, two thirds in, last): a fixed
    cost per span, where hashing each byte of long kernel names was most of `distinct`. Spans alike in all four
    share a chain, compared byte by byte, and a flood of them passes MAX_PROBES."""
    length = end - start
    h = np.uint64(length) * np.uint64(0x9E3779B97F4A7C15)
    if length < 8:  # one word, the bytes past the span zeroed
        keep = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(8 * (8 - length)) if length else np.uint64(0)
        h ^= word(buf, start) & keep
    else:
        third = length // 3
        for at in (start, min(start + third, end - 8), min(start + 2 * third, end - 8), end - 8):
            h = (h ^ word(buf, at)) * np.uint64(0x100000001B3)
            h ^= h >> np.uint64(29)
    # A multiply carries a bit only upwards: mixed down again (splitmix64's finish), so the low bits the table
    # uses depend on every byte read, not only the first ones.
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@njit(cache=True, nogil=True, _nrt=False)
def packed(buf: np.ndarray, start: int, end: int) -> tuple[np.uint64, np.uint64]:
    """A key as two words: its first eight bytes (those past its end zeroed) and its last eight bytes (the first
    eight again where it is shorter), so a key of up to 16 bytes compares in two words, and with no branch that
    depends on the key (per-byte loops of varying length were half of the pass, measured). Reads up to 8 bytes
    past `end`, which the PADDING covers."""
    length = end - start
    keep = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(8 * (8 - min(length, 8))) if length else np.uint64(0)
    first = word(buf, start) & keep
    last = word(buf, max(end - 8, start)) & keep
    return first ^ np.uint64(length), last


@njit(cache=True, nogil=True, _nrt=False)
def slot(first: np.uint64, last: np.uint64, bits: int) -> int:
    """A packed key's entry in a table of 2**bits (Fibonacci hashing)."""
    x = (first * np.uint64(0x9E3779B97F4A7C15)) ^ last
    return int((x * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits))


@njit(cache=True, nogil=True, _nrt=False)
def _known(buf: np.ndarray, start: int, end: int, lut: np.ndarray, keys: np.ndarray, words: np.ndarray) -> int:
    """The index of the key at [start, end) among `keys` (-1: not a known key): `lut` has 2**lut[-1] entries and
    that count last; `words` holds each known key `packed`, two words a row."""
    first, last = packed(buf, start, end)
    k = lut[slot(first, last, lut[-1])]
    if k < 0 or words[k, 0] != first or words[k, 1] != last:
        return -1
    for j in range(8, end - start - 8):  # the middle bytes of a key past 16 bytes
        if keys[k, j] != buf[start + j]:
            return -1
    return k


@njit(cache=True, nogil=True, _nrt=False)
def _value(buf, i, kind, base):  # noqa: ANN001
    """The value at i of a key of `kind` (-1: a key not read): (its end, the span kept of it, its number);
    end -1 where refused. A text keeps the span inside its quotes, a lane the whole (7 and "7" are two lanes
    until named, as the reference reads them), an object arg its JSON text; a number is NaN where null, or
    text where `NUMBER_OR_TEXT` takes it, as the typed route reads those."""
    c = buf[i]
    if kind == TEXT:
        end = string_end(buf, i + 1) if c == 0x22 else -1
        return (end + 1 if end >= 0 else -1), i + 1, end, np.nan
    if kind == LANE:
        end = string_end(buf, i + 1) + 1 if c == 0x22 else integer_end(buf, i)
        return (end if end > 0 else -1), i, end, np.nan
    if kind in (TIME, NUMBER, NUMBER_OR_TEXT):
        if kind != TIME and c == 0x6E and literal_end(buf, i) == i + 4:  # null: missing
            return i + 4, -1, -1, np.nan
        if kind == NUMBER_OR_TEXT and c == 0x22:
            end = string_end(buf, i + 1)
            return (end + 1 if end >= 0 else -1), -1, -1, np.nan
        end = number_end(buf, i)
        value = exact_value(buf, i, end, base if kind == TIME else 0) if end > 0 else np.nan
        return (end if value == value else -1), -1, -1, value
    end = skip_value(buf, i)  # an object arg's text, or a key not read, validated as JSON
    return end, i, end, np.nan


@njit(cache=True, nogil=True, _nrt=False)
def _event(buf, i, row, base, lut, keys, words, levels, kinds, slots, spans, numbers):  # noqa: ANN001
    """Read the event object at i (`{` there) into row `row`: each known key of its level (EVENT_LEVEL, or
    ARGS_LEVEL inside its `args`) by its kind into its slot (`_value`). Returns (end, `ts` keys read), end -1
    where refused."""
    for j in range(spans.shape[1]):
        spans[row, j] = -1
    for j in range(numbers.shape[1]):
        numbers[row, j] = np.nan
    level, ts_keys = EVENT_LEVEL, 0
    i = ws(buf, i + 1)
    if buf[i] == 0x7D:
        return i + 1, ts_keys
    while True:
        if buf[i] != 0x22:
            return -1, ts_keys
        key_end = string_end(buf, i + 1)
        if key_end < 0:
            return -1, ts_keys
        k = _known(buf, i + 1, key_end, lut, keys, words)
        kind = kinds[k] if k >= 0 and levels[k] == level else -1
        i = ws(buf, key_end + 1)
        if buf[i] != 0x3A:
            return -1, ts_keys
        i = ws(buf, i + 1)
        if kind == ARGS:
            if buf[i] != 0x7B:
                return -1, ts_keys
            i = ws(buf, i + 1)
            if buf[i] != 0x7D:
                level = ARGS_LEVEL
                continue
            i += 1
        else:
            end, start, stop, value = _value(buf, i, kind, base)
            if end < 0:
                return -1, ts_keys
            if kind in (TEXT, LANE, RAW):
                spans[row, slots[k]], spans[row, slots[k] + 1] = start, stop
            elif kind >= 0:
                numbers[row, slots[k]] = value
                ts_keys += kind == TIME
            i = end
        i = ws(buf, i)
        while buf[i] == 0x7D:  # the end of args, then perhaps of the event
            if level == EVENT_LEVEL:
                return i + 1, ts_keys
            level = EVENT_LEVEL
            i = ws(buf, i + 1)
        if buf[i] != 0x2C:
            return -1, ts_keys
        i = ws(buf, i + 1)


@njit(cache=True, nogil=True, _nrt=False)
def scan(buf, base, lut, keys, words, levels, kinds, slots, spans, numbers):  # noqa: ANN001, ANN201
    """Read the batch `[e1,...]` in `buf` (PADDING zero bytes at its end) into `spans` (-1: missing; the last two
    columns: the event's own) and `numbers` (NaN: missing), a row per event. Returns (status, events, `ts` keys
    read)."""
    n = len(buf) - PADDING
    i = ws(buf, 0)
    if buf[i] != 0x5B:
        return REFUSED, 0, 0
    i = ws(buf, i + 1)
    rows, ts_keys = 0, 0
    if buf[i] == 0x5D:
        i += 1
    else:
        while True:
            if buf[i] != 0x7B or rows == len(spans):
                return REFUSED, rows, ts_keys
            start = i
            i, found = _event(buf, i, rows, base, lut, keys, words, levels, kinds, slots, spans, numbers)
            if i < 0:
                return REFUSED, rows, ts_keys
            spans[rows, -2], spans[rows, -1] = start, i  # the event's own span, for a metadata event's args
            rows, ts_keys = rows + 1, ts_keys + found
            i = ws(buf, i)
            if buf[i] == 0x5D:
                i += 1
                break
            if buf[i] != 0x2C:
                return REFUSED, rows, ts_keys
            i = ws(buf, i + 1)
    return (OK if ws(buf, i) == n else REFUSED), rows, ts_keys


@njit(cache=True, nogil=True, _nrt=False)
def same_bytes(a: np.ndarray, at_a: int, b: np.ndarray, at_b: int, length: int) -> bool:
    """Whether the `length` bytes of `a` from `at_a` and of `b` from `at_b` are the same, eight at a time (the last
    eight overlapping the ones before); fewer than eight compared as one word masked to them. Reads up to 8 bytes
    past each span, which PADDING covers. A byte at a time, the native decoder ran at 342-360 MB/s on a replica's
    batches, against 378-396 (three passes each, alternated)."""
    if length < 8:
        keep = (np.uint64(1) << np.uint64(8 * length)) - np.uint64(1)
        return (word(a, at_a) ^ word(b, at_b)) & keep == 0
    for j in range(0, length - 8, 8):
        if word(a, at_a + j) != word(b, at_b + j):
            return False
    return word(a, at_a + length - 8) == word(b, at_b + length - 8)


@njit(cache=True, nogil=True, _nrt=False)
def distinct(buf, starts, ends, codes, firsts, table):  # noqa: ANN001, ANN201
    """Code each span [starts[r], ends[r]) by its bytes (-1 where starts[r] < 0) into `codes`, the distinct ones
    numbered in order of first appearance, `firsts` their first rows; `table` (all -1, a power of two at least
    twice the rows) maps hashes to distinct numbers. Returns how many are distinct, or -1 where a probe chain
    passes MAX_PROBES (a crafted flood: the caller reads the batch the typed way)."""
    size = len(table)
    count = 0
    for r in range(len(starts)):
        start, end = starts[r], ends[r]
        if start < 0:
            codes[r] = -1
            continue
        slot = _span_hash(buf, start, end) & np.uint64(size - 1)
        for _ in range(MAX_PROBES):
            d = table[slot]
            if d < 0:
                table[slot] = count
                firsts[count] = r
                codes[r] = count
                count += 1
                break
            first = firsts[d]
            length = end - start
            if ends[first] - starts[first] == length and same_bytes(buf, starts[first], buf, start, length):
                codes[r] = d
                break
            slot = (slot + np.uint64(1)) & np.uint64(size - 1)
        else:
            return -1
    return count
