"""The lane names that metadata ("M") events give, read from one batch of events (profiling/columns.py).

The timeline names its lanes from them (profiling/lanes.py); each name is cut as event names are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from profiling.names import cut_name

if TYPE_CHECKING:  # columns.py imports this module to build its blocks
    from profiling.columns import Rows, TextColumn

# The metadata ("M") events that name a lane, and the args key holding the name: Kineto writes
# `thread_name` ("thread 6608 (python)", "stream 7 ") per (pid, tid), and `process_name` and
# `process_labels` ("GPU 0") per pid. The timeline names its lanes from them (profiling/lanes.py).
LANE_NAME_KINDS = {"thread_name": "name", "process_name": "name", "process_labels": "labels"}
# Distinct (kind, pid, tid) names kept per read, the first of each: real traces hold 3-30; past the cap a
# lane is named from its ids, as where the trace names none.
MAX_LANE_NAMES = 1024
# A lane's name: (kind, pid, tid) -> the name, pid and tid as the lane columns' text.
LaneNames = dict[tuple[str, str, str], str]


def lane_names(rows: Rows, texts: dict[str, TextColumn], metadata: np.ndarray) -> LaneNames:
    """The lane names among the `metadata` rows of a batch: the first text of each (kind, pid, tid), at most
    MAX_LANE_NAMES, cut as names are.

    Rows are de-duplicated by their codes first, so a trace of a million copies of one name reads one value;
    a key whose first value is no text (a number names nothing) reads all of its rows, in one more pass.
    """
    if not len(metadata):
        return {}
    # A batch holds tens of metadata rows: plain Python over their codes, where pandas frames cost ms per batch.
    kinds = texts["name"][1]
    keys = list(zip(*(texts[column][0][metadata].tolist() for column in ("name", "pid", "tid")), strict=True))
    named = [i for i, key in enumerate(keys) if kinds[key[0]] in LANE_NAME_KINDS]
    first_of: dict[tuple[int, int, int], int] = {}
    for i in named:
        first_of.setdefault(keys[i], i)
    first = list(first_of.values())  # each key's first row, in file order
    found = _names_at(rows, texts, metadata[first])
    unnamed = {keys[i] for i in first} - found.keys()
    if unnamed and len(found) < MAX_LANE_NAMES:  # keys whose first value was no text: their later rows
        found |= _names_at(rows, texts, metadata[[i for i in named if keys[i] in unnamed]])
    ordered = sorted(found.items(), key=lambda item: item[1][0])[:MAX_LANE_NAMES]  # file order: the first keys
    return {_lane_key(texts, codes): cut_name(name) for codes, (_, name) in ordered}


def _names_at(rows: Rows, texts: dict[str, TextColumn], at: np.ndarray) -> dict[tuple[int, int, int], tuple[int, str]]:
    """(name, pid, tid) codes -> (row, text) of the first of the rows `at` whose name arg is text."""
    if not len(at):
        return {}
    kept = rows.take(at.tolist())
    kinds = np.array(texts["name"][1], dtype=object)[texts["name"][0][at]]
    args = {key: kept.arg_values(key) for key in set(LANE_NAME_KINDS.values())}
    found: dict[tuple[int, int, int], tuple[int, str]] = {}
    for i, (row, kind) in enumerate(zip(at.tolist(), kinds, strict=True)):
        value = args[LANE_NAME_KINDS[kind]][i]
        codes = (int(texts["name"][0][row]), int(texts["pid"][0][row]), int(texts["tid"][0][row]))
        if type(value) is str and codes not in found:
            found[codes] = (row, value)
    return found


def _lane_key(texts: dict[str, TextColumn], codes: tuple[int, int, int]) -> tuple[str, str, str]:
    return tuple(texts[column][1][code] for column, code in zip(("name", "pid", "tid"), codes, strict=True))  # type: ignore[return-value]
