"""Stream a Chrome trace from bytes into event columns, bounded in bytes, nesting, events and memory.

The pipeline, one chunk at a time; the list of all events never exists:
1. raw bytes, counted as they arrive (so `/dev/zero` or a pipe stops at the cap like a regular file);
2. gzip inflated in steps that never pass the inflated-size cap;
3. a structural scan of each chunk, before any parser sees it: it refuses nesting deeper than
   `MAX_DEPTH`, cuts the `traceEvents` array into batches of whole events and keeps the rest of
   the document (deviceProperties, displayTimeUnit, ...) as a small "skeleton";
4. each batch parsed by orjson (the stdlib `json` without it) and turned into numpy columns;
   only the fields and `args` keys the analysis reads are kept, and names are cut to
   `MAX_NAME_CHARS` (profiling/names.py) before anything else sees them.

Parser choice, measured by `bench/readers.py` (2 cores, 2026-12-02, other jobs running), 105 MiB
synthetic trace (x MiB gzip, 360k events), seconds / peak RSS of a child process:
    FIGURES
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiling.names import cut_name
from profiling.timestamps import MAX_TIME_US, Rebase

try:  # orjson parses several times faster; the stdlib keeps the CLI working on a bare torch install
    import orjson

    _loads: Callable[[Any], Any] = orjson.loads
    _dumps: Callable[[Any], bytes] = orjson.dumps
    _JSONError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - exercised by tests/test_layering.py in a child without orjson
    _loads = json.loads
    _JSONError = json.JSONDecodeError

    def _dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()


Progress = Callable[[float, str], None]
MiB = 1024**2


class TraceError(ValueError):
    """A trace that cannot be read. The message says what is wrong and what is allowed."""


def _env_bytes(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    if not value.isdigit() or int(value) == 0:
        raise ValueError(f"{name}: give a positive whole number (bytes or events), got {value!r}")
    return int(value)


# Limits. Settable by environment variable, read once at import; app.py passes MAX_UPLOAD_BYTES to
# Gradio's `max_file_size`.
MAX_UPLOAD_BYTES = _env_bytes("ATTENTION_PROFILER_MAX_UPLOAD_BYTES", 1024**3)  # on disk, gzip or not
MAX_INFLATED_BYTES = _env_bytes("ATTENTION_PROFILER_MAX_INFLATED_BYTES", 4 * 1024**3)  # JSON text
# A real 4 GiB trace at ~350 bytes per event holds ~12 million events; an event's columns take ~200 bytes.
MAX_EVENTS = _env_bytes("ATTENTION_PROFILER_MAX_EVENTS", 16_000_000)
# Fixed caps, sized from real traces: Kineto nests at most 6 levels (document, traceEvents, event,
# args, Input Dims, one shape); real events take 96 bytes to 7 kB (tests/data, the plugin's sample).
MAX_DEPTH = 32
MAX_EVENT_BYTES = 4 * MiB
MAX_SKELETON_BYTES = 64 * MiB  # everything outside `traceEvents`: deviceProperties and friends
# Distinct values of the object args kept (Input Dims, Input type, grid, block), as compact JSON.
# Equal values are stored once, so a real trace's repeated shapes cost nothing more.
MAX_DISTINCT_ARG_BYTES = 16 * MiB
# Events average 200-430 bytes in real traces, never under 96; a trace of tiny events ({"ph":"M"},
# {}, ...) would make the columns many times larger than the JSON, or take minutes to parse. Past
# MIN_AVERAGE_FREE elements, the elements of `traceEvents` must average this many bytes of JSON.
MIN_AVERAGE_EVENT_BYTES = 80
MIN_AVERAGE_FREE = 100_000
CHUNK_BYTES = MiB


@dataclass(frozen=True)
class Limits:
    """The caps one read enforces; the defaults are the module constants."""

    upload_bytes: int = MAX_UPLOAD_BYTES
    inflated_bytes: int = MAX_INFLATED_BYTES
    events: int = MAX_EVENTS
    depth: int = MAX_DEPTH
    event_bytes: int = MAX_EVENT_BYTES


def _mib(n: float) -> str:
    if n < MiB:
        return f"{n:,.0f} bytes"
    whole = n % MiB == 0 or n >= 10 * MiB
    return f"{n / MiB:,.{0 if whole else 1}f} MiB"


# --- 1. raw bytes -------------------------------------------------------------------------------


def raw_chunks(path: Path, limits: Limits, progress: Progress | None = None) -> Iterator[bytes]:
    """The file's bytes in chunks, refused past `limits.upload_bytes` whatever the file claims to be."""
    try:
        f = path.open("rb")
    except OSError as exc:
        raise TraceError(f"trace: cannot read {path.name}: {exc.strerror}") from None
    with f:
        info = os.fstat(f.fileno())
        total = info.st_size if stat.S_ISREG(info.st_mode) else 0
        if total > limits.upload_bytes:
            raise TraceError(f"trace: the file is {_mib(total)}; the limit is {_mib(limits.upload_bytes)}")
        done = 0
        while chunk := f.read(CHUNK_BYTES):
            done += len(chunk)
            if done > limits.upload_bytes:  # a device or a pipe: st_size said nothing
                raise TraceError(f"trace: {path.name} holds more than {_mib(limits.upload_bytes)} (the limit)")
            if progress is not None:
                progress(done / total if total else 0.0, f"reading the trace: {_mib(done)} of {_mib(total)}")
            yield chunk


