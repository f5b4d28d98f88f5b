"""The events' text columns (name, cat, ph, pid, tid) as integer codes, made once per trace.

A test of every event's name or category against a few texts (`isin`, `==`) hashes each event's string:
about 80 ms per column of 3 million events, and the analysis of a big trace asked for dozens, a fifth of
its time (docs/benchmarks.md). With the column's codes made once, such a test is one lookup per distinct
text and a take per event.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Collection

import numpy as np
import pandas as pd

Codes = tuple[np.ndarray, np.ndarray]  # per row the code of its text (-1 where missing), the texts by code
Wanted = Collection[str] | Callable[[str], bool]  # texts, or a test of one


def smallest_codes(codes: np.ndarray, distinct: int) -> np.ndarray:
    """`codes` in the narrowest signed integer type that holds -1 to `distinct` - 1: a per-event array of a big
    trace is memory held for the whole analysis, and a category or a lane needs one byte, not eight."""
    for dtype in (np.int8, np.int16, np.int32):
        if distinct <= np.iinfo(dtype).max:
            return codes.astype(dtype, copy=False)
    return codes.astype(np.int64, copy=False)


def recoded(codes: np.ndarray, texts: np.ndarray) -> Codes:
    """Codes of some rows of a column (`codes` into `texts`, -1 missing) numbered again in order of first sight
    among those rows, and their texts: `pd.factorize` of those rows' texts, from integers rather than strings."""
    renumbered, first = pd.factorize(codes)
    missing = np.flatnonzero(first < 0)
    if len(missing):  # code -1 is a value to factorize: make it missing again
        at = int(missing[0])
        renumbered = np.where(renumbered == at, -1, renumbered - (renumbered > at))
        first = np.delete(first, at)
    return renumbered, np.asarray(texts, dtype=object)[first]


def factorized_objects(values: np.ndarray) -> Codes:
    """`pd.factorize(values)` of an object array, hashing each distinct object once rather than each row's.

    The reader keeps one object per distinct text (`column_store.Columns`), so the rows' object addresses are
    factorized as integers (7x faster than hashing the strings of 300k events); the distinct objects are
    then factorized by value, which merges equal texts held by distinct objects and makes None and NaN
    missing, exactly as `pd.factorize` would. Codes and values come in order of first sight, as there.
    """
    values = np.ascontiguousarray(values, dtype=object)
    if not len(values):
        return pd.factorize(values)
    # The array's pointers read as integers: valid while `values` holds the objects, as it does until we return.
    pointers = ctypes.cast(values.ctypes.data, ctypes.POINTER(ctypes.c_ssize_t))
    by_object, _ = pd.factorize(np.ctypeslib.as_array(pointers, shape=(len(values),)))
    # Codes in order of first sight: where the running maximum rises, an object is first seen.
    firsts = np.flatnonzero(np.diff(np.maximum.accumulate(by_object), prepend=-1) > 0)
    by_value, texts = pd.factorize(values[firsts])
    return by_value[by_object], texts


class EventTexts:
    """Codes of the text columns of one trace's `events`, each made on first use and kept."""

    def __init__(self, events: pd.DataFrame) -> None:
        self.events = events
        self._codes: dict[str, Codes] = {}

    def codes(self, column: str) -> Codes:
        """Per event the code of its `column` text (-1 where missing), and the distinct texts in order of first
        sight: `pd.factorize` of the column, made once."""
        if column not in self._codes:
            codes, texts = factorized_objects(self.events[column].to_numpy())
            self._codes[column] = smallest_codes(codes, len(texts)), np.asarray(texts, dtype=object)
        return self._codes[column]

    def of_rows(self, column: str, rows: np.ndarray) -> Codes:
        """`pd.factorize` of the `column` texts of `rows` (positions in `events`): codes in order of first sight
        among them, and their texts."""
        codes, texts = self.codes(column)
        return recoded(codes[rows], texts)

    def isin(self, column: str, wanted: Wanted, rows: np.ndarray | None = None) -> np.ndarray:
        """Whether each event's (or each of `rows`') `column` text is one of `wanted`, or passes the test `wanted`;
        a missing text never is. One test per distinct text, then a take per event."""
        codes, texts = self.codes(column)
        test = wanted if callable(wanted) else set(wanted).__contains__
        passes = np.fromiter((test(text) for text in texts), dtype=bool, count=len(texts))
        return np.append(passes, False)[codes if rows is None else codes[rows]]  # code -1 reads the last False

    def equals(self, column: str, text: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Whether each event's (or each of `rows`') `column` text is `text`."""
        return self.isin(column, (text,), rows)
