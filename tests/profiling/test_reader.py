"""The reader, field by field, against a plain-loop reference reader written here; and every trace vintage."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from decimal import Context, Decimal, localcontext
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from profiling.progress import TerminalProgress
from profiling.reader import MAX_DEPTH, MIN_AVERAGE_EVENT_BYTES, MiB
from profiling.trace import CATEGORY_SPELLINGS, NUMERIC_ARGS, OBJECT_ARGS, TraceError, load_trace, parse_trace
from tests.conftest import DATA, ROOT
from tests.timing_slack import slack

VINTAGES = DATA / "vintages"
# The TensorBoard plugin's ResNet-50 sample (Kineto, June 2021): the old spellings at scale.
TB_PLUGIN = next(
    (p for p in (DATA / "tb_plugin", Path("/work/shared/traces/tb_plugin")) if p.is_dir()), DATA / "tb_plugin"
)
RESNET = TB_PLUGIN / "resnet50_num_workers_4.pt.trace.json.gz"
REAL_TRACES = [*sorted(DATA.glob("*.json.gz")), RESNET, TB_PLUGIN / "gpu_metrics_input.json"]

# Restated here, not imported: the old spellings and what they mean today (Kineto's ActivityType names).
TODAY = {
    "kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset", "runtime": "cuda_runtime",
    "driver": "cuda_driver", "operator": "cpu_op", "python": "python_function", "async": "ac2g",
    "hip_runtime": "cuda_runtime", "hip_driver": "cuda_driver",
    # Other accelerators' launch categories (Kineto's MTIA_RUNTIME, XPU_*, PRIVATEUSE1_*), read as CUDA's.
    "mtia_runtime": "cuda_runtime", "xpu_runtime": "cuda_runtime", "xpu_driver": "cuda_driver",
    "privateuse1_runtime": "cuda_runtime", "privateuse1_driver": "cuda_driver",
}  # fmt: skip
OLD_ARG_KEYS = {"External id": "external id", "Input Dims": "Input dims"}
# README: a name over 4 kB is cut at load to its first 4,095 characters and "…" (a100_simple_add holds a
# real 5,123-character kernel name).
NAME_CHARS = 4096


def _document(path: Path) -> Any:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _number(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else math.nan


def _time(value: Any, base: int = 0) -> float:
    """A time as the reader reads it, relative to `base`: NaN where it lies past 1e17 µs (3,000 years: junk) as the
    file wrote it, i.e. from 0, not from the base (a time 1e17 before a base of 7e16 is 3e16 as written)."""
    number = _number(value)
    return number if abs(number + base) <= 1e17 else math.nan


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _name(value: Any) -> str:
    text = _text(value)
    return text if len(text) <= NAME_CHARS else text[: NAME_CHARS - 1] + "…"


def _lane(value: Any) -> str:
    return str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else "?"


def _arg(args: dict, key: str) -> Any:
    # The old spelling is read where the new one is missing or null.
    value = args.get(key)
    return value if value is not None else args.get(OLD_ARG_KEYS.get(key, key))


# The reader's base for times (README; profiling/timestamps.py, `Rebase`), restated: where the events' first
# "ts" number is written with a fraction or an exponent and lies from 2**53 / 1000 µs (where float64
# stops holding every ns) to 1e17 µs, every "ts" in the events is read exactly relative to 1e12 µs
# before its whole µs.
REBASE_FROM_US = 2**53 // 1000
REBASE_MARGIN_US = 10**12


def _events_of(document: Any) -> list:
    return document["traceEvents"] if isinstance(document, dict) else document


def _is_number(value: Any) -> bool:
    return type(value) in (int, Decimal)  # JSON numbers as json.loads(parse_float=Decimal) reads them


def _ts_values(value: Any) -> Iterator[Any]:
    """Every "ts" key's value, at any depth, in text order."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "ts":
                yield inner
            yield from _ts_values(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _ts_values(inner)


def ts_base(exact_events: list) -> int:
    first = next((v for v in _ts_values(exact_events) if _is_number(v)), None)
    if type(first) is not Decimal or not REBASE_FROM_US <= first <= 1e17:
        return 0  # no number, a whole number (exact in float64), or out of range
    return int(first) - REBASE_MARGIN_US


def _relative(exact: Any, base: int) -> Any:
    """A "ts" value relative to `base`, as the reader reads it: a whole number stays one; None past 1e17."""
    if not _is_number(exact):
        return exact
    if abs(exact) > Decimal("1e17"):
        return None
    with localcontext(Context(prec=64)):
        shifted = Decimal(exact) - base
    return int(shifted) if type(exact) is int else float(shifted)


def _rebased(value: Any, exact: Any, base: int) -> Any:
    """`value` (as json.loads reads it) with every "ts" in it, at any depth, relative to `base`."""
    if isinstance(value, dict):
        return {k: _relative(exact[k], base) if k == "ts" else _rebased(v, exact[k], base) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebased(v, e, base) for v, e in zip(value, exact, strict=True)]
    return value


def reference_rows(document: Any, text: str | bytes | None = None) -> tuple[list[dict], int]:
    """What the event table must hold, by a plain loop over the JSON: the usable events, and the skipped
    count. `text` is the document's JSON (json.dumps of it if not given), read again for exact times."""
    exact = _events_of(json.loads(json.dumps(document) if text is None else text, parse_float=Decimal))
    base = ts_base(exact)
    raw = _events_of(document)
    if base:
        raw = _rebased(raw, exact, base)
    rows, skipped = [], 0
    for event in raw:
        if not isinstance(event, dict):
            skipped += 1
            continue
        ph, name, ts, dur = _text(event.get("ph")), _name(event.get("name")), event.get("ts"), event.get("dur")
        ts, dur = _time(ts, base), _time(dur) if ph == "X" else 0.0
        usable = ph == "M" or (not math.isnan(ts) and (ph != "X" or (dur >= 0 and name != "")))
        if not usable:
            skipped += 1
            continue
        cat = TODAY.get(_text(event.get("cat")).lower(), _text(event.get("cat")))
        if cat == "cpu_op" and name.startswith(
            ("ProfilerStep#", "Optimizer.", "enumerate(DataLoader)#", "enumerate(DataPipe)#")
        ):
            cat = "user_annotation"  # torch's own record_function ranges, recorded as ops before torch 1.10
        args = event["args"] if isinstance(event.get("args"), dict) else {}
        row = {"name": name, "cat": cat, "ph": ph, "ts": ts, "dur": 0.0 if math.isnan(dur) else dur}
        row |= {"end": ts + row["dur"], "pid": _lane(event.get("pid")), "tid": _lane(event.get("tid"))}
        row |= {column: _number(_arg(args, key)) for key, column in NUMERIC_ARGS.items()}
        row |= {column: _arg(args, key) for key, column in OBJECT_ARGS.items()}
        rows.append(row)
    return rows, skipped


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _same(have: Any, want: Any) -> bool:
    # A missing value may read as None or NaN; anything present must be equal, type included.
    if _missing(have) or _missing(want):
        return _missing(have) and _missing(want)
    return have == want and type(have) is type(want)


@pytest.mark.parametrize("path", REAL_TRACES + sorted(VINTAGES.glob("*.json")), ids=lambda p: p.name)
def test_every_field_matches_the_reference_reader(path):
    data = path.read_bytes()
    expected, skipped = reference_rows(_document(path), gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    trace = load_trace(path)
    assert trace.skipped == skipped and len(trace.events) == len(expected)
    got = trace.events.to_dict(orient="records")
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        wrong = {k: (want[k], have[k]) for k in want if not _same(have[k], want[k])}
        assert not wrong, f"event {i}: {wrong}"


def test_resnet50_2021_spellings_count_as_today():
    raw = _document(RESNET)["traceEvents"]
    count = {old: sum(1 for e in raw if e.get("cat") == old) for old in ("Kernel", "Runtime", "Memcpy", "Memset")}
    steps = [e["name"] for e in raw if e.get("cat") == "Operator" and e["name"].startswith("ProfilerStep#")]
    trace = load_trace(RESNET)
    assert count["Kernel"] == len(trace.kernels) == 8868
    for old, new in (("Runtime", "cuda_runtime"), ("Memcpy", "gpu_memcpy"), ("Memset", "gpu_memset")):
        assert count[old] == len(trace.of_category(new)) > 0
    annotations = trace.of_category("user_annotation")["name"]
    assert list(annotations[annotations.str.startswith("ProfilerStep#")]) == steps and len(steps) == 6
    assert {"Optimizer.step#SGD.step", "Optimizer.zero_grad#SGD.zero_grad"} <= set(annotations)
    assert trace.kernels["external_id"].notna().all()  # spelled `external id` in 2021


def _comparable(path: Path) -> pd.DataFrame:
    events = load_trace(path).events
    # Metadata, memory instants and flow arrows differ in names or fields across vintages; the rest must not.
    flows = events[events["ph"].isin(("s", "f"))]
    assert flows["cat"].eq("ac2g").all()
    return events[~events["ph"].isin(("M", "i", "s", "f"))].reset_index(drop=True)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("kineto_2021.json", "kineto_2024.json"),
        ("rocm_hip_categories.json", "rocm_kineto.json"),
        ("driver_1x_style.json", "driver_and_sync.json"),
    ],
)
def test_old_and_new_spellings_give_the_same_table(old, new):
    pd.testing.assert_frame_equal(_comparable(VINTAGES / old), _comparable(VINTAGES / new))


