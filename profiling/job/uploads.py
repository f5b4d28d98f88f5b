"""A job uploaded to the app: several rank traces, or one zip of them, analysed one rank after another.

    with job_upload_files(paths) as files:
        result = analyze_job_uploads(files, time_limit_s, progress, cancelled)

The Space never starts a cluster: each rank is admitted against the one memory budget and time-limited
as /analyze is (`profiling.uploads.analyze_upload`, with `summarize_upload` as its work), and only its
`RankSummary` comes back. A zip's entries are streamed out through the reader's caps (each entry's bytes
within `MAX_UPLOAD_BYTES`, its JSON inflated within `MAX_INFLATED_BYTES`, the job's JSON within
`MAX_JOB_INFLATED_BYTES`) into fresh files named by their index: an entry's name is never a path (no zip
slip), and is not read at all. The files live in a temporary folder the context manager removes, whatever
happens inside it.
"""

from __future__ import annotations

import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from profiling.job.rank_summary import RankSummary, summarize_rank
from profiling.job.ranks import MAX_RANKS, JobError
from profiling.job.run import TRACE_SUFFIXES, JobProgress, JobResult, job_result
from profiling.reader import CHUNK_BYTES, MAX_INFLATED_BYTES, MAX_UPLOAD_BYTES, Limits, Progress, TraceError
from profiling.scan import _mib, inflated, raw_chunks

MAX_JOB_INFLATED_BYTES = 4 * 1024**3  # the JSON of every rank together (issue 23)
MAX_ZIP_ENTRIES = 1024  # entries of any kind (folders, other files) in one zip
ENGINE = "one rank after another"
ENTRY_NAME = "rank-entry-{:02d}{}"  # zero-padded: ranks numbered by sorted order keep the zip's order


@contextmanager
def job_upload_files(paths: Sequence[str | Path]) -> Iterator[list[Path]]:
    """The rank traces of an upload: several .json/.json.gz files (used where they are), or ONE .zip, whose
    trace entries are written to a temporary folder removed on leaving the block (on error too).

    Raises JobError naming `traces`: no trace, more than MAX_RANKS, a zip among other files, a zip that is
    not one, or more than MAX_JOB_INFLATED_BYTES of JSON in all. A rank's own bad trace is not refused
    here: the job lists its error and goes on."""
    files = [Path(p) for p in paths]
    if not files:
        raise JobError("traces: upload the rank traces (.json or .json.gz files) or one .zip of them")
    zips = [f for f in files if f.name.lower().endswith(".zip")]
    if zips and len(files) > 1:
        raise JobError(f"traces: upload one .zip alone, or the rank traces without a zip ({len(files)} files given)")
    if zips:
        with tempfile.TemporaryDirectory(prefix="attention-profiler-job-") as folder:
            yield _unzipped(files[0], Path(folder))
        return
    traces = [f for f in files if f.name.lower().endswith(TRACE_SUFFIXES)]
    if not traces:
        raise JobError(f"traces: none of the {len(files)} files is a .json or .json.gz trace")
    if len(traces) > MAX_RANKS:
        raise JobError(f"traces: {len(traces)} traces; a job takes at most {MAX_RANKS} ranks")
    left = MAX_JOB_INFLATED_BYTES
    for path in traces:
        left -= _json_bytes(path, left)
    yield traces


def _json_bytes(path: Path, left: int) -> int:
    """The JSON in the trace at `path`, counted through the reader's caps; more than `left` is refused. A
    trace the reader refuses otherwise counts 0 here: its rank gets that error when it is read."""
    limits = Limits()
    cap = min(limits.inflated_bytes, left)
    with path.open("rb") as f:
        plain = f.read(2) != b"\x1f\x8b"
    size = path.stat().st_size
    if plain and size <= limits.upload_bytes:  # plain JSON: its size is its JSON, no need to read it here
        if size > cap and cap == left:
            raise _too_much()
        return size if size <= cap else 0
    try:
        return sum(len(c) for c in inflated(raw_chunks(path, limits), cap))
    except TraceError as exc:
        if cap == left and _past_cap(exc):
            raise _too_much() from None
        return 0


def _past_cap(exc: TraceError) -> bool:
    return "inflates to more than" in str(exc)


def _too_much() -> JobError:
    limit = _mib(MAX_JOB_INFLATED_BYTES)
    return JobError(f"traces: the job's traces hold more than {limit} of JSON in all (the limit)")


def _entry_count(archive: Path) -> int:
    """The entries the zip's end record declares, read before zipfile lists them all in memory."""
    with archive.open("rb") as f:
        end = zipfile._EndRecData(f)  # type: ignore[attr-defined]  # the stdlib's own reader of that record
    if not end:
        raise zipfile.BadZipFile("no end of central directory record")
    return int(end[zipfile._ECD_ENTRIES_TOTAL])  # type: ignore[attr-defined]


