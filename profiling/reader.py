"""Stream a Chrome trace from bytes into event columns, bounded in bytes, nesting, events and memory.

The pipeline, one chunk at a time; the list of all events never exists:
1. raw bytes, counted as they arrive (so `/dev/zero` or a pipe stops at the cap like a regular file);
2. gzip inflated in steps that never pass the inflated-size cap;
3. a structural scan of each chunk, before any parser sees it: it refuses nesting deeper than
   `MAX_DEPTH`, cuts the `traceEvents` array into batches of whole events and keeps the rest of
   the document (deviceProperties, displayTimeUnit, ...) as a small "skeleton" (steps 1-3:
   profiling/scan.py);
4. each batch decoded straight into typed Structs of only the fields the analysis reads
   (msgspec, profiling/decode.py), or, where that schema refuses an odd value and on a bare install,
   by the reference route: orjson (the stdlib `json` without it) into dicts; both end in the same
   column builder (profiling/columns.py), which cuts names to `MAX_NAME_CHARS` (profiling/names.py);
5. with two or more CPUs and a large trace, step 4 (with `ts` read relative to a base, profiling/timestamps.py) is
   shared with a forked helper process, several batches ahead, while this one inflates and scans; when
   the helper is behind, this one decodes the next batch itself; the blocks merge in order
   (profiling/reader_pool.py).

Throughput per stage (CPU, MB/s of JSON) on a 248 MB replica of tests/data/sampled_training_rank0
(`bench.synthetic.replicate` x152, 738k events; 2 shared cores, 2026-12-03, other jobs running, so +-30%):
    stage                 orjson route (before)   typed route (after)
    inflate               394                     373-490
    scan (split)          ~150 (1.65 s)           175 (1.42 s)
    Rebase (ns epochs)    215                     220 (a regex rewrite; since 2026-12-06 `relative_times`
                                                  reads plain `ts` texts without it: -10% decode time)
    parse                 59 (orjson into dicts)  200-256 (msgspec into Structs)
    columns               52                      76-100 (block_of) + 240-700 (append)
    whole read_path       24 (10.5 s)             38-42 (5.9-6.7 s) on one core
With the helper sharing the decode several batches ahead (2026-12-05, 2 cores, in process, three reads each):
1.13-1.23 s on a 100 MiB replica (x64; 1.67 s with one batch in flight, 2.0 s on one core) and 4.1-4.25 s on
a 400 MiB one (x256; 6.1-6.4 s before), each side busy ~1.1 s per 100 MiB.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from profiling.column_store import Columns
from profiling.columns import (
    COLUMNS,
    NUMERIC_ARGS,
    OBJECT_ARGS,
    OLD_ARG_SPELLINGS,
    TEXT_FIELDS,
    Block,
    DictRows,
    _dumps,
    _JSONError,
    _loads,
    block_of,
)
from profiling.decode import available, typed_rows
from profiling.gc_pause import paused_gc
from profiling.lane_names import LaneNames
from profiling.reader_pool import START_AFTER_BYTES, DecodeHelper, helper_wanted
from profiling.scan import (
    CHUNK_BYTES,
    MAX_DEPTH,
    MAX_DISTINCT_ARG_BYTES,
    MAX_EVENT_BYTES,
    MAX_EVENTS,
    MAX_INFLATED_BYTES,
    MAX_SKELETON_BYTES,
    MAX_UPLOAD_BYTES,
    MIN_AVERAGE_EVENT_BYTES,
    MIN_AVERAGE_FREE,
    Limits,
    MiB,
    Progress,
    Splitter,
    TraceError,
    _mib,
    inflated,
    raw_chunks,
)
from profiling.timestamps import Rebase, rebased

# The compiled decoder and structural scan (profiling/native.py, numba) read a 1 GiB trace 38% faster, a 400 MB
# one 25%, but loading numba costs ~0.8 s and 137 MiB (docs/benchmarks.md, 2026-12-07). So a read takes them
# where numba is loaded already (the app's workers preload it) or the trace's JSON is at least NATIVE_FROM_BYTES
# (from its size, or a gzip's own record of it); PROFILING_NATIVE=1 or 0 says always or never. They load with
# the decode helper, past NATIVE_AFTER_BYTES of JSON, so the helper shares them.
NATIVE_ENV = "PROFILING_NATIVE"
NATIVE_FROM_BYTES = 256 * 1024**2
NATIVE_AFTER_BYTES = START_AFTER_BYTES

__all__ = [
    "CHUNK_BYTES",
    "COLUMNS",
    "MAX_DEPTH",
    "MAX_DISTINCT_ARG_BYTES",
    "MAX_EVENTS",
    "MAX_EVENT_BYTES",
    "MAX_INFLATED_BYTES",
    "MAX_SKELETON_BYTES",
    "MAX_UPLOAD_BYTES",
    "MIN_AVERAGE_EVENT_BYTES",
    "MIN_AVERAGE_FREE",
    "NUMERIC_ARGS",
    "OBJECT_ARGS",
    "OLD_ARG_SPELLINGS",
    "TEXT_FIELDS",
    "Columns",
    "Limits",
    "MiB",
    "Progress",
    "RawTrace",
    "Splitter",
    "TraceError",
    "_dumps",
    "_loads",
    "decode_batch",
    "inflated",
    "raw_chunks",
    "read_path",
    "read_text",
]


@dataclass
class RawTrace:
    """What a read yields: event columns (COLUMNS), the document's other keys, the events skipped, and the
    names the metadata events give lanes (lane_names.LANE_NAME_KINDS)."""

    columns: dict[str, np.ndarray]
    metadata: dict[str, Any]
    skipped: int
    ts_base_us: int = 0  # the columns' `ts` and `end` are µs since this many µs (`Rebase`)
    lane_names: LaneNames = field(default_factory=dict)
    distinct_texts: int = 0  # distinct names, categories and lanes (one object each): what admission counts


def read_path(path: Path, limits: Limits | None = None, progress: Progress | None = None) -> RawTrace:
    """Read a `.json` or `.json.gz` trace file (or any readable path) within `limits`."""
    limits = limits or Limits()
    return _read(raw_chunks(path, limits, progress), limits, path.name, native=native_wanted(_file_json_bytes(path)))


def read_text(data: bytes, limits: Limits | None = None, source: str = "trace", typed: bool = True) -> RawTrace:
    """Read a trace already in memory (JSON text or gzip), through the same bounded pipeline; `typed` False
    reads every batch by the reference route (orjson or the stdlib into dicts), to check the typed one."""
    limits = limits or Limits()
    if len(data) > limits.upload_bytes:
        raise TraceError(f"trace: the data is {_mib(len(data))}; the limit is {_mib(limits.upload_bytes)}")
    chunks = iter([data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)])
    return _read(chunks, limits, source, typed, native_wanted(_json_bytes(data[:2], data[-4:], len(data))))


def decode_batch(text: bytes, base: int, source: str = "trace", typed: bool = True, native: bool = False) -> Block:
    """One batch of events (`[e1,...]` JSON text as the file holds it) as a Block, its `ts` rebased on
    `base` µs (`timestamps.rebased`).

    With `native`, the compiled decoder where it takes the batch (profiling/native.py); else the typed decoder
    where its schema takes it; else, or with `typed` False, the reference (orjson or the stdlib into dicts),
    whose error a batch that is not valid JSON raises."""
    if native:
        from profiling.native import native_block  # numba loads in ~0.8 s: only a large trace pays it

        block = native_block(text, base)
        if block is not None:
            return block
    rows = typed_rows(text, base) if typed else None
    if rows is not None:
        try:
            return block_of(rows, len(rows), base)
        except (_JSONError, UnicodeDecodeError):  # a nested value orjson refuses: the reference says so
            pass
    batch = _parse(rebased(text, base), source)
    events = [e for e in batch if type(e) is dict]
    return block_of(DictRows(events), len(batch), base)


def native_wanted(json_bytes: int) -> bool:
    """Whether a read of about `json_bytes` of JSON takes the compiled decoder (NATIVE_FROM_BYTES)."""
    asked = os.environ.get(NATIVE_ENV, "").strip().lower()
    if asked in ("0", "false", "no", "off"):
        return False
    return asked in ("1", "true", "yes", "on") or "numba" in sys.modules or json_bytes >= NATIVE_FROM_BYTES


def _file_json_bytes(path: Path) -> int:
    """The JSON a trace file holds, as its size and a gzip's trailer tell it (0 where they cannot).

    A pipe or a device is not opened here: the read opens it, once. Opened here first, a pipe's writer saw its
    reader close, and the read's own open then waited for a writer that had gone (the test of a pipe hung)."""
    try:
        info = path.stat()
        if info.st_size < 4 or not stat.S_ISREG(info.st_mode):
            return 0
        with path.open("rb") as f:
            head = f.read(2)
            f.seek(info.st_size - 4)
            return _json_bytes(head, f.read(4), info.st_size)
    except OSError:
        return 0