def test_every_spelling_in_the_table_appears_in_a_test_trace():
    seen: set[str] = set()
    for path in [*VINTAGES.glob("*.json"), *REAL_TRACES]:
        document = _document(path)
        seen |= {e.get("cat") for e in (document["traceEvents"] if isinstance(document, dict) else document)}
    assert {spelling for spelling, _, _ in CATEGORY_SPELLINGS} <= seen


def test_nanosecond_traces_keep_microseconds():
    raw = _document(VINTAGES / "nanoseconds.json")
    trace = load_trace(VINTAGES / "nanoseconds.json")
    # displayTimeUnit only tells a viewer how to show times; ts and dur are microseconds, fractional here.
    assert list(trace.events["ts"]) == [e["ts"] for e in raw["traceEvents"]]
    assert list(trace.events["dur"]) == [e["dur"] for e in raw["traceEvents"]]
    assert trace.metadata["displayTimeUnit"] == "ns"


def _epoch_ns_events(odd: bool) -> str:
    """Events as Kineto wrote them before baseTimeNanoseconds (epoch µs, `%d.%03d`), back to back by 1 ns;
    the metadata, written first, is the earliest. `odd` adds every other spelling of a time."""
    lines = ['{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 1699999999999000.001}']
    for k in range(6):
        ns = 1_700_000_000_000_000_000 + k
        lines.append(
            f'{{"ph": "X", "cat": "cpu_op", "name": "op{k}", "pid": 1, "tid": 1, "ts": {ns // 1000}.{ns % 1000:03d},'
            f' "dur": 0.00{k}, "args": {{"External id": {k}, "grid": {{"ts": 1700000000000000.5}}}}}}'
        )
    if odd:
        lines += [
            f'{{"ph": "X", "cat": "cpu_op", "name": "odd", "pid": 1, "tid": 1, "ts": {ts}, "dur": 1}}'
            for ts in ("1.7000000000000015e15", "1700000000000002", "-3.5", "0.25", "100000000000000003", '"7"')
        ]
        lines.append('{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1e3, "args": {"grid": {"ts": 5}}}')
    return '{"traceEvents": [\n' + ",\n".join(lines) + "\n]}"