def _unzipped(archive: Path, folder: Path) -> list[Path]:
    """The zip's trace entries, each streamed into `folder` as ENTRY_NAME by its index among the traces."""
    try:
        declared = _entry_count(archive)
        if declared > MAX_ZIP_ENTRIES:
            raise JobError(f"traces: the zip holds {declared:,} entries; at most {MAX_ZIP_ENTRIES:,} are read")
        with zipfile.ZipFile(archive) as zipped:
            listed = zipped.infolist()
            entries = [e for e in listed if not e.is_dir() and e.filename.lower().endswith(TRACE_SUFFIXES)]
            skipped = len(listed) - len(entries)
            if not entries:
                raise JobError(f"traces: the zip holds no .json or .json.gz trace ({skipped} other entries skipped)")
            if len(entries) > MAX_RANKS:
                raise JobError(f"traces: the zip holds {len(entries)} traces; a job takes at most {MAX_RANKS} ranks")
            left = MAX_JOB_INFLATED_BYTES
            out = []
            for index, entry in enumerate(entries):
                suffix = ".json.gz" if entry.filename.lower().endswith(".gz") else ".json"
                target = folder / ENTRY_NAME.format(index, suffix)
                with zipped.open(entry) as source:
                    left -= _copy_entry(source, target, left, index)
                out.append(target)
            return out
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, zlib.error) as exc:
        raise JobError(f"traces: {archive.name[:100]!r} is not a zip this app can read ({exc})") from None


def _copy_entry(source: zipfile.ZipExtFile, target: Path, left: int, index: int) -> int:
    """Stream one entry into `target`: its bytes within MAX_UPLOAD_BYTES, its JSON (inflated, when it is
    gzip) within MAX_INFLATED_BYTES and what is `left` of the job's; returns the JSON's bytes. An entry
    the reader would refuse otherwise (corrupt gzip) is copied whole and counts 0: its rank gets the error."""
    written = 0

    def chunks() -> Iterator[bytes]:
        nonlocal written
        with target.open("xb") as out:  # "x": a fresh file, never one already there
            while chunk := source.read(CHUNK_BYTES):  # bounded: zipfile inflates at most this much a read
                written += len(chunk)
                if written > MAX_UPLOAD_BYTES:
                    raise JobError(f"traces: zip entry {index} holds more than {_mib(MAX_UPLOAD_BYTES)} (the limit)")
                out.write(chunk)
                yield chunk

    cap = min(MAX_INFLATED_BYTES, left)
    raw = chunks()
    try:
        return sum(len(c) for c in inflated(raw, cap))
    except TraceError as exc:
        if not _past_cap(exc):
            for _ in raw:  # the rest of the entry, as it is
                pass
            return 0
        if cap == left:
            raise _too_much() from None
        raise JobError(f"traces: zip entry {index} inflates to more than {_mib(cap)} of JSON (the limit)") from None
    finally:
        raw.close()


def summarize_upload(path: str, limits: dict[str, int], progress: Progress | None = None) -> RankSummary:
    """`summarize_rank` within the reader limits the app admitted (the work of `analyze_upload`)."""
    return summarize_rank(path, progress, **limits)


def analyze_job_uploads(
    files: Sequence[str | Path],
    time_limit_s: float | None = None,
    progress: JobProgress | None = None,
    cancelled: Callable[[], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> JobResult:
    """Every rank in turn, each admitted as /analyze is; one rank's failure is its error, and the job goes on.
    A caller who leaves stops the job (AnalysisStopped).

    `time_limit_s` bounds the whole job, not each rank (64 ranks must not hold the Space 64 times as long):
    each rank gets what is left, and the ranks the limit leaves no time for carry that as their error."""
    from profiling.uploads import analyze_upload

    paths = [str(f) for f in files]
    report = progress or (lambda fraction, message: None)
    deadline = None if time_limit_s is None else clock() + time_limit_s
    summaries: dict[str, RankSummary] = {}
    for i, path in enumerate(paths):
        name = Path(path).name
        left_s = None if deadline is None else deadline - clock()
        if left_s is not None and left_s <= 0:
            summaries[path] = RankSummary(path=path, error=f"time limit: the job's {time_limit_s:.0f} s ran out first")
            continue

        def rank_progress(fraction: float, message: str, i: int = i, name: str = name) -> None:
            report((i + min(max(fraction, 0.0), 1.0)) / len(paths), f"rank {i + 1} of {len(paths)} ({name}): {message}")

        try:
            summary = analyze_upload(path, left_s, rank_progress, cancelled, work=summarize_upload, args=())
        except Exception as exc:  # the rank's error: too big, too slow, not a trace; the others go on
            if cancelled is not None and cancelled():
                raise
            summary = RankSummary(path=path, error=str(exc))
        summaries[path] = summary
        read = f"{summary.file_bytes:,} bytes read" if summary.error is None else "failed"
        report((i + 1) / len(paths), f"{i + 1} of {len(paths)} ranks done ({name}: {read})")
    return job_result(paths, summaries, ENGINE)
