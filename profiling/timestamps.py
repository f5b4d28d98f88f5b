"""Epoch timestamps with nanosecond digits, read relative to a base so that no digit is lost.

`Rebase` decides a base; `relative_times` reads a batch's `ts` texts relative to it, and where a batch's are
not all plainly written, `rebased` rewrites its text relative to it before any parser turns its `ts` into
floats. The reader keeps the base on the trace (`RawTrace.ts_base_us`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import Context, Decimal

import numpy as np

# Times are microseconds since some epoch: 1e17 us is 3,000 years. Beyond it a time is junk (the reader
# reads it as missing), and sums or differences of such times would overflow to infinity in the analysis.
MAX_TIME_US = 1e17

# float64 holds whole numbers exactly up to 2**53, so microseconds with ns digits only below this
# many µs (104 days). Kineto wrote epoch microseconds (~1.7e15 µs in 2023) as `%d.%03d` before
# `baseTimeNanoseconds`; parsed as they stand they round to 0.25 µs steps there, back-to-back ns
# events collide, and an end (`ts + dur`) overhangs its parent's by a step, so the op tree loses
# calls. Such a file's `ts` are rewritten as text, before any parser makes them floats, relative to
# a base (`RawTrace.ts_base_us`): every ns digit is kept.
REBASE_FROM_US = 2**53 // 1000
# The base is this far before the first start: the files' first event is not always the earliest
# (Kineto writes its metadata events last, with earlier times), and a value left non-negative keeps
# its fraction as written. 1e12 µs (11.6 days) leaves every ns exact for 80 days after the base.
REBASE_MARGIN_US = 10**12
# A `"ts"` key: its quote follows `{`, `,` or a blank, which a quote inside a string never does (there
# it follows its escaping backslash). Checked behind the literal: a pattern that starts with it is
# searched for as a literal, five times faster.
_KEY = rb'"ts"(?<=[\s{,]"ts")\s*:\s*'
_NUMBER = rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"
_TS_FIRST = re.compile(_KEY + rb"(" + _NUMBER + rb")")
# The common spelling, rewritten with no Python per value but an int: a whole number of up to 17
# digits (under MAX_TIME_US, and `int()` stays off a hostile million-digit one), then a fraction or
# the value's end. The one-byte alternative catches any other value (an exponent, a minus sign, more
# digits, text); a batch with one goes to _TS_ANY, value by value.
_TS_WHOLE = re.compile(rb"(" + _KEY + rb")(?:(\d{1,17})(?=(?:\.\d+)?[,}\]\s])|(.))", re.DOTALL)
_TS_ANY = re.compile(rb"(" + _KEY + rb")(" + _NUMBER + rb")")
_EXACT = Context(prec=64)  # a rewritten value's digits: far more than float64 keeps


class Rebase:
    """Decides the base that every batch's `"ts":` numbers are read relative to (`relative_times`, `rebased`).

    The base is decided once, by the first `"ts":` number of the events: REBASE_MARGIN_US before its
    whole microseconds where it is written with a fraction or an exponent and lies from
    REBASE_FROM_US to MAX_TIME_US; else 0, and nothing is rewritten (whole numbers are exact in
    float64 up to 2**53, 285 years of µs). Deciding is a search in the first batch; the reading relative to it,
    a pure function of a batch and the base, runs wherever the batch is decoded (profiling/reader_pool.py).
    """

    def __init__(self) -> None:
        self.base: int | None = None  # None: no `"ts":` number seen yet

    def settle(self, batch: bytes) -> int:
        """The base, decided by this batch if no earlier one held a `"ts":` number (0 until one does)."""
        if self.base is None:
            first = _TS_FIRST.search(batch)
            if first is None:
                return 0
            self.base = _base_of(first.group(1))
        return self.base


def rebased(batch: bytes, base: int) -> bytes:
    """The batch with every `"ts"` key's number rewritten relative to `base` µs (unchanged for 0). Every
    `"ts"` key is rewritten, an `args` one too (the analysis reads none there); a value past MAX_TIME_US
    becomes null, as it would read anyway."""
    if not base:
        return batch
    parts = _TS_WHOLE.split(batch)  # text, key, whole µs, other, text, key, whole µs, other, ..., text
    if not any(parts[3::4]):
        del parts[3::4]
        wholes = list(map(int, parts[2::3]))
        if not wholes or min(wholes) >= base:  # below the base, the fraction would need subtracting
            parts[2::3] = [b"%d" % (whole - base) for whole in wholes]
            return b"".join(parts)
    return _TS_ANY.sub(lambda match: _relative(match, base), batch)


def relative_times(values: Sequence[bytes], base: int) -> list[float] | None:
    """The `ts` of a batch's events, each given as its JSON text (b"" where the event has none), as µs since
    `base`: the floats a parser reads from `rebased` text, without rewriting the text. None unless every
    text is plain digits, or digits, a point and digits (Kineto's `%d.%03d`); the caller rewrites the text then.

    Vectorized over the values of each length, and exact: a value is a whole number of 10**-k µs below 2**53,
    so one float division by 10**k rounds it once, correctly, as a parser rounds the decimal text
    (tests/profiling/test_timestamps.py).
    """
    lengths = np.fromiter(map(len, values), np.intp, count=len(values))
    widths = np.unique(lengths).tolist()
    if len(widths) == 1 and widths[0]:  # one length, none missing: the common batch
        return _of_width(values, widths[0], base)
    out = np.full(len(values), math.nan)
    for width in (w for w in widths if w):
        rows = np.flatnonzero(lengths == width)
        times = _of_width([values[i] for i in rows.tolist()], width, base)
        if times is None:
            return None
        out[rows] = times
    return out.tolist()


def _of_width(values: Sequence[bytes], width: int, base: int) -> list[float] | None:
    """`relative_times` of values all `width` bytes long, where each is written alike."""
    text = np.frombuffer(b"".join(values), np.uint8).reshape(len(values), width)
    head = bytes(text[0])
    has_point = b"." in head
    whole_digits = head.find(b".") if has_point else width
    scale = width - whole_digits - 1 if has_point else 0  # fraction digits
    # Past 17 whole digits a time passes MAX_TIME_US; JSON wants a digit before a point and after it.
    if not 0 < whole_digits <= 17 or (has_point and scale == 0):
        return None
    digits = (np.delete(text, whole_digits, axis=1) if has_point else text) - ord("0")  # uint8: below "0" wraps
    leading_zero = whole_digits > 1 and (digits[:, 0] == 0).any()  # not JSON: the parser refuses the batch
    if leading_zero or (digits > 9).any() or (has_point and (text[:, whole_digits] != ord(".")).any()):
        return None
    whole = digits[:, :whole_digits].astype(np.int64) @ _powers_of_ten(whole_digits)  # < 10**17: no overflow
    if (whole < base).any() or (int(whole.max()) - base + 1) * 10**scale > 2**53:
        return None
    exact = (whole - base) * 10**scale
    if scale:  # at most 15 digits here: 10**16 alone passes 2**53
        exact += digits[:, whole_digits:].astype(np.int64) @ _powers_of_ten(scale)
    return (exact / 10.0**scale).tolist()


def _powers_of_ten(count: int) -> np.ndarray:
    """10**(count-1), ..., 10, 1: the place values of `count` digits."""
    return np.int64(10) ** np.arange(count)[::-1]


def _relative(match: re.Match[bytes], base: int) -> bytes:
    """One value, exactly; a whole number stays one, and any other stays a float (an object arg may hold a
    "ts" key, and is kept as parsed)."""
    number = match.group(2)
    value = Decimal(number.decode())
    if abs(value) > MAX_TIME_US:  # junk, missing whatever the base; as a number it could read as valid
        return match.group(1) + b"null"
    text = format(_EXACT.subtract(value, base), "f")
    if re.search(rb"[.eE]", number) and "." not in text:
        text += ".0"
    return match.group(1) + text.encode()


def _base_of(number: bytes) -> int:
    """The base a file's first `ts` (its text) gives: 0, or REBASE_MARGIN_US before its whole µs."""
    if not re.search(rb"[.eE]", number):
        return 0
    value = Decimal(number.decode())
    return int(value) - REBASE_MARGIN_US if REBASE_FROM_US <= value <= MAX_TIME_US else 0