@pytest.mark.parametrize("odd", [False, True], ids=["kineto", "odd"])
def test_nanosecond_epoch_times_match_the_reference_reader(odd):
    """Epoch µs with ns digits (~1.7e15) read to the ns, relative to `ts_base_us`; the reference reads
    the text exactly (Decimal). `odd` takes the reader's value-by-value path; `kineto` its fast one."""
    text = _epoch_ns_events(odd)
    trace = parse_trace(text.encode())
    expected, skipped = reference_rows(json.loads(text), text)
    assert trace.ts_base_us == 1699999999999000 - REBASE_MARGIN_US
    assert trace.skipped == skipped and len(trace.events) == len(expected)
    for i, (want, have) in enumerate(zip(expected, trace.events.to_dict(orient="records"), strict=True)):
        wrong = {k: (want[k], have[k]) for k in want if not _same(have[k], want[k])}
        assert not wrong, f"event {i}: {wrong}"
    ops = trace.events[trace.events["name"].str.startswith("op")]
    assert list((ops["ts"].diff().dropna() * 1000).round()) == [1] * 5  # 1 ns apart, as written


# --- hostile input (issue 10) --------------------------------------------------------------------


def _in_worker_thread(read: Any) -> BaseException | None:
    """Run `read` in a thread with the default stack, as Gradio's workers are; return what it raised."""
    outcome: list[BaseException | None] = [None]

    def run() -> None:
        try:
            read()
        except BaseException as exc:  # handed to the test, which checks its type
            outcome[0] = exc

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return outcome[0]


