"""The native decoder (numba, profiling/native.py) against the typed one, block by block: on every batch of every
real trace, on odd values, on fuzzed events and on hostile bytes. It must give the typed decoder's block
exactly, or refuse the batch (None) so the typed route reads it; it never crashes or reads past its buffer.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiling import reader
from profiling.columns import Block
from profiling.reader import Limits, Splitter, TraceError, decode_batch, read_text
from profiling.scan import KEPT_DEPTH
from profiling.timestamps import Rebase
from tests.conftest import DATA
from tests.profiling.test_reader_typed import ODD, REAL, _same_read, _text

native = pytest.importorskip("profiling.native", reason="numba is not installed: every batch reads the typed way")
native_json = pytest.importorskip("profiling.native_json", reason="numba is not installed")
native_structure = pytest.importorskip("profiling.native_structure", reason="numba is not installed")


BYTES_PER_BRACE = native.MIN_BYTES_PER_BRACE


@pytest.fixture(autouse=True)
def _small_events_too(monkeypatch):
    """The cases here are a few short events each: read natively however small (the cap has its own test)."""
    monkeypatch.setattr(native, "MIN_BYTES_PER_BRACE", 1)


def _same_block(have: Block, want: Block) -> None:
    assert (have.seen, have.skipped, have.rows, have.lane_names) == (
        want.seen,
        want.skipped,
        want.rows,
        want.lane_names,
    )
    assert list(have.texts) == list(want.texts) and list(have.numbers) == list(want.numbers)
    for name, (codes, texts) in want.texts.items():
        assert have.texts[name][1] == texts, name
        assert np.array_equal(have.texts[name][0], codes), name
    for name, values in want.numbers.items():
        assert have.numbers[name].dtype == values.dtype, name
        assert np.array_equal(have.numbers[name], values, equal_nan=True), name
    assert list(have.objects) == list(want.objects)
    for name, (codes, keys, values) in want.objects.items():
        assert (have.objects[name][1], have.objects[name][2]) == (keys, values), name
        assert np.array_equal(have.objects[name][0], codes), name


def _batches(data: bytes) -> list[tuple[bytes, int]]:
    """A trace's batches and their bases, cut as the reader cuts them."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    splitter, rebase, out = Splitter(Limits()), Rebase(), []
    for at in range(0, len(data), 1 << 20):
        out += [(batch, rebase.settle(batch)) for batch in splitter.feed(data[at : at + (1 << 20)])]
    return out


def _agrees(text: bytes, base: int = 0) -> Block | None:
    """The native block of a batch, checked against the typed route's (None: refused)."""
    block = native.native_block(text, base)
    if block is not None:
        _same_block(block, decode_batch(text, base))
    return block


