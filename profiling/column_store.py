"""The read's event columns, built one batch at a time (profiling/reader.py): each batch's `Block`
(profiling/columns.py `block_of`) is interned, counted against the caps and appended in place.

An args column is made only when a value first arrives; one that no event fills is its missing value
repeated by a zero stride, which costs no memory (`Columns.arrays`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from profiling.columns import (
    _OBJECT_COLUMNS,
    COLUMNS,
    NUMERIC_ARGS,
    OBJECT_ARGS,
    Block,
    DictRows,
    ObjectColumn,
    TextColumn,
    _loads,
    block_of,
)
from profiling.lane_names import MAX_LANE_NAMES, LaneNames
from profiling.scan import MAX_DISTINCT_ARG_BYTES, MIN_AVERAGE_EVENT_BYTES, MIN_AVERAGE_FREE, Limits, TraceError, _mib

_ARG_COLUMNS = [*NUMERIC_ARGS.values(), *OBJECT_ARGS.values()]
_BASE_COLUMNS = [name for name in COLUMNS if name not in _ARG_COLUMNS]
# A column's missing value by its dtype's kind, as a 0-d array: what an empty args column repeats (`arrays`).
MISSING_VALUE = {"f": np.array(math.nan), "O": np.array(None, dtype=object)}


class Columns:
    """Event columns built one batch at a time; `arrays()` joins them.

    Each field is gathered by one list comprehension per batch, and its values' types are checked
    per batch (`set(map(type, ...))`, in C): a batch of plain values is converted by numpy and
    pandas in C, and only a batch holding odd values (a bool, a list, a huge int) takes the
    per-value path. Further Python-level work is per distinct value, not per event.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        # One growing array per column, resized in place (realloc): the per-batch pieces would be
        # freed into a fragmented heap that the OS never gets back, doubling the peak RSS. An args column
        # is made only when a value first arrives: a trace leaves a third of them empty (`arrays`).
        self.data: dict[str, np.ndarray | None] = {name: _empty(name) for name in _BASE_COLUMNS}
        self.data |= dict.fromkeys(_ARG_COLUMNS)
        self.size = self.capacity = 0
        self.seen = self.kept = self.skipped = self.distinct_arg_bytes = 0
        self.ts_base_us = 0  # what the batches' `ts` are relative to (`Rebase`)
        self.lane_names: LaneNames = {}  # the first MAX_LANE_NAMES (kind, pid, tid), the first name of each
        self.strings: dict[str, str] = {}  # one object per distinct name, category, lane
        self.values: dict[bytes, Any] = {}  # one object per distinct object-arg value

    def add(self, batch: list[Any], json_bytes: int, absolute: bool = False) -> None:
        """Append one batch (a parsed list of events); refuse past the event caps.

        Its `ts` are relative to `ts_base_us` (rewritten by `Rebase`), or `absolute` as the file wrote them."""
        self.count(len(batch), json_bytes)
        events = [e for e in batch if type(e) is dict]
        self.append(block_of(DictRows(events), len(batch), self.ts_base_us, absolute), json_bytes, counted=True)

    def count(self, seen: int, json_bytes: int) -> None:
        """Count `seen` more elements of `traceEvents`; refuse past the event caps."""
        self.seen += seen
        if self.seen > self.limits.events:
            raise TraceError(f"trace: more than {self.limits.events:,} events (the cap); profile fewer steps")
        # Counts every element, kept or not: tiny ones cost parse time even when they cost no memory.
        if self.seen > MIN_AVERAGE_FREE and self.seen * MIN_AVERAGE_EVENT_BYTES > json_bytes:
            raise TraceError(
                f"trace: {self.seen:,} events in {_mib(json_bytes)} of JSON average "
                f"{json_bytes / self.seen:.0f} bytes; torch.profiler events take over {MIN_AVERAGE_EVENT_BYTES} "
                "(the cap on tiny events); not a torch.profiler trace"
            )

    def append(self, block: Block, json_bytes: int, counted: bool = False) -> None:
        """Append a batch's block (from `block_of`), its elements counted against the caps unless `counted`."""
        if not counted:
            self.count(block.seen, json_bytes)
        self.skipped += block.skipped
        self.kept += block.rows
        for key, name in block.lane_names.items():
            if len(self.lane_names) >= MAX_LANE_NAMES:
                break
            self.lane_names.setdefault(key, name)
        if not block.rows:
            return
        columns: dict[str, np.ndarray | None] = dict(block.numbers)
        columns |= {name: self._interned(texts) for name, texts in block.texts.items()}
        columns |= {name: self._shared(objects) for name, objects in block.objects.items()}
        self._append(columns, block.rows)

    def _append(self, block: dict[str, np.ndarray | None], rows: int) -> None:
        end = self.size + rows
        if end > self.capacity:
            self.capacity = max(end, self.capacity + self.capacity // 4 + 4096)  # at most 25% spare at any time
            for array in self.data.values():
                if array is not None:
                    array.resize(self.capacity, refcheck=False)
        for name, values in block.items():
            column = self.data[name]
            if column is None:
                if values is None or (values.dtype == np.float64 and np.isnan(values).all()):
                    continue  # still no value in this column: nothing to store
                column = self.data[name] = _empty(name, self.capacity)
                column[: self.size] = MISSING_VALUE[column.dtype.kind]
            column[self.size : end] = MISSING_VALUE[column.dtype.kind] if values is None else values
        self.size = end

    def _interned(self, column: TextColumn) -> np.ndarray:
        """One string object per distinct text across the whole read."""
        codes, texts = column
        strings = self.strings
        return np.array([strings.setdefault(t, t) for t in texts], dtype=object)[codes]

    def _shared(self, column: ObjectColumn) -> np.ndarray | None:
        # One object per distinct value, and a cap on their total size: the shapes of a real trace
        # repeat every step, while a hostile one could hold a million tiny lists per event.
        codes, keys, values = column
        if not keys:
            return None  # no value in this batch
        out = np.full(len(codes), None, object)
        known = self.values
        for i, key in enumerate(keys):
            if key not in known:
                self.distinct_arg_bytes += len(key)
                if self.distinct_arg_bytes > MAX_DISTINCT_ARG_BYTES:
                    raise TraceError(
                        f"trace: the events' {'/'.join(OBJECT_ARGS)} args hold more than "
                        f"{_mib(MAX_DISTINCT_ARG_BYTES)} of distinct values (the cap)"
                    )
                # A block from the decode helper carries keys only (`Block.__getstate__`): its key is the
                # value's compact JSON, which parses back to an equal value.
                known[key] = _loads(key) if values is None else values[i]
        # fromiter keeps each list one object; np.array would make a 2-D array of equal-length lists
        table = np.fromiter(map(known.__getitem__, keys), dtype=object, count=len(keys))
        present = codes >= 0
        out[present] = table[codes[present]]
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """The columns, trimmed to the rows read; numbers are float64, NaN where missing or not a number.

        An args column that no event filled is its missing value repeated by a zero stride: read-only, and no
        memory (on a training trace 13 of the 27 args columns, a third of the table's bytes)."""
        out = {}
        for name, array in self.data.items():
            if array is None:
                out[name] = np.broadcast_to(MISSING_VALUE[np.dtype(_dtype(name)).kind], (self.size,))
            else:
                array.resize(self.size, refcheck=False)
                out[name] = array
        return out


def _empty(name: str, size: int = 0) -> np.ndarray:
    """A column's array of `size` rows, unfilled."""
    return np.empty(size, _dtype(name))


def _dtype(name: str) -> type:
    return object if name in _OBJECT_COLUMNS else np.float64
