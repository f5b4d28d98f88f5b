"""JSON in compiled code (numba): the tokens the native pass is built from (the structural scan is
profiling/native_structure.py).

Every function reads a buffer that ends in PADDING zero bytes and stops at a zero byte (no JSON token holds one),
so no read passes the buffer whatever the input; each returns -1 (or NaN) for what it does not take plainly,
and its caller refuses the batch (profiling/native_scan.py), which the typed route then reads.

Compiled without numba's reference counting (`_nrt=False`: nothing here allocates): counting each array
argument of each call was two thirds of the pass (220 -> 646 MB/s on a replica batch, measured).
"""

from __future__ import annotations

import sys

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

PADDING = 8
MAX_MANTISSA = 2**53
_POW10 = np.array([10.0**k for k in range(23)])  # exact: 10**22 is the last power of ten a float64 holds
_SPACE = np.zeros(256, np.bool_)
_SPACE[[0x20, 0x09, 0x0A, 0x0D]] = True
_LOW_BITS = np.uint64(0x0101010101010101)
_HIGH_BITS = np.uint64(0x8080808080808080)
_QUOTES, _BACKSLASHES, _BELOW_SPACE = (np.uint64(0x0101010101010101 * c) for c in (0x22, 0x5C, 0x20))
MAX_NESTING = 60  # levels inside a skipped value tracked in one 64-bit word; deeper ones take the typed route


@njit(cache=True, nogil=True, _nrt=False)
def ws(buf: np.ndarray, i: int) -> int:
    while _SPACE[buf[i]]:
        i += 1
    return i


@njit(cache=True, nogil=True, _nrt=False)
def string_end(buf: np.ndarray, i: int) -> int:
    """The index of the closing quote of the string whose opening quote is at i-1; -1 on an escape or control byte.

    Eight bytes a step (SWAR): a word's quotes, backslashes and control bytes flagged at once, the lowest flag the
    first of them (a flag's false positives, from the borrows, lie only above a true one); 9% more of the native
    decoder's MB/s than a byte a step. PADDING's zero bytes are control bytes: no word read starts past them."""
    while True:
        x = word(buf, i)
        quote, backslash = x ^ _QUOTES, x ^ _BACKSLASHES  # a zero byte where x had a quote, a backslash
        flags = (quote - _LOW_BITS) & ~quote | (backslash - _LOW_BITS) & ~backslash | (x - _BELOW_SPACE) & ~x
        flags &= _HIGH_BITS
        if flags:
            end = i + (_trailing_zeros(flags) >> 3)
            return end if buf[end] == 0x22 else -1
        i += 8


@intrinsic
def _unaligned_word(typingctx, buf, at):  # noqa: ANN001
    """The eight bytes of a uint8 array from `at` as one little-endian word: one unaligned load (byte-swapped on a
    big-endian machine), where eight loads shifted into place were not combined by the compiler."""

    def codegen(context, builder, signature, args):  # noqa: ANN001
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        pointer = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        value = builder.load(pointer, align=1)
        if sys.byteorder == "big":  # pragma: no cover - no big-endian machine here
            value = builder.bswap(value)
        return value

    return types.uint64(buf, at), codegen


@njit(cache=True, nogil=True, _nrt=False)
def word(buf: np.ndarray, at: int) -> np.uint64:
    """The eight bytes from `at` as one little-endian word, in one load: as eight loads shifted into place it held
    the native decoder to 259-284 MB/s on a replica's batches, against 318-341 now (three passes each)."""
    return _unaligned_word(buf, at)


@intrinsic
def _trailing_zeros(typingctx, x):  # noqa: ANN001
    """The count of zero bits below the lowest one bit of a uint64 (x != 0), as an int64: one instruction."""

    def codegen(context, builder, signature, args):  # noqa: ANN001
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 1))

    return types.int64(x), codegen


@njit(cache=True, nogil=True, _nrt=False)
def number_end(buf: np.ndarray, i: int) -> int:
    """The end of the JSON number starting at i (-1 where it is no JSON number)."""
    if buf[i] == 0x2D:
        i += 1
    if buf[i] == 0x30:
        i += 1
    elif 0x31 <= buf[i] <= 0x39:
        while 0x30 <= buf[i] <= 0x39:
            i += 1
    else:
        return -1
    if buf[i] == 0x2E:
        i += 1
        if not 0x30 <= buf[i] <= 0x39:
            return -1
        while 0x30 <= buf[i] <= 0x39:
            i += 1
    if buf[i] == 0x65 or buf[i] == 0x45:
        i += 1
        if buf[i] == 0x2B or buf[i] == 0x2D:
            i += 1
        if not 0x30 <= buf[i] <= 0x39:
            return -1
        while 0x30 <= buf[i] <= 0x39:
            i += 1
    return i