def _nested(levels: int, kind: str) -> bytes:
    opener, closer = (b'{"a":', b"}") if kind == "objects" else (b"[", b"]")
    return opener * levels + b"1" + closer * levels


def _deep_document(levels: int, kind: str, where: str) -> bytes:
    inner = _nested(levels, kind)
    if where == "top level":
        return inner
    return b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 1, "args": {"a": ' + inner + b"}}]}"


@pytest.mark.parametrize("levels", [10**5, 10**6])
@pytest.mark.parametrize("kind", ["objects", "lists"])
@pytest.mark.parametrize("where", ["args", "top level"])
def test_deep_nesting_is_refused_in_a_worker_thread(levels, kind, where):
    data = _deep_document(levels, kind, where)
    error = _in_worker_thread(lambda: parse_trace(data))
    assert isinstance(error, TraceError)
    assert str(error) == f"trace: nested deeper than {MAX_DEPTH} levels; not a torch.profiler trace"


def test_nesting_within_the_cap_is_read():
    dims = json.loads(_nested(MAX_DEPTH - 5, "lists"))
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 1, "args": {"Input Dims": dims}}
    trace = parse_trace(json.dumps({"traceEvents": [event]}).encode())
    assert trace.events["input_dims"].iloc[0] == dims


def test_event_cap_names_the_count_and_the_cap():
    events = b",".join([b'{"ph": "i", "name": "x", "pid": 1, "tid": 1, "ts": 1}'] * 1000)
    with pytest.raises(TraceError, match=r"more than 999 events \(the cap\)"):
        parse_trace(b'{"traceEvents": [' + events + b"]}", events=999)


def test_tiny_events_are_refused_before_they_fill_memory():
    tiny = b'{"ph":"M"},' * 300_000  # 11 bytes per event; real ones take 96 and more
    message = rf"average 11 bytes; torch.profiler events take over {MIN_AVERAGE_EVENT_BYTES}"
    with pytest.raises(TraceError, match=message):
        parse_trace(b"[" + tiny + b'{"ph":"M"}]')


def test_an_event_over_the_size_cap_is_refused():
    big = b'{"ph": "X", "name": "' + b"n" * (2 * MiB) + b'", "ts": 1, "dur": 1}'
    with pytest.raises(TraceError, match=r"event 1 is larger than 1 MiB \(the cap per event\)"):
        parse_trace(b'{"traceEvents": [{"ph": "M"}, ' + big + b"]}", event_bytes=MiB)


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ('{"id": "x", "name": "GPU"}', r"`deviceProperties\[0\].id` must be a whole number, got 'x'"),
        ('{"id": [0], "name": "GPU"}', r"`deviceProperties\[0\].id` must be a whole number, got \[0\]"),
        ("[0, 1]", r"`deviceProperties\[0\]` must be an object, got list"),
    ],
)
def test_bad_device_properties_name_the_field(properties, message):
    data = f'{{"deviceProperties": [{properties}], "traceEvents": []}}'.encode()
    with pytest.raises(TraceError, match=message):
        parse_trace(data)


def test_device_properties_that_are_not_a_list():
    with pytest.raises(TraceError, match="`deviceProperties` must be a list of objects, got dict"):
        parse_trace(b'{"deviceProperties": {"id": 0}, "traceEvents": []}')


def test_dev_zero_is_refused_at_once():
    start = time.perf_counter()
    with pytest.raises(TraceError, match="not valid JSON: it starts with"):
        load_trace("/dev/zero")
    assert time.perf_counter() - start < slack(5)


def test_a_pipe_is_counted_as_it_arrives(tmp_path):
    fifo = tmp_path / "upload.json"
    os.mkfifo(fifo)
    event = b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1},'
    stop = threading.Event()

    def endless_writer() -> None:  # a trace that never ends: st_size says 0
        with contextlib.suppress(BrokenPipeError), fifo.open("wb") as f:
            f.write(b'{"traceEvents": [')
            while not stop.is_set():
                f.write(event * 1000)

    writer = threading.Thread(target=endless_writer, daemon=True)
    writer.start()
    try:
        with pytest.raises(TraceError, match=r"upload.json holds more than 4 MiB \(the limit\)"):
            load_trace(fifo, upload_bytes=4 * MiB)
    finally:
        stop.set()
        writer.join(timeout=10)


