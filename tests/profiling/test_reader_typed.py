"""The typed reader (msgspec, profiling/decode.py) against the reference route (orjson into dicts), field by
field, on every real trace and on odd values (the decode helper: tests/profiling/test_reader_pool.py).

tests/profiling/test_reader.py checks the default (typed) reader against a plain loop over the JSON; here
the two routes of the reader must agree exactly, and real traces must take the typed one.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiling import decode
from profiling.reader import Limits, RawTrace, Splitter, TraceError, read_text
from profiling.timestamps import Rebase
from tests.conftest import DATA

SHARED = Path("/work/shared/traces")
REAL = sorted(
    {
        *DATA.glob("*.json.gz"),
        *(DATA / "gpu").glob("*.json.gz"),
        *(DATA / "vintages").glob("*.json"),
        *(DATA / "plugin_cases").rglob("*.json*"),
        DATA / "tb_plugin" / "resnet50_num_workers_4.pt.trace.json.gz",
        DATA / "tb_plugin" / "gpu_metrics_input.json",
        *SHARED.glob("**/*.json.gz"),
    }
)


def _same_read(have: RawTrace, want: RawTrace) -> None:
    assert (have.skipped, have.ts_base_us, have.metadata) == (want.skipped, want.ts_base_us, want.metadata)
    assert have.columns.keys() == want.columns.keys()
    for name, column in want.columns.items():
        # Series.equals: NaN equals NaN, lists compare by value, dtypes must match.
        assert pd.Series(have.columns[name]).equals(pd.Series(column)), name


def _typed_batches(data: bytes) -> tuple[int, int]:
    """(batches, batches the typed decoder refused) of a trace's text, cut and rebased as the reader does."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    splitter, rebase, batches, refused = Splitter(Limits()), Rebase(), 0, 0
    for at in range(0, len(data), 1 << 20):
        for batch in splitter.feed(data[at : at + (1 << 20)]):
            batches += 1
            refused += decode.typed_rows(batch, rebase.settle(batch)) is None
    return batches, refused


@pytest.mark.parametrize("path", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_traces_read_the_same_by_both_routes_and_take_the_typed_one(path):
    data = path.read_bytes()
    try:
        want = read_text(data, source=path.name, typed=False)
    except TraceError as exc:  # a plugin case may be refused on purpose: then by both routes, alike
        with pytest.raises(TraceError, match=str(exc)[:40].replace("(", r"\(")):
            read_text(data, source=path.name)
        return
    _same_read(read_text(data, source=path.name), want)
    batches, refused = _typed_batches(data)
    assert refused == 0, f"{refused} of {batches} batches fell back to the reference route"


ODD = {
    "old spellings": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": {"external id": 7, "Input dims": [[1, 2]]}}],
    "both spellings, new null": [
        {"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": {"External id": None, "external id": 3, "Input Dims": None}}
    ],
    "numbers as text": [{"ph": "X", "name": "a", "ts": "1", "dur": "2", "pid": "7", "args": {"bytes": "12"}}],
    "numbers as text in args": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": {"bytes": "12", "stream": "7"}}],
    "bools": [{"ph": "X", "name": True, "ts": 1, "dur": 2, "pid": True, "tid": False, "args": {"device": True}}],
    "nulls": [{"ph": None, "name": None, "ts": None, "dur": None, "pid": None, "tid": None, "args": None}],
    "null args": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": None}],
    "list args": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": [1, 2]}],
    "huge ints": [
        {
            "ph": "X",
            "name": "a",
            "ts": 10**30,
            "dur": 2,
            "pid": 2**64,
            "tid": -(2**63) - 1,
            "args": {"stream": 10**300, "bytes": -(10**30)},
        }
    ],
    "ints at the int64 edges": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 2**63 - 1, "tid": 2**63}],
    "float lanes": [{"ph": "X", "name": "a", "ts": 1.5, "dur": 0.25, "pid": 1.0, "tid": 1e20}],
    "not an object": [1, "x", None, [], {"ph": "X", "name": "a", "ts": 1, "dur": 2}],
    "lists where text goes": [{"ph": ["X"], "name": ["a"], "cat": {"k": 1}, "ts": 1, "dur": 2}],
    "nested values of every kind": [
        {"ph": "X", "name": "k", "cat": "kernel", "ts": 1, "dur": 2, "args": {"grid": [1, 2, 3], "block": "x"}},
        {"ph": "X", "name": "k", "cat": "kernel", "ts": 3, "dur": 2, "args": {"grid": {"x": 1}, "block": None}},
        {
            "ph": "X",
            "name": "o",
            "ts": 5,
            "dur": 1,
            "args": {"Input type": ["float", ""], "Concrete Inputs": ["", "1"]},
        },
        {"ph": "X", "name": "o", "ts": 6, "dur": 1, "args": {"Input Dims": [[2, 3], []], "Input type": 3}},
    ],
    "duplicate keys": None,  # written by hand below
    "nan text": [{"ph": "X", "name": "NaN", "ts": 1, "dur": 2, "args": {"bytes": "NaN"}}],
    "text in a number": [{"ph": "X", "name": "k", "ts": 1, "dur": 2, "args": {"stream": "7", "correlation": 3}}],
    "metadata": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}],
}


def _text(case: str) -> bytes:
    if case == "duplicate keys":  # the last value wins in both routes
        event = b'{"ph":"X","name":"a","name":"b","ts":1,"dur":2,"dur":"x","args":{"stream":1,"stream":2}}'
        return b'{"traceEvents":[' + event + b"]}"
    return json.dumps({"traceEvents": ODD[case], "deviceProperties": []}).encode()


@pytest.mark.parametrize("case", sorted(ODD))
def test_odd_values_read_as_the_reference_reads_them(case):
    data = _text(case)
    _same_read(read_text(data), read_text(data, typed=False))


def test_odd_batches_fall_back_and_plain_ones_do_not():
    assert decode.typed_rows(b'[{"ph":"X","ts":1,"args":{"bytes":"12"}}]') is not None
    # Text in an args number other than "bytes" (which ROCm writes as text): the reference reads it.
    odd_values = (b'[{"ts":true}]', b'[{"pid":18446744073709551616}]', b"[1]", b'[{"args":null}]', b'[{"name":1}]')
    for odd in (*odd_values, b'[{"args":{"stream":"7"}}]', b'[{"args":{"External id":"1"}}]'):
        assert decode.typed_rows(odd) is None, odd
    # Bytes msgspec would skip unchecked in a key it does not read, but orjson refuses: the reference decides.
    assert decode.typed_rows(b'[{"x":"\xff"}]') is None


def test_a_value_orjson_refuses_inside_a_kept_arg_is_refused_as_the_reference_refuses_it():
    data = b'{"traceEvents":[{"ph":"X","name":"a","ts":1,"dur":2,"args":{"grid":[1e400]}}]}'
    with pytest.raises(TraceError) as reference:
        read_text(data, typed=False)
    with pytest.raises(TraceError) as typed:
        read_text(data)
    assert str(typed.value) == str(reference.value)


def test_columns_have_the_types_the_analysis_expects():
    raw = read_text(_text("nested values of every kind"))
    assert raw.columns["grid"][0] == [1, 2, 3] and raw.columns["block"][1] is None
    assert raw.columns["input_dims"][3] == [[2, 3], []]
    assert raw.columns["ts"].dtype == np.float64 and raw.columns["name"].dtype == object
