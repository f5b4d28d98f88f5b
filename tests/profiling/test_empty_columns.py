"""Empty args columns cost no memory: the reader leaves a column no event filled as its missing value repeated
by a zero stride, and `rows_of`/`rows_where` keep a column that is missing in every row taken so; every value
still reads as a plain copy would give it (checked against `iloc`, and against the JSON by a plain loop)."""

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from profiling.columns import NUMERIC_ARGS, OBJECT_ARGS
from profiling.reader import CHUNK_BYTES, read_text
from profiling.trace import load_trace, parse_trace, rows_of, rows_where
from tests.conftest import DATA

REAL = DATA / "sampled_training_rank0.json.gz"
GPU = sorted((DATA / "gpu").glob("*.json.gz"))


def repeats(array: np.ndarray) -> bool:
    return len(array) > 1 and array.strides == (0,)


def event(i: int, **args: object) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}", "pid": 1, "tid": 1, "ts": i, "dur": 1, "args": args}


def test_a_column_no_event_fills_is_a_read_only_repeat_and_one_filled_later_holds_missing_before():
    # Enough events for several batches: `grid` arrives only in the last event, `bytes` in none.
    count = 3 * CHUNK_BYTES // 100
    events = [event(i, **{"External id": i}) for i in range(count)]
    events[-1]["args"]["grid"] = [4, 1, 1]
    raw = read_text(json.dumps({"traceEvents": events}).encode())
    columns = raw.columns
    assert len(columns["ts"]) == count
    for name in ("bytes", "registers", "stream"):
        assert repeats(columns[name]) and np.isnan(columns[name]).all() and not columns[name].flags.writeable
    for name in ("block", "input_dims"):
        assert repeats(columns[name]) and all(v is None for v in columns[name][:3])
    assert not repeats(columns["grid"]) and columns["grid"][-1] == [4, 1, 1]
    assert all(v is None for v in columns["grid"][:-1])
    assert not repeats(columns["external_id"])
    np.testing.assert_array_equal(columns["external_id"], np.arange(count, dtype=np.float64))


@pytest.mark.parametrize("path", [REAL, *GPU], ids=lambda p: p.name)
def test_the_empty_columns_of_a_real_trace_are_exactly_those_no_event_fills(path):
    # The oracle: a plain loop over the JSON's events. A numeric arg is filled by a number (ROCm's text
    # "bytes" reads as none), an object arg by any value but null; torch 1.8-1.9's spellings count as today's.
    spellings = {"external id": "External id", "Input dims": "Input Dims"}
    filled = set()
    for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]:
        args = e.get("args") if isinstance(e, dict) else None
        for key, value in args.items() if isinstance(args, dict) else ():
            key = spellings.get(key, key)
            if (key in OBJECT_ARGS and value is not None) or (key in NUMERIC_ARGS and type(value) in (int, float)):
                filled.add(key)
    trace = load_trace(path)
    empty = {key for key, column in {**NUMERIC_ARGS, **OBJECT_ARGS}.items() if repeats(trace.events[column].to_numpy())}
    assert empty == {*NUMERIC_ARGS, *OBJECT_ARGS} - filled
    assert empty  # every one of these traces leaves some args column empty


@pytest.mark.parametrize("path", [REAL, *GPU[:3]], ids=lambda p: p.name)
def test_rows_of_reads_as_iloc_and_keeps_columns_empty_in_the_rows_taken_as_repeats(path):
    trace = load_trace(path)
    ev = trace.events
    rng = np.random.default_rng(7)
    for rows in (
        np.flatnonzero(ev["cat"].eq("kernel").to_numpy()),
        np.flatnonzero(ev["cat"].eq("cpu_op").to_numpy()),
        np.sort(rng.choice(len(ev), size=min(500, len(ev)), replace=False)),
        rng.permutation(len(ev))[:50],  # any order, as iloc takes it
        np.array([], dtype=np.int64),
    ):
        taken = rows_of(ev, rows)
        pd.testing.assert_frame_equal(taken, ev.iloc[rows])
        for name in ev.columns:
            values = taken[name].to_numpy()
            if isinstance(taken[name].dtype, np.dtype) and len(rows) > 1:
                assert repeats(values) == bool(pd.isna(values).all()), name


def test_a_kernel_frame_holds_no_bytes_for_the_args_kernels_never_have():
    trace = load_trace(REAL)
    kernels = trace.kernels
    assert len(kernels) > 1000
    for name in ("input_dims", "input_type", "concrete_inputs", "python_id", "alloc_bytes"):
        assert repeats(kernels[name].to_numpy()), name
    for name in ("ts", "dur", "correlation", "registers", "grid"):
        assert not repeats(kernels[name].to_numpy()), name
    # What the frame's arrays hold, counted from their strides: the empty columns add nothing.
    held = sum(kernels[c].to_numpy().nbytes for c in kernels.columns if not repeats(kernels[c].to_numpy()))
    assert held < 8 * len(kernels) * len(kernels.columns) * 0.8


def test_rows_where_is_a_boolean_selection():
    trace = parse_trace(
        json.dumps({"traceEvents": [event(i, grid=[i, 1, 1] if i % 3 else None) for i in range(9)]}).encode()
    )
    ev = trace.events
    mask = (ev["ts"] % 3 == 0).to_numpy()
    pd.testing.assert_frame_equal(rows_where(ev, mask), ev[mask])
    assert repeats(rows_where(ev, mask)["grid"].to_numpy())  # None in every row kept
    assert not repeats(rows_where(ev, ~mask)["grid"].to_numpy())


def test_rows_of_keeps_an_object_column_of_texts_and_none_as_objects():
    # pandas infers `str` for a bare object array of texts, and None would read as NaN: the frame of kernels
    # must keep None where a kernel has no block (occupancy reads None as "no block", NaN as a bad one).
    events = [
        {"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": 1, "dur": 1, "args": {"block": "x"}},
        {"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": 7, "ts": 3, "dur": 1, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, "ts": 5, "dur": 1, "args": {"block": [1]}},
    ]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    kernels = trace.kernels
    assert kernels["block"].dtype == object and kernels["block"].tolist() == ["x", None]
    plain = trace.events[trace.events["cat"] == "kernel"]
    pd.testing.assert_frame_equal(kernels.astype({"name": plain["name"].dtype}), plain)  # names: test_name_codes