def test_a_time_is_junk_past_1e17_us_as_written_not_as_rebased():
    """A base near 6.7e16 µs (the first time, with an exponent), and an instant 3.3e16 µs before the epoch: within
    the range as written, 1.0e17 before the base. It is kept, at its time relative to the base (the fuzzer found
    the reference and the reader judging these two ways)."""
    first = {"ph": "X", "cat": "kernel", "name": "k", "ts": 6.746172698044158e16, "dur": 1}
    early = {"ph": "i", "cat": "kernel", "name": "i", "ts": -3.253927301955843e16}
    late = {"ph": "i", "cat": "kernel", "name": "j", "ts": 1.000000001e17}  # past the range as written: junk
    document = {"traceEvents": [first, early, late]}
    trace = parse_trace(json.dumps(document).encode())
    expected, skipped = reference_rows(document)
    base = trace.ts_base_us
    assert base == 67_461_726_980_441_580 - 10**12 and skipped == trace.skipped == 1  # from the text, exactly
    assert trace.events["name"].tolist() == [row["name"] for row in expected] == ["k", "i"]
    assert trace.events["ts"].iloc[1] == pytest.approx(-3.253927301955843e16 - base, rel=1e-15)


def test_a_pipe_is_opened_once(tmp_path, monkeypatch):
    """A pipe is read by the one open of the read: opened before to size it, its writer's trace could go to a
    reader that closed without reading, and the read's own open then waited for a writer that had gone."""
    fifo = tmp_path / "once.json"
    os.mkfifo(fifo)
    opened: list[Path] = []
    real_open = Path.open

    def counted(self: Path, *args, **kwargs):
        opened.append(self)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counted)
    trace = b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]}'

    def write_and_close() -> None:
        fd = os.open(fifo, os.O_WRONLY)
        os.write(fd, trace)
        os.close(fd)

    writer = threading.Thread(target=write_and_close, daemon=True)
    writer.start()
    read: list = []
    reader_thread = threading.Thread(target=lambda: read.append(load_trace(fifo)), daemon=True)
    reader_thread.start()
    reader_thread.join(timeout=30)
    if reader_thread.is_alive():  # waiting on a second open: a writer that opens and closes lets it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader_thread.join(timeout=10)
    assert opened.count(fifo) == 1
    assert read and read[0].events["name"].tolist() == ["k"]


def test_a_directory_is_not_a_trace(tmp_path):
    with pytest.raises(TraceError, match=f"cannot read {tmp_path.name}: Is a directory"):
        load_trace(tmp_path)


def test_progress_reports_bytes_read_out_of_the_size():
    heard: list[tuple[float, str]] = []
    load_trace(RESNET, progress=lambda fraction, message: heard.append((fraction, message)))
    fractions = [f for f, _ in heard]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) > 1
    size = RESNET.stat().st_size
    assert heard[-1][1] == f"reading the trace: {size / MiB:.1f} MiB of {size / MiB:.1f} MiB"


def test_lanes_keep_their_text_next_to_missing_and_odd_ones():
    pids = [1, None, 1.0, True, "stream 7", [1]]
    events = [{"ph": "i", "name": "x", "ts": 1, "tid": 2, **({} if p is None else {"pid": p})} for p in pids]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    assert list(trace.events["pid"]) == [_lane(p) for p in pids] == ["1", "?", "1.0", "?", "stream 7", "?"]


ODD_VALUES = {
    "ts": [True, "5", 2**70, 1e300 * 10, -(2**63)],
    "pid": [True, 1.0, "1/2", [1], {"a": 1}, 2**62],
    "name": [7, None, ["aten::mm"], True],
    "args": [{"correlation": True}, {"External id": None, "external id": 9}, {"grid": [1, 1]}, [1]],
}


@pytest.mark.parametrize("field", sorted(ODD_VALUES))
def test_one_odd_value_in_a_batch_of_plain_ones(field):
    """Each field is read a batch at a time, by numpy when every value is plain and value by value
    when one is not: a batch with one odd value must still match the reference reader everywhere."""
    plain = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.5, "dur": 2, "pid": 1, "tid": "7"}
    plain["args"] = {"correlation": 3, "External id": 4, "Input Dims": [[2, 3], [3, 4]], "grid": [1, 2, 3]}
    events = [dict(plain, ts=float(i)) for i in range(50)]
    for i, value in enumerate(ODD_VALUES[field]):
        events[5 * i + 1][field] = value
    document = {"traceEvents": events}
    expected, skipped = reference_rows(json.loads(json.dumps(document, default=str).replace("Infinity", "1e999")))
    trace = parse_trace(json.dumps(document, default=str).replace("Infinity", "1e999").encode())
    assert trace.skipped == skipped and len(trace.events) == len(expected)
    for i, (want, have) in enumerate(zip(expected, trace.events.to_dict(orient="records"), strict=True)):
        wrong = {k: (want[k], have[k]) for k in want if not _same(have[k], want[k])}
        assert not wrong, f"event {i}: {wrong}"


