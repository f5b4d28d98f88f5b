"""The structural scan in compiled code (numba), 64 bytes at a time: profiling/scan.py `Splitter._structure`.

A byte at a time, the scan branched on every byte and read 1.0 GB/s, the largest cost of a big trace's read on the
process that inflates it. Here each block of 64 bytes becomes three bit masks (its quotes, backslashes and `{}[],`),
found 8 bytes at a time in a 64-bit word (SWAR: a byte equal to c has its high bit set, with no borrow between
bytes); the bytes a backslash escapes come from the few backslashes; a prefix XOR of the quotes tells which bytes
lie in strings; and only the structural bytes outside strings, one in ~20, are visited, for the depth: 1.7 GB/s
(docs/benchmarks.md). The chunk's last bytes, under a block, take the byte loop. Both read the same marks, state and
depths as numpy's passes (tests/profiling/test_native.py holds them to it, escapes and cuts anywhere).

Compiled without numba's reference counting, as profiling/native_json.py is: nothing here allocates.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit

_ONES, _HIGH, _LOW7 = np.uint64(0x0101010101010101), np.uint64(0x8080808080808080), np.uint64(0x7F7F7F7F7F7F7F7F)
_GATHER = np.uint64(0x0102040810204080)  # the high bit of byte j to bit 56 + j, in one multiply
_STEP_OF = np.full(256, 2, np.int64)  # a structural byte's depth change; 2: no structure
_STEP_OF[[ord("{"), ord("[")]], _STEP_OF[[ord("}"), ord("]")]], _STEP_OF[[ord(","), ord('"')]] = 1, -1, 0
_DEBRUIJN = np.uint64(0x03F79D71B4CB0A89)
_LOWEST_AT = np.zeros(64, np.int64)  # de Bruijn: a word's lowest set bit, as its position
for _k in range(64):
    _LOWEST_AT[((1 << _k) * int(_DEBRUIJN) % 2**64) >> 58] = _k


def structure(data, in_string, escape_pending, depth, kept_depth, positions, kinds, depths):  # noqa: ANN001, ANN201
    """The structural scan of one chunk (a uint8 array) in one pass: the marks `"{}[],` outside strings whose depth
    before them is at most `kept_depth` (their positions, bytes and depths before, into the arrays given), an escape's
    pair skipped wherever it is, as the numpy scan blanks it. Returns (marks kept, in a string after, an escape's pair
    pending, depth after, deepest and shallowest depth after a mark)."""
    blocks = len(data) // 64 if sys.byteorder == "little" else 0  # the masks read a word's bytes low first
    words = data[: 64 * blocks].view(np.uint64)
    return _structure(data, words, in_string, escape_pending, depth, kept_depth, positions, kinds, depths)


@njit(cache=True, nogil=True, _nrt=False)
def _structure(data, words, in_string, escape_pending, depth, kept_depth, positions, kinds, depths):  # noqa: ANN001
    count, deepest, shallowest = 0, depth, depth
    for block in range(len(words) // 8):
        quotes, backslashes, marks = _masks(words, 8 * block)
        escaped, escape_pending = _escaped(backslashes, escape_pending)
        inside = _prefix_xor(quotes & ~escaped)  # bit j: an odd count of quotes up to byte j
        if in_string:
            inside = ~inside
        in_string = (inside >> np.uint64(63)) == np.uint64(1)
        marks &= ~inside & ~escaped
        while marks:
            at = 64 * block + _lowest(marks)
            marks &= marks - np.uint64(1)
            c = data[at]
            before = depth
            depth += _STEP_OF[c]
            deepest, shallowest = max(deepest, depth), min(shallowest, depth)
            if before <= kept_depth:
                positions[count], kinds[count], depths[count] = at, c, before
                count += 1
    # The last bytes, under a block, one at a time.
    n, i = len(data), 8 * len(words)
    if escape_pending and i < n:
        i, escape_pending = i + 1, False
    while i < n:
        c = data[i]
        if c == 0x5C:  # a backslash: it and the next byte are no structure
            if i + 1 == n:
                escape_pending = True
            i += 2
            continue
        i += 1
        if c == 0x22:
            in_string = not in_string
            continue
        if in_string or _STEP_OF[c] == 2:
            continue
        before = depth
        depth += _STEP_OF[c]
        deepest, shallowest = max(deepest, depth), min(shallowest, depth)
        if before <= kept_depth:
            positions[count], kinds[count], depths[count] = i - 1, c, before
            count += 1
    return count, in_string, escape_pending, depth, deepest, shallowest


@njit(cache=True, nogil=True, _nrt=False)
def _masks(words, first):  # noqa: ANN001
    """Bit j of each mask for byte j of the block at word `first`: a quote; a backslash; one of `{}[],`."""
    quotes, backslashes, marks = np.uint64(0), np.uint64(0), np.uint64(0)
    for k in range(8):
        word, shift = words[first + k], np.uint64(8 * k)
        quotes |= _bits(_equal(word, 0x22)) << shift
        backslashes |= _bits(_equal(word, 0x5C)) << shift
        brackets = _equal(word, 0x7B) | _equal(word, 0x7D) | _equal(word, 0x5B) | _equal(word, 0x5D)
        marks |= _bits(brackets | _equal(word, 0x2C)) << shift
    return quotes, backslashes, marks


@njit(cache=True, nogil=True, _nrt=False)
def _equal(word, byte):  # noqa: ANN001
    """The high bit of each byte of `word` that is `byte`: exact, as no byte's sum carries into the next."""
    x = word ^ (np.uint64(byte) * _ONES)
    return ~(((x & _LOW7) + _LOW7) | x) & _HIGH


@njit(cache=True, nogil=True, _nrt=False)
def _bits(high):  # noqa: ANN001
    """The eight high bits of `high` as an 8-bit mask, byte j's to bit j."""
    return ((high >> np.uint64(7)) * _GATHER) >> np.uint64(56)


@njit(cache=True, nogil=True, _nrt=False)
def _escaped(backslashes, pending):  # noqa: ANN001
    """The bytes of a block a backslash escapes, left to right as the byte loop skips pairs (an escaped backslash
    escapes nothing), and whether the last byte escapes the next block's first; `pending`: this block's first is."""
    escaped = np.uint64(1) if pending else np.uint64(0)
    rest = backslashes & ~escaped
    while rest:
        at = _lowest(rest)
        if at == 63:
            return escaped, True
        escaped |= np.uint64(2) << np.uint64(at)
        rest &= ~((np.uint64(4) << np.uint64(at)) - np.uint64(1))  # the next pair starts past this one
    return escaped, False


@njit(cache=True, nogil=True, _nrt=False)
def _prefix_xor(bits):  # noqa: ANN001
    """Bit j: the parity of bits 0 to j."""
    for shift in (1, 2, 4, 8, 16, 32):
        bits ^= bits << np.uint64(shift)
    return bits


@njit(cache=True, nogil=True, _nrt=False)
def _lowest(bits):  # noqa: ANN001
    """The position of the lowest set bit (de Bruijn)."""
    return _LOWEST_AT[((bits & (~bits + np.uint64(1))) * _DEBRUIJN) >> np.uint64(58)]