# --- 2. gzip -----------------------------------------------------------------------------------


def inflated(chunks: Iterator[bytes], limit: int) -> Iterator[bytes]:
    """JSON text: the chunks themselves, or their gzip inflated; more than `limit` bytes is refused."""
    first = next(chunks, b"")
    if first[:2] != b"\x1f\x8b":
        yield from _counted(_chain(first, chunks), limit)
        return
    yield from _counted(_gunzip(_chain(first, chunks), limit), limit)


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def _counted(chunks: Iterator[bytes], limit: int) -> Iterator[bytes]:
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise TraceError(
                f"trace: inflates to more than {_mib(limit)} of JSON (the limit); "
                "is it a gzip bomb? Trim the trace or profile fewer steps"
            )
        yield chunk


def _gunzip(chunks: Iterator[bytes], limit: int) -> Iterator[bytes]:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        for chunk in chunks:
            data = chunk
            while data:
                # max_length bounds each step: a bomb never inflates more than one step past the cap.
                yield inflater.decompress(data, min(limit + 1, CHUNK_BYTES))
                data = inflater.unconsumed_tail
                if inflater.eof and inflater.unused_data:  # gzip allows several members, one after another
                    # At a member's end zlib leaves the rest in unused_data AND in unconsumed_tail: take one.
                    data, inflater = inflater.unused_data, zlib.decompressobj(16 + zlib.MAX_WBITS)
    except zlib.error as exc:
        raise TraceError(f"trace: the gzip data is corrupt ({exc})") from None
    if not inflater.eof:
        raise TraceError("trace: the gzip file is truncated; upload the whole .json.gz")


# --- 3. structure ------------------------------------------------------------------------------

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*$')
_OPEN, _CLOSE = (ord("{"), ord("[")), (ord("}"), ord("]"))
_COMMA, _QUOTE, _LIST = ord(","), ord('"'), ord("[")
_JSON_STARTS = frozenset(b'{["-0123456789tfn')
_STEP = np.zeros(256, np.int64)  # depth change per structural byte
_STEP[list(_OPEN)], _STEP[list(_CLOSE)] = 1, -1


