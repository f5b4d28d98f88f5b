"""The bytes of a trace up to its events: read within the byte cap, inflated within the JSON cap, and cut
by a structural scan into batches of whole events and a small skeleton (the rest of the document).

Steps 1-3 of the reader (profiling/reader.py): no parser sees a byte before this scan has bounded its
nesting and its events' sizes.
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

try:  # ISA-L's igzip inflates 2.5-2.9x faster than zlib (docs/benchmarks.md); zlib keeps a bare install reading
    from isal import isal_zlib as _gzip
except ImportError:  # pragma: no cover - exercised by tests/test_layering.py in a child without isal
    _gzip = zlib  # type: ignore[assignment]

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
    inflater = _gzip.decompressobj(16 + zlib.MAX_WBITS)
    try:
        for chunk in chunks:
            data = chunk
            while data:
                # max_length bounds each step: a bomb never inflates more than one step past the cap.
                yield inflater.decompress(data, min(limit + 1, CHUNK_BYTES))
                data = inflater.unconsumed_tail
                if inflater.eof and inflater.unused_data:  # gzip allows several members, one after another
                    # At a member's end zlib leaves the rest in unused_data AND in unconsumed_tail: take one.
                    data, inflater = inflater.unused_data, _gzip.decompressobj(16 + zlib.MAX_WBITS)
    except _gzip.error as exc:
        raise TraceError(f"trace: the gzip data is corrupt ({exc})") from None
    if not inflater.eof:
        raise TraceError("trace: the gzip file is truncated; upload the whole .json.gz")


# --- 3. structure ------------------------------------------------------------------------------

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*$')
_OPEN, _CLOSE = (ord("{"), ord("[")), (ord("}"), ord("]"))
_COMMA, _QUOTE, _LIST = ord(","), ord('"'), ord("[")
_JSON_STARTS = frozenset(b'{["-0123456789tfn')
_MARKS = bytes(int(b in b'"{}[],') for b in range(256))  # bytes.translate table: 1 for structure, 0 for the rest
# `_route` reads marks at most this deep (the events array's elements are at depth 1 or 2): the compiled scan
# keeps only those, where the numpy one keeps every mark outside strings.
KEPT_DEPTH = 2
_STEP = np.zeros(256, np.int32)  # depth change per structural byte
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
        # `native_structure.structure` where the compiled decoder is loaded (profiling/reader.py); else numpy's passes.
        self.compiled: Callable[..., tuple[Any, ...]] | None = None

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Batches of whole events (`[e1,e2,...]` JSON text) that this chunk completes."""
        start = len(self.buffer)
        self.buffer += data
        positions, kinds, depth_before = self._structure(data)
        yield from self._route(positions + start, kinds, depth_before)

    def _structure(self, data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.compiled is not None:
            return self._compiled_structure(data)
        clean = self._without_escapes(data)
        # One C pass maps the six structural bytes to 1 and the rest to 0, a valid bool array: comparing
        # each byte six times, or finding the non-zero bytes of a uint8 array, is five times slower.
        hits = np.flatnonzero(np.frombuffer(clean.translate(_MARKS), np.bool_))
        kinds = np.frombuffer(clean, np.uint8)[hits]
        quote = kinds == _QUOTE
        # A mark is outside strings when an even number of quotes came before it (escapes are blanked):
        # the running count of quotes, odd or even (a non-quote mark's count is that before it). A count's
        # cumsum and its low bit take a third of the time of a running xor, which numpy does not vectorise.
        parity = np.cumsum(quote, dtype=np.int32) & 1  # int32: a chunk holds < 2**31 marks
        outside = (parity == self.in_string) & ~quote
        marks, kinds = hits[outside], kinds[outside]
        if len(parity):
            self.in_string = bool(parity[-1] ^ self.in_string)
        step = _STEP[kinds]
        depth_after = np.cumsum(step, dtype=np.int32) + self.depth  # int32: a chunk holds < 2**31 marks
        if len(depth_after):
            self._check_depths(int(depth_after.max()), int(depth_after.min()))
            self.depth = int(depth_after[-1])
        return marks, kinds, depth_after - step

    def _compiled_structure(self, data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_structure` in one compiled pass (profiling/native_structure.py), 8x faster: the same marks
        where `_route` reads them (at most KEPT_DEPTH deep), the same state and errors."""
        size = len(data)
        positions, kinds, depths = np.empty(size, np.int64), np.empty(size, np.uint8), np.empty(size, np.int32)
        state = (self.in_string, self.escape_pending, self.depth)
        count, *state, deepest, shallowest = self.compiled(
            np.frombuffer(data, np.uint8), *state, KEPT_DEPTH, positions, kinds, depths
        )
        self._check_depths(deepest, shallowest)
        self.in_string, self.escape_pending, self.depth = state
        return positions[:count], kinds[:count], depths[:count]

    def _check_depths(self, deepest: int, shallowest: int) -> None:
        if deepest > self.limits.depth:
            raise TraceError(f"trace: nested deeper than {self.limits.depth} levels; not a torch.profiler trace")
        if shallowest < 0:
            raise TraceError("trace: not valid JSON: a bracket closes that never opened")

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
            with memoryview(self.buffer) as head:  # one copy (a bytearray's slice and then bytes() were two)
                batch = b"".join((head[:last], b"]"))
            yield batch
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
