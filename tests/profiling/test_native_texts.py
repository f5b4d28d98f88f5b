"""The native decoder's cache of decoded texts (profiling/native_texts.py): what it gives is each text decoded, as
decoding it there and then would give, whatever came before; each text is decoded once while it stays; and it
stays within its bounds, or steps aside, whatever the texts."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

native_texts = pytest.importorskip("profiling.native_texts", reason="numba is not installed: no native decoder")
from profiling.native_json import PADDING  # noqa: E402
from profiling.native_scan import MAX_PROBES  # noqa: E402


def _spans(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A buffer holding `texts` one after another (then PADDING zero bytes), and their spans in it."""
    lengths = np.array([len(t) for t in texts], np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    return np.frombuffer(b"".join(texts) + bytes(PADDING), np.uint8), starts, ends


class _Counted:
    """A decoder that records what it was asked to decode."""

    def __init__(self) -> None:
        self.asked: list[bytes] = []

    def __call__(self, text: bytes) -> str:
        self.asked.append(text)
        return text.decode()[::-1]


def _cache(monkeypatch, entries: int = native_texts.MAX_ENTRIES, arena: int = native_texts.ARENA_BYTES):
    monkeypatch.setattr(native_texts, "MAX_ENTRIES", entries)
    monkeypatch.setattr(native_texts, "ARENA_BYTES", arena)
    decode = _Counted()
    return native_texts.TextCache(decode), decode


def test_each_text_is_decoded_once_across_batches(monkeypatch):
    cache, decode = _cache(monkeypatch)
    first = [b"aten::mm", b"cudaLaunchKernel", b"", b"ampere_sgemm_128x64_nn"]
    second = [b"cudaLaunchKernel", b"aten::add_", b"aten::mm"]
    assert cache.decoded(*_spans(first)) == [t.decode()[::-1] for t in first]
    assert cache.decoded(*_spans(second)) == [t.decode()[::-1] for t in second]
    assert decode.asked == [*first, b"aten::add_"]


@pytest.mark.parametrize("at", [0, 5, 11])
def test_texts_of_one_length_that_differ_in_one_byte_are_told_apart(monkeypatch, at):
    # 94 texts in a table of 256 slots: many share a probe chain with another text of their length.
    texts = [b"kernel_%02d_nn" % 0 for _ in range(94)]
    texts = [t[:at] + bytes([0x21 + i]) + t[at + 1 :] for i, t in enumerate(texts)]
    cache, _ = _cache(monkeypatch, entries=128)
    assert cache.decoded(*_spans(texts)) == [t.decode()[::-1] for t in texts]
    assert cache.decoded(*_spans(texts[::-1])) == [t.decode()[::-1] for t in texts[::-1]]


# Texts from a small alphabet, short and long (a span past 8 and 16 bytes hashes four of its words), so that equal
# lengths, shared words and table slots shared by different texts are common.
_text = st.binary(max_size=40).map(lambda b: bytes(0x61 + x % 3 for x in b))
_batch = st.lists(_text, unique=True, max_size=12)


@settings(max_examples=300, deadline=None)
@given(batches=st.lists(_batch, max_size=8), entries=st.integers(1, 16), arena=st.integers(0, 200))
def test_what_it_gives_is_each_text_decoded_whatever_the_bounds_and_the_texts_before(batches, entries, arena):
    with pytest.MonkeyPatch.context() as monkeypatch:
        cache, decode = _cache(monkeypatch, entries, arena)
    for texts in batches:
        asked = len(decode.asked)
        got = cache.decoded(*_spans(texts))
        if got is None:  # the batch alone passes a bound
            assert len(texts) > entries or sum(map(len, texts)) > arena
            continue
        assert got == [t.decode()[::-1] for t in texts]
        assert set(decode.asked[asked:]) <= set(texts)  # only this batch's texts, each at most once
        assert len(set(decode.asked[asked:])) == len(decode.asked[asked:])
        used, count = cache.state
        assert count == len(cache.values) <= entries and used <= arena


def test_a_batch_past_what_is_left_empties_the_cache_and_one_past_the_bounds_is_left_to_the_caller(monkeypatch):
    cache, decode = _cache(monkeypatch, entries=4)
    assert cache.decoded(*_spans([b"a", b"b", b"c"])) == ["a", "b", "c"]
    assert cache.decoded(*_spans([b"d", b"e"])) == ["d", "e"]  # 5 texts: emptied, then d and e alone
    assert cache.values == ["d", "e"]
    assert cache.decoded(*_spans([b"a", b"b", b"c", b"d", b"e"])) is None  # nothing decoded, the cache emptied
    assert cache.decoded(*_spans([b"e"])) == ["e"]
    assert decode.asked == [b"a", b"b", b"c", b"d", b"e", b"e"]


def test_the_arena_bounds_the_bytes_kept(monkeypatch):
    cache, _ = _cache(monkeypatch, arena=10)
    assert cache.decoded(*_spans([b"abcdef", b"ghij"])) == ["fedcba", "jihg"]
    assert cache.decoded(*_spans([b"k"])) == ["k"]  # 11 bytes: emptied first
    assert cache.values == ["k"] and cache.decoded(*_spans([b"abcdefghijk"])) is None


def test_a_flood_of_texts_hashing_alike_is_left_to_the_caller(monkeypatch):
    # A 40-byte span's hash reads bytes 0-7, 13-20, 26-33 and 32-39: texts that differ only in bytes 8-12 share it.
    alike = [b"x" * 8 + b"%05d" % i + b"y" * 27 for i in range(MAX_PROBES + 2)]
    cache, _ = _cache(monkeypatch)
    assert cache.decoded(*_spans(alike[:MAX_PROBES])) == [t.decode()[::-1] for t in alike[:MAX_PROBES]]
    assert cache.decoded(*_spans(alike)) is None
    assert cache.decoded(*_spans([b"plain"])) == ["nialp"]


def test_a_decode_that_raises_leaves_no_text_without_its_value(monkeypatch):
    def decode(text: bytes) -> str:
        if text == b"bad":
            raise ValueError(text)
        return text.decode()

    monkeypatch.setattr(native_texts, "MAX_ENTRIES", 8)
    cache = native_texts.TextCache(decode)
    assert cache.decoded(*_spans([b"a"])) == ["a"]
    with pytest.raises(ValueError):
        cache.decoded(*_spans([b"b", b"bad", b"c"]))
    assert cache.decoded(*_spans([b"c", b"b", b"a"])) == ["c", "b", "a"]
    assert len(cache.values) == cache.state[1]


def test_each_thread_has_its_own_caches_and_each_decoder_its_own():
    here = native_texts.text_cache(bytes.decode)
    assert native_texts.text_cache(bytes.decode) is here
    assert native_texts.text_cache(bytes.hex) is not here
    there: list[object] = []
    thread = threading.Thread(target=lambda: there.append(native_texts.text_cache(bytes.decode)))
    thread.start()
    thread.join()
    assert there[0] is not here