def _json_bytes(head: bytes, tail: bytes, size: int) -> int:
    """`size` bytes of JSON, or of gzip whose last four bytes record its inflated size (modulo 4 GiB: the larger
    of the two is a fair guess, and only a guess: it picks a decoder, and bounds nothing)."""
    if head != b"\x1f\x8b" or len(tail) < 4:
        return size
    return max(size, int.from_bytes(tail, "little"))


def _read(chunks: Iterator[bytes], limits: Limits, source: str, typed: bool = True, native: bool = False) -> RawTrace:
    """Read the chunks of a trace; `native`: take the compiled decoder once the helper starts (`native_wanted`)."""
    splitter, columns, rebase, json_bytes = Splitter(limits), Columns(limits), Rebase(), 0
    helper: DecodeHelper | None = None
    wanted = typed and available() and helper_wanted()
    planned, native = native and typed, False
    try:
        with paused_gc():  # millions of small objects and no cycles (profiling/gc_pause.py)
            for chunk in inflated(chunks, limits.inflated_bytes):
                json_bytes += len(chunk)
                for batch in splitter.feed(chunk):
                    columns.ts_base_us = rebase.settle(batch)
                    if planned and json_bytes > NATIVE_AFTER_BYTES:
                        planned, native = False, native_ready()  # before the fork below, which then shares it
                        splitter.compiled = compiled_structure() if native else None
                    if helper is None and wanted and json_bytes > START_AFTER_BYTES:
                        helper = DecodeHelper(partial(decode_batch, source=source, native=native))
                    if helper is None:
                        block = decode_batch(batch, columns.ts_base_us, source, typed, native)
                        columns.append(block, json_bytes)
                    else:
                        for block in helper.submit(batch, columns.ts_base_us):
                            columns.append(block, json_bytes)
            for block in helper.finish() if helper is not None else ():
                columns.append(block, json_bytes)
            document = _parse(splitter.finish(), source)
            metadata = _metadata(document, columns, json_bytes, source)
            arrays, texts = columns.arrays(), len(columns.strings)
            return RawTrace(arrays, metadata, columns.skipped, columns.ts_base_us, columns.lane_names, texts)
    finally:
        if helper is not None:
            helper.close()


def native_ready() -> bool:
    """Whether the compiled decoder is installed (numba is optional), loaded here with its compiled code."""
    from profiling.native import warm  # imports without numba too, and then says so

    return warm()


def compiled_structure() -> Any:
    """The compiled structural scan (`native_structure.structure`), once `native_ready`."""
    from profiling.native_structure import structure

    return structure


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