@njit(cache=True, nogil=True, _nrt=False)
def exact_value(buf: np.ndarray, start: int, end: int, base: int) -> float:
    """The number written at [start, end) less `base`, where that is exact in one division; else NaN with the
    caller refusing (a JSON number is never NaN). `base` > 0 takes only `relative_times`' spelling."""
    i, negative = start, False
    if buf[i] == 0x2D:
        if base:
            return np.nan
        negative, i = True, i + 1
    whole, digits = 0, 0
    while i < end and 0x30 <= buf[i] <= 0x39:
        if digits == 18:
            return np.nan
        whole, digits, i = whole * 10 + int(buf[i] - 0x30), digits + 1, i + 1
    scale, fraction = 0, 0
    if i < end and buf[i] == 0x2E:
        i += 1
        while i < end and 0x30 <= buf[i] <= 0x39:
            if scale == 15:
                return np.nan
            fraction, scale, i = fraction * 10 + int(buf[i] - 0x30), scale + 1, i + 1
    if i != end:  # an exponent
        return np.nan
    if base:
        # As `relative_times` takes it: no sign, at most 17 whole digits, from the base on; divided, not multiplied,
        # so no product passes int64.
        if digits > 17 or whole < base or whole - base + 1 > MAX_MANTISSA // 10**scale:
            return np.nan
        whole -= base
    elif whole > MAX_MANTISSA // 10**scale:
        return np.nan
    mantissa = whole * 10**scale + fraction
    if mantissa > MAX_MANTISSA:
        return np.nan
    value = mantissa / _POW10[scale]
    return -value if negative else value


@njit(cache=True, nogil=True, _nrt=False)
def skip_value(buf: np.ndarray, i: int) -> int:
    """The end of the JSON value at i, validated as JSON (-1 where it is not, holds an escape, or nests past
    MAX_NESTING: the typed route reads it then)."""
    in_object = np.uint64(0)  # bit d: level d+1 is an object (else an array)
    depth = 0
    while True:
        i = ws(buf, i)
        c = buf[i]
        if c == 0x7B or c == 0x5B:  # { [
            i = ws(buf, i + 1)
            if buf[i] == c + 2:  # } ]: empty
                i += 1
            else:
                if depth == MAX_NESTING:
                    return -1
                bit = np.uint64(1) << np.uint64(depth)
                in_object = (in_object | bit) if c == 0x7B else (in_object & ~bit)
                depth += 1
                if c == 0x7B:
                    i = key_end(buf, i)
                    if i < 0:
                        return -1
                continue
        elif c == 0x22:
            i = string_end(buf, i + 1)
            if i < 0:
                return -1
            i += 1
        elif c == 0x2D or 0x30 <= c <= 0x39:
            i = number_end(buf, i)
            if i < 0:
                return -1
        else:
            i = literal_end(buf, i)
            if i < 0:
                return -1
        while depth:  # a value ended: close what it ends, or go on to the next
            i = ws(buf, i)
            c = buf[i]
            is_object = (in_object >> np.uint64(depth - 1)) & np.uint64(1)
            if c == 0x2C:
                i += 1
                if is_object:
                    i = key_end(buf, ws(buf, i))
                    if i < 0:
                        return -1
                break
            if c == (0x7D if is_object else 0x5D):
                depth -= 1
                i += 1
            else:
                return -1
        if not depth:
            return i


@njit(cache=True, nogil=True, _nrt=False)
def key_end(buf: np.ndarray, i: int) -> int:
    """Past `"key" :` at i; -1 where none is there."""
    if buf[i] != 0x22:
        return -1
    i = string_end(buf, i + 1)
    if i < 0:
        return -1
    i = ws(buf, i + 1)
    return i + 1 if buf[i] == 0x3A else -1


@njit(cache=True, nogil=True, _nrt=False)
def literal_end(buf: np.ndarray, i: int) -> int:
    c = buf[i]
    if c == 0x74 and buf[i + 1] == 0x72 and buf[i + 2] == 0x75 and buf[i + 3] == 0x65:
        return i + 4
    if c == 0x66 and buf[i + 1] == 0x61 and buf[i + 2] == 0x6C and buf[i + 3] == 0x73 and buf[i + 4] == 0x65:
        return i + 5
    if c == 0x6E and buf[i + 1] == 0x75 and buf[i + 2] == 0x6C and buf[i + 3] == 0x6C:
        return i + 4
    return -1


@njit(cache=True, nogil=True, _nrt=False)
def integer_end(buf: np.ndarray, i: int) -> int:
    """The end of an integer at i written as `str(int)` writes it back (no `-0`) and of at most 18 digits, which
    int64 holds (the typed schema's lane type, and orjson keeps a larger one to 2**64 only); else -1."""
    start = i
    if buf[i] == 0x2D:
        i += 1
        if buf[i] == 0x30:
            return -1
    end = number_end(buf, i)
    if end < 0 or end - i > 18:
        return -1
    for j in range(i, end):
        if not 0x30 <= buf[j] <= 0x39:
            return -1
    return end if end > start else -1
