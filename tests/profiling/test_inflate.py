"""The gzip step of the reader (profiling/scan.py `inflated`): ISA-L's igzip where installed, zlib where not,
byte for byte the same text and the same refusals."""

from __future__ import annotations

import gzip
import itertools
import zlib

import pytest

from profiling import scan
from profiling.scan import TraceError, inflated

isal_zlib = pytest.importorskip("isal.isal_zlib", reason="isal is not installed: only zlib to test")
EVENTS = b",".join(b'{"ph":"X","name":"k%d","ts":%d,"dur":1}' % (i, i) for i in range(50_000))
TEXT = b'{"traceEvents": [' + EVENTS + b"]}"


@pytest.fixture(params=["isal", "zlib"])
def inflater(request, monkeypatch):
    monkeypatch.setattr(scan, "_gzip", isal_zlib if request.param == "isal" else zlib)
    return request.param


def _inflate(data: bytes, limit: int = 1 << 30, chunk: int = 4096) -> bytes:
    return b"".join(inflated(iter([data[i : i + chunk] for i in range(0, len(data), chunk)]), limit))


def test_the_reader_inflates_with_igzip_where_installed():
    assert scan._gzip is isal_zlib


@pytest.mark.parametrize("level", [1, 9])
def test_one_member_inflates_to_the_text(inflater, level):
    assert _inflate(gzip.compress(TEXT, compresslevel=level)) == TEXT


def test_members_one_after_another_inflate_to_their_texts_joined(inflater):
    cuts = [0, 1000, 250_000, 250_001, len(TEXT)]
    data = b"".join(gzip.compress(TEXT[a:b]) for a, b in itertools.pairwise(cuts))
    assert _inflate(data) == TEXT


def test_a_truncated_member_is_refused(inflater):
    with pytest.raises(TraceError, match="truncated"):
        _inflate(gzip.compress(TEXT)[:-9])


def test_corrupt_data_is_refused(inflater):
    data = bytearray(gzip.compress(TEXT))
    data[40:80] = b"\xff" * 40
    with pytest.raises(TraceError, match="corrupt"):
        _inflate(bytes(data))


def test_a_bomb_stops_one_step_past_the_cap(inflater):
    bomb = gzip.compress(b" " * (64 * 1024**2), compresslevel=9)
    produced = []
    with pytest.raises(TraceError, match="inflates to more than"):
        for piece in inflated(iter([bomb]), 1024**2):
            produced.append(len(piece))
    assert sum(produced) <= 1024**2  # every byte handed on was within the cap