def test_the_stdlib_fallback_reads_every_trace_the_same():
    # A child without orjson and msgspec (as on a bare torch install) runs this file's reference checks.
    checks = "every_field or same_table or deep_nesting or lanes or nanosecond"
    code = (
        "import sys, json; sys.modules['orjson'] = None; sys.modules['msgspec'] = None; import pytest\n"
        f"code = pytest.main(['-q', '-p', 'no:cacheprovider', {__file__!r}, '-k', {checks!r}])\n"
        "import profiling.reader as r; assert r._loads is json.loads, r._loads\n"
        "import profiling.decode as d; assert not d.available()\n"
        "sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


_PEAK = """
import sys
from pathlib import Path
from profiling.trace import load_trace
def hwm():
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))
base = hwm()
trace = load_trace(Path(sys.argv[1]))
print(len(trace.events), hwm() - base)
"""


def _peak_growth(path: Path) -> tuple[int, int]:
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, str(path)], cwd=ROOT, capture_output=True, text=True, check=True
    )
    rows, growth = done.stdout.split()
    return int(rows), int(growth)


def test_peak_memory_of_a_large_real_like_trace(tmp_path):
    """A 50 MiB replica of a real training trace: each further byte of JSON costs under 1.5 bytes
    of peak RSS. The fixed part (about 20 MiB here: first-use allocations) is measured on a 1x copy
    and taken off, so the ratio is the one that holds at 1 GiB."""
    from bench.synthetic import replicate  # here: the bench needs orjson, the stdlib-only child does not

    sizes = {}
    for copies in (1, 30):
        path = tmp_path / f"replica{copies}.json.gz"
        events, json_bytes = replicate(DATA / "sampled_training_rank0.json.gz", copies, path)
        rows, growth = _peak_growth(path)
        assert rows == events
        sizes[copies] = json_bytes, growth
    (small_json, small_growth), (json_bytes, growth) = sizes[1], sizes[30]
    per_byte = (growth - small_growth) / (json_bytes - small_json)
    assert per_byte < 1.5, f"{growth / MiB:.0f} MiB for {json_bytes / MiB:.0f} MiB of JSON ({per_byte:.2f} per byte)"
    assert small_growth < 48 * MiB


def test_peak_memory_of_the_smallest_events_accepted(tmp_path):
    """Events just over the tiny-event cap, the most rows per byte: within 4x the JSON, plus 64 MiB."""
    event = b'{"ph":"i","ts":1,"name":"[memory]","pid":1,"tid":1,"cat":"cpu_instant_event","s":"t"},'
    assert MIN_AVERAGE_EVENT_BYTES < len(event) < MIN_AVERAGE_EVENT_BYTES + 8
    path = tmp_path / "small_events.json.gz"
    copies = 32 * MiB // len(event)
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + event * copies + b'{"ph": "M"}]}', compresslevel=1))
    rows, growth = _peak_growth(path)
    assert rows == copies + 1
    assert growth < 4 * copies * len(event) + 64 * MiB, f"{growth / MiB:.0f} MiB for 32 MiB of JSON"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("use_tqdm", [True, False])
def test_terminal_progress_draws_the_reader_progress_on_a_terminal(use_tqdm):
    screen = _Terminal()
    with TerminalProgress(screen, use_tqdm=use_tqdm) as progress:
        load_trace(RESNET, progress=progress)
    size = f"{RESNET.stat().st_size / MiB:.1f} MiB"
    assert f"reading the trace: {size} of {size}" in screen.getvalue()
    assert ("100%" in screen.getvalue()) and (("|" in screen.getvalue()) == use_tqdm)


def test_terminal_progress_is_silent_off_a_terminal():
    quiet = io.StringIO()
    with TerminalProgress(quiet) as progress:
        load_trace(RESNET, progress=progress)
    assert quiet.getvalue() == ""
