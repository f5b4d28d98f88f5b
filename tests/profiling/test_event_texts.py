"""The events' text columns as codes (profiling/event_texts.py): each test by code gives what pandas gives by
hashing the strings, on odd arrays (equal texts in distinct objects, None, NaN) and on real traces, whose
names and categories are also checked against a plain loop over the JSON."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from profiling.event_texts import EventTexts, factorized_objects, recoded, smallest_codes
from profiling.structure import structure
from profiling.trace import LAUNCH_CATEGORIES, load_trace
from tests.conftest import DATA

TRACES = [DATA / "sampled_training_rank0.json.gz", *sorted((DATA / "gpu").glob("*.json.gz"))]
TEXT_COLUMNS = ("name", "cat", "ph", "pid", "tid")


def _fresh(text: str) -> str:
    """An equal text in a new object (CPython shares the objects of one-character texts, so those stay shared)."""
    return "".join(list(text))


values = st.lists(
    st.one_of(
        st.sampled_from(["aten::mm", "kernel", "a", "", "ñ"]),
        st.sampled_from(["aten::mm", "kernel", "a", "", "ñ"]).map(_fresh),
        st.none(),
        st.just(math.nan),
        st.text(max_size=4),
    ),
    max_size=60,
)


@given(values)
def test_factorized_objects_is_pd_factorize(items):
    array = np.array([*items, None], dtype=object)[:-1]  # an object array, whatever the items
    codes, uniques = factorized_objects(array)
    expected_codes, expected_uniques = pd.factorize(array)
    assert codes.tolist() == expected_codes.tolist()
    assert list(uniques) == list(expected_uniques)


def test_equal_texts_in_distinct_objects_get_one_code():
    first, second = "aten::" + "mm", _fresh("aten::mm")
    assert first is not second
    codes, uniques = factorized_objects(np.array([first, "x", second, None, first], dtype=object))
    assert codes.tolist() == [0, 1, 0, -1, 0] and list(uniques) == ["aten::mm", "x"]


def test_recoded_numbers_some_rows_again_and_keeps_missing():
    codes, texts = recoded(np.array([2, -1, 0, 2, 1]), np.array(["a", "b", "c"], dtype=object))
    assert codes.tolist() == [0, -1, 1, 0, 2] and list(texts) == ["c", "a", "b"]


@pytest.mark.parametrize(("distinct", "dtype"), [(1, np.int8), (127, np.int8), (128, np.int16), (40_000, np.int32)])
def test_codes_take_the_narrowest_type_that_holds_them(distinct, dtype):
    codes = smallest_codes(np.array([-1, distinct - 1]), distinct)
    assert codes.dtype == dtype and codes.tolist() == [-1, distinct - 1]


def _plain(path) -> list[dict]:
    return [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if isinstance(e, dict)]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_tests_by_code_give_what_pandas_gives_on_real_traces(path):
    trace = load_trace(path)
    texts, events = EventTexts(trace.events), trace.events
    rows = np.flatnonzero(events["ph"].to_numpy() == "X")[::3]
    for column in TEXT_COLUMNS:
        codes, uniques = texts.codes(column)
        expected_codes, expected_uniques = pd.factorize(events[column].to_numpy())
        assert codes.tolist() == expected_codes.tolist() and list(uniques) == list(expected_uniques)
        common = pd.Series(events[column]).value_counts().index[:3].tolist()
        wanted = [*common, "no such text"]
        assert texts.isin(column, wanted).tolist() == events[column].isin(wanted).tolist()
        assert texts.isin(column, wanted, rows).tolist() == events[column].isin(wanted).to_numpy()[rows].tolist()
        assert texts.equals(column, common[0]).tolist() == (events[column] == common[0]).tolist()
        test = lambda text: text.startswith("aten::") or text.endswith("7")  # noqa: E731
        by_loop = [isinstance(t, str) and test(t) for t in events[column].to_numpy()]
        assert texts.isin(column, test).tolist() == by_loop
        of_rows = texts.of_rows(column, rows)
        expected = pd.factorize(events[column].to_numpy()[rows])
        assert of_rows[0].tolist() == expected[0].tolist() and list(of_rows[1]) == list(expected[1])


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_kernels_aten_ops_and_launches_by_code_count_as_a_plain_loop_over_the_json(path):
    trace, plain = load_trace(path), [e for e in _plain(path) if e.get("ph") == "X" and "dur" in e]
    kernels = sum(e.get("cat") == "kernel" for e in plain)
    assert int((trace.texts.equals("cat", "kernel") & trace.texts.equals("ph", "X")).sum()) == kernels
    aten = sum(e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::") for e in plain)
    assert int(structure(trace).is_aten.sum()) == aten
    launches = sum(e.get("cat") in LAUNCH_CATEGORIES for e in plain)  # these traces spell launches as CUDA's
    complete_launches = trace.texts.isin("cat", LAUNCH_CATEGORIES) & trace.texts.equals("ph", "X")
    assert launches > 0 and int(complete_launches.sum()) == launches
