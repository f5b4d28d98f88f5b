"""Texts decoded once per process, not once per batch: the native decoder's cache (profiling/native.py).

A real trace repeats its names, categories, lanes and shapes in every step, so each batch of a large read holds
nearly the same few hundred distinct texts as the last, and each batch sliced, decoded and parsed them again. Now
the batch's distinct texts (`native_scan.distinct`, per batch) are looked up by their bytes in a table this process
keeps (`_lookup`, compiled), and only a text never seen before is decoded, once (`TextCache.decoded`). The decoder
went from 243-254 to 259-284 MB/s on 300 MiB of the replica's batches (three passes each, alternated; with
`native`'s brace count in numpy).

Bounded whatever the trace: a cache holds MAX_ENTRIES texts of ARENA_BYTES in all. Texts that would pass either,
or a probe chain past MAX_PROBES (a flood of texts hashing alike), empty it and are looked up again; a batch's
texts that pass the bounds on their own are left to the caller to decode (None). A decode that raises empties the
cache, so no text is kept without its value. Each thread has its own caches (`text_cache`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from profiling.native_json import PADDING
from profiling.native_scan import MAX_PROBES, _span_hash, same_bytes

MAX_ENTRIES = 1 << 16
ARENA_BYTES = 16 * 1024**2
FULL = -1
_USED, _COUNT = 0, 1  # the state's slots: arena bytes used, entries


@njit(cache=True, nogil=True, _nrt=False)
def _lookup(buf, starts, ends, table, entries, arena, state, ids) -> int:  # noqa: ANN001
    """Write the cache id of each span [starts[r], ends[r]) of `buf` into `ids`; a text not in the cache is copied
    into `arena` and given the next id (`entries` holds each id's span in `arena`; `table`, a power of two at
    least twice as long, maps hashes to ids). Returns FULL where the cache cannot take them all, else 0."""
    size = len(table)
    for r in range(len(starts)):
        start, end = starts[r], ends[r]
        length = end - start
        slot = _span_hash(buf, start, end) & np.uint64(size - 1)
        found = -1
        for _ in range(MAX_PROBES):
            d = table[slot]
            if d < 0:
                break
            at = entries[d, 0]
            if entries[d, 1] - at == length and same_bytes(arena, at, buf, start, length):
                found = d
                break
            slot = (slot + np.uint64(1)) & np.uint64(size - 1)
        else:
            return FULL
        if found < 0:
            used, found = state[_USED], state[_COUNT]
            if found == len(entries) or used + length > len(arena) - PADDING:
                return FULL
            for j in range(length):
                arena[used + j] = buf[start + j]
            entries[found, 0], entries[found, 1] = used, used + length
            table[slot] = found
            state[_USED], state[_COUNT] = used + length, found + 1
        ids[r] = found
    return 0


class TextCache:
    """One kind of text (names, categories, lanes, object args), each decoded by `decode` from its bytes once."""

    def __init__(self, decode: Callable[[bytes], Any]) -> None:
        self.decode = decode
        self.table = np.full(1 << (2 * MAX_ENTRIES - 1).bit_length(), -1, np.int64)  # a power of two, half empty
        self.entries = np.empty((MAX_ENTRIES, 2), np.int64)
        # Only the bytes written are touched; PADDING more for `same_bytes`, which reads up to 8 past a text.
        self.arena = np.zeros(ARENA_BYTES + PADDING, np.uint8)
        self.state = np.zeros(2, np.int64)
        self.values: list[Any] = []  # each id's decoded text

    def decoded(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[Any] | None:
        """The distinct texts at [starts, ends) of `buf`, each decoded; None where they alone pass the cache's
        bounds."""
        ids = np.empty(len(starts), np.int64)
        for _ in range(2):
            known = len(self.values)
            if _lookup(buf, starts, ends, self.table, self.entries, self.arena, self.state, ids) != FULL:
                break
            self.clear()
        else:
            return None
        if known < self.state[_COUNT]:
            spans = self.entries[known : self.state[_COUNT]].tolist()
            try:
                self.values += [self.decode(self.arena[start:end].tobytes()) for start, end in spans]
            except BaseException:
                self.clear()
                raise
        values = self.values
        return [values[i] for i in ids.tolist()]

    def clear(self) -> None:
        self.table.fill(-1)
        self.state.fill(0)
        self.values = []


_CACHES = threading.local()  # a thread's caches: a batch's lookup and its decodes are one unit


def text_cache(decode: Callable[[bytes], Any]) -> TextCache:
    """This thread's cache of the texts that `decode` decodes (a cache per decoder)."""
    caches = _CACHES.__dict__
    cache = caches.get(decode)
    if cache is None:
        cache = caches[decode] = TextCache(decode)
    return cache