class Splitter:
    """Cuts a JSON document, chunk by chunk, into batches of whole trace events and a skeleton.

    Every chunk is scanned before it is parsed: nesting past `limits.depth` is refused there, so no
    parser ever sees it. Escapes are blanked out first (same length), so every quote left is a
    string delimiter and every bracket outside strings is structure.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.buffer = bytearray()  # bytes not yet handed on: from the current batch's opener
        self.skeleton = bytearray()  # the document without the events' bytes
        self.depth = 0
        self.in_string = False
        self.escape_pending = False
        self.mode = "start"  # start -> outside -> events -> outside
        self.events_depth = 0  # depth of the traceEvents array's elements
        self.events_offset = 0  # events cut so far, to name an oversized one
        self.found_events = False
        self.leading_bytes = 0

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Batches of whole events (`[e1,e2,...]` JSON text) that this chunk completes."""
        start = len(self.buffer)
        self.buffer += data
        positions, kinds, depth_before = self._structure(data)
        yield from self._route(positions + start, kinds, depth_before)

    def _structure(self, data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        clean = self._without_escapes(data)
        codes = np.frombuffer(clean, np.uint8)
        hits = np.flatnonzero(
            (codes == _QUOTE)
            | (codes == _COMMA)
            | (codes == _OPEN[0])
            | (codes == _OPEN[1])
            | (codes == _CLOSE[0])
            | (codes == _CLOSE[1])
        )
        kinds = codes[hits]
        quote = kinds == _QUOTE
        # A mark is outside strings when an even number of quotes came before it (escapes are blanked).
        quotes_before = np.cumsum(quote) - quote + self.in_string
        outside = (quotes_before % 2 == 0) & ~quote
        marks, kinds = hits[outside], kinds[outside]
        self.in_string = bool((self.in_string + int(quote.sum())) % 2)
        step = _STEP[kinds]
        depth_after = self.depth + np.cumsum(step)
        if len(depth_after):
            if depth_after.max() > self.limits.depth:
                raise TraceError(f"trace: nested deeper than {self.limits.depth} levels; not a torch.profiler trace")
            if depth_after.min() < 0:
                raise TraceError("trace: not valid JSON: a bracket closes that never opened")
            self.depth = int(depth_after[-1])
        return marks, kinds, depth_after - step

    def _without_escapes(self, data: bytes) -> bytes:
        # Blank each escape pair (\" \\ \n ...) to two neutral bytes; lengths, hence positions, stay.
        if self.escape_pending and data:
            data = b"_" + data[1:]
            self.escape_pending = False
        if b"\\" not in data:
            return data
        clean = _ESCAPE.sub(b"__", data)
        self.escape_pending = clean.endswith(b"\\")  # its pair is the next chunk's first byte
        return clean

    def _route(self, positions: np.ndarray, kinds: np.ndarray, depth: np.ndarray) -> Iterator[bytes]:
        if self.mode == "start":
            self._start()
        if self.mode == "outside":
            entry = self._events_entry(positions, kinds, depth)
            if entry is None:
                self._to_skeleton(len(self.buffer))
                return
            self._to_skeleton(entry + 1)
            self.buffer[0:0] = b"["  # the batch opener: buffer[0] is always `[` or `,` from here on
            self.mode, self.found_events = "events", True
            keep = positions > entry
            positions, kinds, depth = positions[keep] - entry, kinds[keep], depth[keep]
        if self.mode == "events":
            yield from self._events(positions, kinds, depth)

    def _start(self) -> None:
        head = bytes(self.buffer).lstrip()
        if not head:  # leading whitespace counts toward the skeleton's cap, so a bomb of it stops early
            self.leading_bytes += len(self.buffer)
            self.buffer.clear()
            if self.leading_bytes > MAX_SKELETON_BYTES:
                raise TraceError(f"trace: starts with more than {_mib(MAX_SKELETON_BYTES)} of blanks; not a trace")
            return
        if head[0] not in _JSON_STARTS:  # zeros from a device, a binary file: no need to read on
            raise TraceError(f"trace: not valid JSON: it starts with {head[:16]!r}")
        self.mode = "outside"
        if head[0] == _LIST:  # a bare list of events
            self.events_depth = 1

    def _events_entry(self, positions: np.ndarray, kinds: np.ndarray, depth: np.ndarray) -> int | None:
        """Where the events array opens in the buffer, if this chunk holds it."""
        if self.found_events:
            return None
        if self.events_depth == 1:  # bare list: the first bracket
            return int(positions[0]) if len(positions) else None
        for at in positions[(kinds == _LIST) & (depth == 1)]:
            before = (bytes(self.skeleton[-64:]) if at < 64 else b"") + bytes(self.buffer[max(0, at - 64) : at])
            if _EVENTS_KEY.search(before[-64:]):
                self.events_depth = 2
                return int(at)
        return None

    def _to_skeleton(self, end: int) -> None:
        self.skeleton += self.buffer[:end]
        del self.buffer[:end]
        if len(self.skeleton) > MAX_SKELETON_BYTES:
            raise TraceError(
                f"trace: more than {_mib(MAX_SKELETON_BYTES)} outside `traceEvents` (the cap); "
                "is it a torch.profiler trace?"
            )

    def _events(self, positions: np.ndarray, kinds: np.ndarray, depth: np.ndarray) -> Iterator[bytes]:
        # Offsets are in the buffer, whose byte 0 is the current batch's opener (`[`).
        at_top = depth == self.events_depth
        closes = positions[at_top & (kinds == _CLOSE[1])]
        end = int(closes[0]) if len(closes) else None
        cuts = positions[at_top & (kinds == _COMMA)]
        if end is not None:
            cuts = cuts[cuts < end]
        self._check_event_sizes(cuts, end)
        last = end if end is not None else (int(cuts[-1]) if len(cuts) else 0)
        if last > 1:  # `[e1,...,ek` + `]`; the commas inside events are not at the top level
            self.events_offset += len(cuts) + (end is not None)
            yield bytes(self.buffer[:last]) + b"]"
        if end is None:
            if last:
                del self.buffer[:last]
                self.buffer[0] = _LIST  # the comma before the next event opens the next batch
            return
        self.mode = "outside"
        self.skeleton += b"]"  # the events array, emptied
        del self.buffer[: end + 1]
        self._to_skeleton(len(self.buffer))

    def _check_event_sizes(self, cuts: np.ndarray, end: int | None) -> None:
        bounds = np.concatenate(([0], cuts, [end if end is not None else len(self.buffer)]))
        sizes = np.diff(bounds)
        if len(sizes) and sizes.max() > self.limits.event_bytes:
            index = self.events_offset + int(np.argmax(sizes))
            raise TraceError(
                f"trace: event {index:,} is larger than {_mib(self.limits.event_bytes)} (the cap per event); "
                "is it a torch.profiler trace?"
            )

    def finish(self) -> bytes:
        """The skeleton, once the whole document has been fed; refuses a document that ends early."""
        if self.mode == "events" or self.depth or self.in_string:
            raise TraceError("trace: not valid JSON: it ends early; was the file cut short?")
        self._to_skeleton(len(self.buffer))
        return bytes(self.skeleton)


# --- 4. columns --------------------------------------------------------------------------------

# args keys lifted into columns, with their column names: the only ones the analysis reads.
NUMERIC_ARGS = {
    "correlation": "correlation",
    "External id": "external_id",
    "stream": "stream",
    "device": "device",
    "registers per thread": "registers",
    "shared memory": "shared_memory",
    "est. achieved occupancy %": "occupancy",
    "blocks per SM": "blocks_per_sm",
    "bytes": "bytes",
    "Total Allocated": "total_allocated",
    "Bytes": "alloc_bytes",
    "Device Type": "device_type",
}
OBJECT_ARGS = {
    "grid": "grid",
    "block": "block",
    "Input Dims": "input_dims",
    "Input type": "input_type",
    "Concrete Inputs": "concrete_inputs",  # scalar arguments as text (torch >= 2.1): SDPA's is_causal
}
# args key spellings: the one the analysis reads, and the older one (torch 1.8-1.9) read where it is missing.
OLD_ARG_SPELLINGS = {"External id": "external id", "Input Dims": "Input dims"}
TEXT_FIELDS = ("name", "cat", "ph")
# Names are cut here, once per distinct name, so no regex, cache, groupby or table downstream ever
# sees more than MAX_NAME_CHARS of one (profiling/names.py).
_TEXT_CUTS: dict[str, Callable[[str], str]] = {"name": cut_name}
COLUMNS = ["name", "cat", "ph", "ts", "dur", "end", "pid", "tid", *NUMERIC_ARGS.values(), *OBJECT_ARGS.values()]
_OBJECT_COLUMNS = {*TEXT_FIELDS, "pid", "tid", *OBJECT_ARGS.values()}
_NONE = type(None)
# Value types whose batch takes the vectorised path (exact type: a bool is not an int here, as
# JSON's true is not a number); any other type in a batch sends that field to the per-value path.
_PLAIN_NUMBERS = frozenset({int, float, _NONE})
_PLAIN_TEXTS = frozenset({str, _NONE})
# int and str never compare equal, so one hash table tells them apart; 1 and 1.0 (and True) would not.
_PLAIN_LANES = frozenset({int, str, _NONE})
_LANE_TYPES = (str, int, float)
_EMPTY: dict[str, Any] = {}


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
        # freed into a fragmented heap that the OS never gets back, doubling the peak RSS.
        self.data = {name: np.empty(0, object if name in _OBJECT_COLUMNS else np.float64) for name in COLUMNS}
        self.size = 0
        self.seen = self.kept = self.skipped = self.distinct_arg_bytes = 0
        self.ts_base_us = 0  # what the batches' `ts` are relative to (`Rebase`)
        self.strings: dict[str, str] = {}  # one object per distinct name, category, lane
        self.values: dict[bytes, Any] = {}  # one object per distinct object-arg value

    def add(self, batch: list[Any], json_bytes: int, absolute: bool = False) -> None:
        """Append one batch (a parsed list of events); refuse past the event caps.

        Its `ts` are relative to `ts_base_us` (rewritten by `Rebase`), or `absolute` as the file wrote them."""
        self.seen += len(batch)
        if self.seen > self.limits.events:
            raise TraceError(f"trace: more than {self.limits.events:,} events (the cap); profile fewer steps")
        self._check_average(json_bytes)
        events = [e for e in batch if type(e) is dict]
        self.skipped += len(batch) - len(events)
        if not events:
            return
        text = {field: self._texts(_field(events, field), _TEXT_CUTS.get(field, str)) for field in TEXT_FIELDS}
        ts, dur = _times(_field(events, "ts"), 0 if absolute else self.ts_base_us), _times(_field(events, "dur"))
        if absolute and self.ts_base_us:
            ts -= self.ts_base_us
        complete, metadata = text["ph"] == "X", text["ph"] == "M"
        # Metadata ("M") events carry no time; every other usable event needs a finite start, and a
        # duration event also a non-negative duration and a name.
        usable = metadata | (~np.isnan(ts) & (~complete | ((dur >= 0) & (text["name"] != ""))))
        keep = np.flatnonzero(usable)
        self.skipped += len(events) - len(keep)
        self.kept += len(keep)
        if len(keep) < len(events):
            events = [events[i] for i in keep.tolist()]
            text = {field: values[keep] for field, values in text.items()}
            ts, dur, complete = ts[keep], dur[keep], complete[keep]
        dur = np.where(complete, dur, 0.0)
        block = text | {"ts": ts, "dur": dur, "end": ts + dur}
        block |= {lane: self._lanes(_field(events, lane)) for lane in ("pid", "tid")}
        block |= self._args([a if type(a) is dict else _EMPTY for a in _field(events, "args")])
        self._append(block, len(events))

    def _append(self, block: dict[str, np.ndarray], rows: int) -> None:
        capacity, end = len(self.data["ts"]), self.size + rows
        if end > capacity:
            grown = max(end, capacity + capacity // 4 + 4096)  # at most 25% spare at any time
            for array in self.data.values():
                array.resize(grown, refcheck=False)
        for name, values in block.items():
            self.data[name][self.size : end] = values
        self.size = end

    def _check_average(self, json_bytes: int) -> None:
        # Counts every element, kept or not: tiny ones cost parse time even when they cost no memory.
        if self.seen > MIN_AVERAGE_FREE and self.seen * MIN_AVERAGE_EVENT_BYTES > json_bytes:
            raise TraceError(
                f"trace: {self.seen:,} events in {_mib(json_bytes)} of JSON average "
                f"{json_bytes / self.seen:.0f} bytes; torch.profiler events take over {MIN_AVERAGE_EVENT_BYTES} "
                "(the cap on tiny events); not a torch.profiler trace"
            )

    def _args(self, dicts: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        # Only keys some event of the batch has are gathered (one C-level pass over the keys);
        # a kernel-free batch skips the kernel keys, and so on.
        present = set().union(*dicts)
        out: dict[str, np.ndarray] = {}
        for key, column in NUMERIC_ARGS.items():
            wanted = key in present or OLD_ARG_SPELLINGS.get(key) in present
            out[column] = _numbers(_arg_values(dicts, key)) if wanted else np.full(len(dicts), np.nan)
        for key, column in OBJECT_ARGS.items():
            wanted = key in present or OLD_ARG_SPELLINGS.get(key) in present
            out[column] = self._shared(_arg_values(dicts, key)) if wanted else np.full(len(dicts), None, object)
        return out

    def _shared(self, values: list[Any]) -> np.ndarray:
        # One object per distinct value, and a cap on their total size: the shapes of a real trace
        # repeat every step, while a hostile one could hold a million tiny lists per event.
        out = np.full(len(values), None, object)
        present = [i for i, value in enumerate(values) if value is not None]
        given = [values[i] for i in present]
        keys = list(map(_dumps, given))
        known = self.values
        for key, value in dict(zip(keys, given, strict=True)).items():  # this batch's distinct values
            if key not in known:
                self.distinct_arg_bytes += len(key)
                if self.distinct_arg_bytes > MAX_DISTINCT_ARG_BYTES:
                    raise TraceError(
                        f"trace: the events' {'/'.join(OBJECT_ARGS)} args hold more than "
                        f"{_mib(MAX_DISTINCT_ARG_BYTES)} of distinct values (the cap)"
                    )
                known[key] = value
        if present:  # fromiter keeps each list one object; np.array would make a 2-D array of equal-length lists
            out[present] = np.fromiter(map(known.__getitem__, keys), dtype=object, count=len(keys))
        return out

    def _texts(self, values: list[Any], text: Callable[[str], str]) -> np.ndarray:
        if not set(map(type, values)) <= _PLAIN_TEXTS:  # numbers, bools, lists: only strings are names
            values = [v if type(v) is str else None for v in values]
        return self._interned(values, "", text)

    def _lanes(self, values: list[Any]) -> np.ndarray:
        # A lane is its id's text: 1 and 1.0 are different lanes, as their text says. A bool or a
        # container is no lane ("?").
        if not set(map(type, values)) <= _PLAIN_LANES:
            values = [str(v) if type(v) in _LANE_TYPES else None for v in values]
        return self._interned(values, "?", str)

    def _interned(self, values: list[Any], missing: str, text: Callable[[Any], str]) -> np.ndarray:
        """`text` of each value, `missing` for None, one string object per distinct text."""
        codes, uniques = pd.factorize(np.array(values, dtype=object))  # None is -1: the last entry below
        strings = self.strings
        shared = [strings.setdefault(t, t) for t in map(text, uniques.tolist())]
        table = np.array([*shared, strings.setdefault(missing, missing)], dtype=object)
        return table[codes]

    def arrays(self) -> dict[str, np.ndarray]:
        """The columns, trimmed to the rows read; numbers are float64, NaN where missing or not a number."""
        for array in self.data.values():
            array.resize(self.size, refcheck=False)
        return self.data


def _field(events: list[dict[str, Any]], key: str) -> list[Any]:
    return [e.get(key) for e in events]


def _arg_values(args: list[dict[str, Any]], key: str) -> list[Any]:
    old = OLD_ARG_SPELLINGS.get(key)
    if old is None:
        return [a.get(key) for a in args]
    return [value if (value := a.get(key)) is not None else a.get(old) for a in args]


def _numbers(values: list[Any]) -> np.ndarray:
    """float64, NaN where missing, not a number (a bool, a string) or infinite."""
    out = None
    if set(map(type, values)) <= _PLAIN_NUMBERS:  # the common case: numbers and None (NaN) only
        try:
            out = np.array(values, dtype=np.float64)
        except OverflowError:  # an integer past float64's range
            out = None
    if out is None:
        out = np.array([_float(v) if type(v) is int or type(v) is float else math.nan for v in values], np.float64)
    out[np.isinf(out)] = np.nan
    return out


def _times(values: list[Any], base: int = 0) -> np.ndarray:
    """Microseconds since `base`; NaN past MAX_TIME_US from 0, so `ts + dur` and every difference of times
    stay finite."""
    out = _numbers(values)
    out[np.abs(out + base) > MAX_TIME_US] = np.nan
    return out


def _float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer past float64's range
        return math.nan


# --- the whole read -----------------------------------------------------------------------------


@dataclass
class RawTrace:
    """What a read yields: event columns (COLUMNS), the document's other keys, and the events skipped."""

    columns: dict[str, np.ndarray]
    metadata: dict[str, Any]
    skipped: int
    ts_base_us: int = 0  # the columns' `ts` and `end` are µs since this many µs (`Rebase`)


def read_path(path: Path, limits: Limits | None = None, progress: Progress | None = None) -> RawTrace:
    """Read a `.json` or `.json.gz` trace file (or any readable path) within `limits`."""
    limits = limits or Limits()
    return _read(raw_chunks(path, limits, progress), limits, path.name)


def read_text(data: bytes, limits: Limits | None = None, source: str = "trace") -> RawTrace:
    """Read a trace already in memory (JSON text or gzip), through the same bounded pipeline."""
    limits = limits or Limits()
    if len(data) > limits.upload_bytes:
        raise TraceError(f"trace: the data is {_mib(len(data))}; the limit is {_mib(limits.upload_bytes)}")
    return _read(iter([data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]), limits, source)


def _read(chunks: Iterator[bytes], limits: Limits, source: str) -> RawTrace:
    splitter, columns, rebase, json_bytes = Splitter(limits), Columns(limits), Rebase(), 0
    with _no_gc():
        for chunk in inflated(chunks, limits.inflated_bytes):
            json_bytes += len(chunk)
            for batch in splitter.feed(chunk):
                batch = rebase(batch)
                columns.ts_base_us = rebase.base or 0
                columns.add(_parse(batch, source), json_bytes)
        document = _parse(splitter.finish(), source)
        metadata = _metadata(document, columns, json_bytes, source)
        return RawTrace(columns.arrays(), metadata, columns.skipped, columns.ts_base_us)


def _parse(text: bytes, source: str) -> Any:
    try:
        return _loads(text)
    except (_JSONError, UnicodeDecodeError) as exc:
        raise TraceError(f"trace: {source} is not valid JSON ({exc})") from None


def _metadata(document: Any, columns: Columns, json_bytes: int, source: str) -> dict[str, Any]:
    # The streamed events left `[]` in the skeleton; a `traceEvents` the scan did not recognise (an
    # escaped key, say) is still here, within the skeleton's cap, and is read now.
    if isinstance(document, list):
        columns.add(document, json_bytes, absolute=True)
        return {}
    if not isinstance(document, dict):
        raise TraceError(f"trace: {source} must hold a JSON object or list, got {type(document).__name__}")
    if "traceEvents" not in document:
        raise TraceError(f"trace: {source} is JSON but has no `traceEvents`; is it a torch.profiler trace?")
    events = document.pop("traceEvents")
    if not isinstance(events, list):
        raise TraceError(f"trace: `traceEvents` must be a list, got {type(events).__name__}")
    columns.add(events, json_bytes, absolute=True)
    return document


@contextmanager
def _no_gc() -> Iterator[None]:
    # Parsing builds millions of small objects and no cycles; the cyclic collector would rescan
    # them again and again and make parse time grow faster than the trace.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