@pytest.mark.parametrize("path", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_batch_of_a_real_trace_reads_as_the_typed_decoder_reads_it_and_none_is_refused(path, monkeypatch):
    monkeypatch.setattr(native, "MIN_BYTES_PER_BRACE", BYTES_PER_BRACE)  # real events pass the real cap
    try:
        batches = _batches(path.read_bytes())
    except TraceError:  # a plugin case refused on purpose, before any decoder
        return
    refused = [i for i, (text, base) in enumerate(batches) if _agrees(text, base) is None]
    assert not refused, f"batches {refused} of {len(batches)} fell back to the typed route"


@pytest.mark.parametrize("entries", [1, 16, 1 << 16])
def test_batches_read_the_same_from_a_cache_of_any_size_however_full(monkeypatch, entries):
    """The texts decoded before (profiling/native_texts.py), from a cache too small for one batch (each batch's own
    decoded), emptied every few batches, or holding them all, give the same blocks; so does a second read."""
    native_texts = pytest.importorskip("profiling.native_texts")
    monkeypatch.setattr(native_texts, "MAX_ENTRIES", entries)
    caches: dict = {}
    monkeypatch.setattr(native, "text_cache", lambda decode: caches.setdefault(decode, native_texts.TextCache(decode)))
    monkeypatch.setattr(native, "MIN_BYTES_PER_BRACE", BYTES_PER_BRACE)
    path = next(p for p in REAL if p.name == "h100_qwen1.5-0.5b_prefill.json.gz")
    for _ in range(2):
        assert all(_agrees(text, base) is not None for text, base in _batches(path.read_bytes()))
    assert caches and all(len(cache.values) <= entries for cache in caches.values())


@pytest.mark.parametrize("case", sorted(ODD))
def test_odd_values_read_as_the_typed_decoder_reads_them_or_are_refused(case):
    for text, base in _batches(_text(case)):
        _agrees(text, base)


def test_what_the_plain_grammar_takes_and_what_it_leaves_to_the_typed_route():
    plain = b'[{"ph":"X","name":"a","pid":1,"tid":"s","ts":1.5,"dur":2,"args":{"bytes":"12","Input Dims":[[1]]}}]'
    assert native.native_block(plain) is not None
    refused = [
        b'[{"name":"a\\"b"}]',  # an escape
        b'[{"ph":"X","name":"a\\nb","ts":1,"dur":1}]',  # an escape the pass could mistake for two bytes
        b'[{"name":null}]',  # null where text goes
        b'[{"ts":1e3}]',  # an exponent
        b'[{"ts":12345678901234567890}]',  # more digits than one division reads exactly
        b'[{"pid":1.0}]',  # a float lane
        b'[{"pid":-0}]',  # a lane whose text int() would not write back
        b'[{"args":null}]',
        b'[{"args":{"stream":"7"}}]',  # text in a number other than "bytes"
        b'[{"args":{"stream":true}}]',
        b"[1]",
        b'[{"name":"a"},]',  # not JSON
        b'[{"x":[1,]}]',
        b'[{"x":tru}]',
        b'[{"name":"a"}] x',
        b'[{"name":"\xff"}]',  # not UTF-8
    ]
    for text in refused:
        assert native.native_block(text) is None, text


def test_numbers_near_the_exact_limit_read_as_a_parser_rounds_them_or_are_refused():
    # Around 2**53 units a division by 10**k is no longer one rounding; past int64 a product would wrap.
    texts = [f"{m // 10**k}.{m % 10**k:0{k}d}" for m in range(2**53 - 3, 2**53 + 40) for k in (1, 2, 3)]
    texts += ["9007199254740993", "0.000000000000001", "123456789.123456789012"]
    for text in texts:
        block = _agrees(b'[{"ph":"X","name":"a","ts":1,"dur":%s}]' % text.encode())
        if block is not None:
            assert block.numbers["dur"][0] == float(text), text
    base = 1_693_000_000_000_000 - 10**12
    for ts in ("0.000000000000001", "1693000000000000.000000000000001", "1694000000000000.000000000000001"):
        _agrees(b'[{"ph":"X","name":"a","ts":%s,"dur":1}]' % ts.encode(), base)


def test_equal_texts_are_one_text_whatever_follows_them():
    # The same short name followed by different bytes (the hash reads whole words): coded as one, as the typed
    # route codes it.
    after = [b",", b" ,", b"  ,", b"\n,", b"\t,", b"\r,", b" \n ,", b"   ,", b"\n\n,", b" \t,"]
    events = [b'{"ph":"X","name":"ab"%s"ts":%d,"dur":1}' % (tail, i) for i, tail in enumerate(after)]
    block = _agrees(b"[" + b",".join(events) + b"]")
    assert block is not None and block.texts["name"][1] == ["ab", ""]


def test_lane_ids_past_int64_read_as_the_reference_reads_them_or_are_refused():
    for lane in (2**63 - 1, 2**63, 10**19 + 1, 2**64, -(2**63)):
        _agrees(b'[{"ph":"X","name":"a","ts":1,"dur":1,"pid":%d,"tid":1}]' % lane)


def test_a_batch_of_tiny_events_is_left_to_the_typed_route(monkeypatch):
    # Rows of 440 bytes per `{`: a batch of `{}` would take 150 times its bytes here.
    monkeypatch.setattr(native, "MIN_BYTES_PER_BRACE", BYTES_PER_BRACE)
    tiny = b"[" + b",".join([b"{}"] * 10_000) + b"]"
    assert native.native_block(tiny) is None
    plain = b"[" + b",".join([b'{"ph":"X","name":"aten::mm","ts":1,"dur":2,"args":{"grid":[1,2,3]}}'] * 100) + b"]"
    assert len(plain) // plain.count(b"{") >= native.MIN_BYTES_PER_BRACE
    assert _agrees(plain) is not None


def test_a_ts_key_inside_args_sends_a_rebased_batch_to_the_typed_route():
    base = 1_700_000_000_000_000 - 10**12
    text = b'[{"ph":"X","name":"a","ts":1700000000000001.5,"dur":1,"args":{"ts":3}}]'
    assert native.native_block(text, base) is None
    assert _agrees(text.replace(b',"args":{"ts":3}', b""), base) is not None


_KEYS = ["name", "cat", "ph", "ts", "dur", "pid", "tid", "args", "id", "s"]
_ARG_KEYS = ["External id", "external id", "correlation", "stream", "bytes", "grid", "Input Dims", "Input dims",
             "Input type", "Concrete Inputs", "name", "labels", "Ev Idx", "ts"]  # fmt: skip
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**65), 2**65),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, 7, 1.5, 1694039968955744, 1694039968955744.123, -3, 2**53, 2**53 + 1]),
    st.text(max_size=6),
    st.sampled_from(["X", "M", "i", "kernel", "aten::mm", "process_name", "", "7", "é"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
_args = st.dictionaries(st.sampled_from(_ARG_KEYS), _values, max_size=6) | _values
_events = st.lists(
    st.dictionaries(st.sampled_from(_KEYS), _values, max_size=8).flatmap(
        lambda event: st.just(event) if "args" not in event else _args.map(lambda a: {**event, "args": a})
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_events, spaced=st.booleans(), base=st.sampled_from([0, 1_693_000_000_000_000]))
def test_fuzzed_events_read_as_the_typed_decoder_reads_them_or_are_refused(events, spaced, base):
    text = json.dumps(events, indent=1 if spaced else None, ensure_ascii=False).encode()
    _agrees(text, base)


@settings(max_examples=300, deadline=None)
@given(cut=st.integers(0, 400), noise=st.binary(max_size=12), at=st.integers(0, 400))
def test_hostile_bytes_are_refused_or_read_right_and_never_crash(cut, noise, at):
    real = _batches((DATA / "a100_simple_add.json.gz").read_bytes())[0][0][:3000]
    text = real[: min(cut, len(real))] + noise + real[min(at, len(real)) :]
    block = native.native_block(text)
    if block is not None:  # then the typed route must read it too, and alike
        _same_block(block, decode_batch(text, 0))


def test_spans_that_hash_alike_are_still_told_apart():
    # Same length, same first, middle and last words: only the bytes between tell these names apart.
    names = [f"{'a' * 8}{i:02d}{'b' * 12}{i:02d}{'c' * 8}" for i in range(40)]
    events = [{"ph": "X", "name": n, "ts": i, "dur": 1} for i, n in enumerate(names * 2)]
    block = _agrees(json.dumps(events).encode())
    assert block is not None and block.texts["name"][1][:-1] == names


def test_a_large_trace_reads_the_same_with_the_native_decoder_as_without(monkeypatch, tmp_path):
    from bench.synthetic import replicate

    path = tmp_path / "replica.json.gz"
    replicate(DATA / "sampled_training_rank0.json.gz", 6, path)  # ~9.7 MB of JSON: past NATIVE_AFTER_BYTES
    data = path.read_bytes()
    used = []
    real_block = native.native_block
    monkeypatch.setattr(native, "native_block", lambda *a: used.append(1) or real_block(*a))
    monkeypatch.setattr(reader, "helper_wanted", lambda: False)  # every batch decoded here, where it is counted
    monkeypatch.setenv(reader.NATIVE_ENV, "1")
    with_native = read_text(data)
    assert used, "the native decoder never ran"
    monkeypatch.setenv(reader.NATIVE_ENV, "0")
    used.clear()
    _same_read(with_native, read_text(data))
    assert not used


def test_a_read_takes_the_native_decoder_where_asked_loaded_or_large(monkeypatch, tmp_path):
    monkeypatch.delitem(__import__("sys").modules, "numba", raising=False)  # as in a fresh CLI
    monkeypatch.delenv(reader.NATIVE_ENV, raising=False)
    assert not reader.native_wanted(reader.NATIVE_FROM_BYTES - 1)
    assert reader.native_wanted(reader.NATIVE_FROM_BYTES)
    monkeypatch.setenv(reader.NATIVE_ENV, "0")
    assert not reader.native_wanted(reader.NATIVE_FROM_BYTES)
    monkeypatch.setenv(reader.NATIVE_ENV, "1")
    assert reader.native_wanted(0)
    # The JSON a file holds: its size, or a gzip's record of its inflated size.
    gz = DATA / "a100_simple_add.json.gz"
    assert reader._file_json_bytes(gz) == len(gzip.decompress(gz.read_bytes()))
    plain = tmp_path / "t.json"
    plain.write_bytes(b'{"traceEvents": []}')
    assert reader._file_json_bytes(plain) == 19
    assert reader._file_json_bytes(tmp_path / "absent.json") == 0


def test_without_numba_the_reader_reads_the_typed_way():
    import subprocess
    import sys

    code = (
        "import os, sys; sys.modules['numba'] = None; os.environ['PROFILING_NATIVE'] = '1'; "
        "from profiling import reader; reader.NATIVE_AFTER_BYTES = 0; "
        "print(reader.native_ready(), len(reader.read_path(__import__('pathlib').Path("
        "'tests/data/a100_simple_add.json.gz')).columns['ts']))"
    )
    root = Path(__file__).parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [
        "False",
        str(len(read_text((DATA / "a100_simple_add.json.gz").read_bytes()).columns["ts"])),
    ], out.stderr


_PIECES = [b"{", b"}", b"[", b"]", b",", b'"', b"\\", b"a", b" ", b":", b'\\"', b"\\\\"]


def _scan_of(splitter: Splitter, chunk: bytes) -> tuple[object, ...]:
    """What `_structure` gives for a chunk, as comparable values: the marks `_route` reads, the state after,
    or the error."""
    try:
        positions, kinds, depths = splitter._structure(chunk)
    except TraceError as exc:
        return ("error", str(exc))
    kept = depths <= KEPT_DEPTH
    marks = (positions[kept].tolist(), kinds[kept].tolist(), depths[kept].tolist())
    return (*marks, splitter.in_string, splitter.escape_pending, splitter.depth)


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(_PIECES), max_size=80),
    cuts=st.lists(st.integers(0, 200), max_size=4),
    depth=st.sampled_from([3, 32]),
)
def test_the_compiled_scan_finds_the_marks_the_numpy_scan_finds(pieces, cuts, depth):
    data = b"".join(pieces)
    numpy_scan, compiled_scan = Splitter(Limits(depth=depth)), Splitter(Limits(depth=depth))
    compiled_scan.compiled = native_structure.structure
    bounds = sorted({0, len(data), *(min(cut, len(data)) for cut in cuts)})
    for start, end in itertools.pairwise(bounds):  # an escape may be cut from its pair here
        want = _scan_of(numpy_scan, data[start:end])
        assert _scan_of(compiled_scan, data[start:end]) == want
        if want[0] == "error":
            break


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_the_compiled_scan_finds_the_numpy_scans_marks_across_many_blocks(byteorder, monkeypatch):
    # Texts of many 64-byte blocks: backslash runs and quotes across block bounds, escapes at a block's last byte,
    # chunks cut anywhere (a block's masks at any offset, the bytes under a block by the byte loop). On a big-endian
    # machine every byte takes the byte loop.
    monkeypatch.setattr(native_structure, "sys", SimpleNamespace(byteorder=byteorder))
    rng = np.random.default_rng(64)
    for trial in range(300 if byteorder == "little" else 60):
        weights = rng.dirichlet(np.ones(len(_PIECES)))
        data = b"".join(_PIECES[i] for i in rng.choice(len(_PIECES), int(rng.integers(0, 3_000)), p=weights))
        numpy_scan, compiled_scan = Splitter(Limits(depth=10**6)), Splitter(Limits(depth=10**6))
        compiled_scan.compiled = native_structure.structure
        cuts = rng.integers(0, len(data) + 1, int(rng.integers(0, 6)))
        for start, end in itertools.pairwise(sorted({0, len(data), *cuts.tolist()})):
            want = _scan_of(numpy_scan, data[start:end])
            assert _scan_of(compiled_scan, data[start:end]) == want, (trial, start, end)
            if want[0] == "error":
                break


def test_a_read_with_the_compiled_scan_refuses_what_the_numpy_scan_refuses(monkeypatch):
    monkeypatch.setattr(reader, "NATIVE_AFTER_BYTES", 0)
    deep = b'{"traceEvents": [' + b"[" * 40 + b"]" * 40 + b"]}"
    for env in ("1", "0"):
        monkeypatch.setenv(reader.NATIVE_ENV, env)
        with pytest.raises(TraceError, match="nested deeper than 32 levels"):
            read_text(deep)
