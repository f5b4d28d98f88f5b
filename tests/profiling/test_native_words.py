"""The native decoder's word-at-a-time pieces (profiling/native_json.py, native_scan.py) against a byte at a time:
a word read at any offset, a string's end found eight bytes a step, and spans compared eight bytes a step, wherever
the bytes that matter fall against the eight-byte steps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

native_json = pytest.importorskip("profiling.native_json", reason="numba is not installed: no native decoder")
from profiling.native_scan import same_bytes  # noqa: E402

PADDING = native_json.PADDING


def _buffer(data: bytes) -> np.ndarray:
    return np.frombuffer(data + bytes(PADDING), np.uint8)


def _plain_string_end(data: bytes, i: int) -> int:
    """string_end a byte at a time, as it was written before."""
    while True:
        c = data[i] if i < len(data) else 0
        if c == 0x22:
            return i
        if c == 0x5C or c < 0x20:
            return -1
        i += 1


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 39))
def test_a_word_is_the_eight_bytes_from_any_offset_little_endian(data, at):
    at = min(at, len(data))
    assert native_json.word(_buffer(data), at) == int.from_bytes((data + bytes(PADDING))[at : at + 8], "little")


# Bytes the string scan flags (a quote, a backslash, control bytes, the top of the ASCII range and past it, bytes
# just above and below each), among plain ones, so that each falls at every place in an eight-byte step.
_byte = st.sampled_from(b'"\\\x00\x01\x1f\x20\x21\x5b\x5d\x7f\x80\xa2\xdc\xff' + b"aZ0 ").map(lambda b: bytes([b]))


@settings(max_examples=1500, deadline=None)
@given(st.lists(_byte, max_size=40).map(b"".join), st.integers(0, 40))
def test_a_strings_end_is_found_eight_bytes_a_step_where_a_byte_at_a_time_finds_it(data, start):
    start = min(start, len(data))
    assert native_json.string_end(_buffer(data), start) == _plain_string_end(data, start)


@pytest.mark.parametrize("length", range(0, 34))
def test_a_strings_end_after_any_run_of_plain_bytes(length):
    for last in (b'"', b"\\", b"\x1f", b""):
        data = b"x" * length + last + b'"'
        assert native_json.string_end(_buffer(data), 0) == _plain_string_end(data, 0)


@settings(max_examples=800, deadline=None)
@given(st.binary(min_size=1, max_size=30), st.integers(0, 29), st.integers(0, 255), st.integers(0, 5))
def test_spans_compare_equal_exactly_when_their_bytes_are_equal(text, at, byte, shift):
    """`same_bytes` on a span and a copy of it placed elsewhere, with one byte changed or not, and bytes past both."""
    at = at % len(text)
    changed = text[:at] + bytes([byte]) + text[at + 1 :]
    a = _buffer(b"#" * shift + text + b"tail")
    b = _buffer(b"%" * (5 - shift) + changed + b"rest")
    assert same_bytes(a, shift, b, 5 - shift, len(text)) == (text == changed)
    for length in range(len(text) + 1):  # every prefix
        assert same_bytes(a, shift, b, 5 - shift, length) == (text[:length] == changed[:length])
