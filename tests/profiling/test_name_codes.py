"""The kernel and GPU frames hold their names as a Categorical made from the trace's one factorization of
names, so the dozen group-bys on them read integer codes; every name still reads as the JSON writes it
(checked by a plain loop over the file), and `codes_of` factorizes as `pd.factorize` does."""

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from profiling.names import MAX_NAME_CHARS
from profiling.trace import codes_of, load_trace, parse_trace
from tests.conftest import DATA

TRACES = [DATA / "sampled_training_rank0.json.gz", *sorted((DATA / "gpu").glob("*.json.gz"))]
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def plain_names(path, categories: set[str]) -> list[str]:
    """Names of the complete events of `categories`, in file order, by a plain loop over the JSON."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [e["name"][:MAX_NAME_CHARS] for e in events if e.get("ph") == "X" and e.get("cat") in categories]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_kernel_names_read_as_the_json_writes_them(path):
    trace = load_trace(path)
    for frame, categories in ((trace.kernels, {"kernel", "Kernel"}), (trace.gpu_activity, GPU_CATEGORIES)):
        names = frame["name"]
        assert isinstance(names.dtype, pd.CategoricalDtype)
        assert names.astype(object).tolist() == plain_names(path, categories)
        categories_seen = names.cat.categories.tolist()
        assert categories_seen == sorted(set(names.astype(object)))  # sorted, as pd.Categorical makes them; all used


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_codes_of_a_frame_of_kernels_is_pd_factorize_of_its_names(path):
    names = load_trace(path).gpu_activity["name"]
    codes, uniques = codes_of(names)
    expected_codes, expected_uniques = pd.factorize(names.astype(object).to_numpy())
    np.testing.assert_array_equal(codes, expected_codes)
    assert list(uniques) == list(expected_uniques)


@pytest.mark.parametrize("values", [["b", None, "a", "b", None, "c"], [None, "x"], ["x", "y", None], [None], []])
def test_codes_of_keeps_a_missing_name_missing_wherever_it_first_comes(values):
    categorical = pd.Series(pd.Categorical(values, categories=sorted({v for v in values if v})))
    codes, uniques = codes_of(categorical)
    expected_codes, expected_uniques = pd.factorize(np.array(values, dtype=object))
    np.testing.assert_array_equal(codes, expected_codes)
    assert list(uniques) == list(expected_uniques)
    plain_codes, plain_uniques = codes_of(pd.Series(values, dtype=object))  # not a Categorical: pd.factorize itself
    np.testing.assert_array_equal(plain_codes, expected_codes)


def test_a_kernel_without_a_name_is_missing_in_its_frame():
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1},
        {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": 3, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 9},
    ]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    expected = trace.events.loc[trace.kernels.index, "name"]
    assert trace.kernels["name"].astype(object).where(expected.notna()).tolist() == expected.astype(object).tolist()
    assert trace.kernels["name"].cat.categories.tolist() == sorted(expected.dropna().unique())


@pytest.mark.parametrize("as_categorical", [True, False])
def test_copy_names_are_found_once_per_distinct_name_and_a_missing_one_holds_nothing(as_categorical):
    from profiling.copy_causes import _names_with

    values = ["Memcpy HtoD (Pageable -> Device)", None, "kernel", "Memcpy HtoD (Pageable -> Device)", "Memset"]
    names = pd.Series(pd.Categorical(values)) if as_categorical else np.array(values, dtype=object)
    assert _names_with(names, "Memcpy", prefix=True).tolist() == [True, False, False, True, False]
    assert _names_with(names, "Pageable").tolist() == [True, False, False, True, False]
    assert _names_with(names[:0], "Memcpy").tolist() == []
