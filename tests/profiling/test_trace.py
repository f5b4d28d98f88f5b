"""The reader on real GPU traces, and on every kind of bad upload."""

import gzip
import json

import pytest

from profiling.tables import kernel_table
from profiling.trace import TraceError, load_trace, parse_trace
from tests.conftest import DATA, GPU_TRACES


def _raw(name):
    return json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))


@pytest.mark.parametrize("name", GPU_TRACES)
def test_kernel_table_counts_and_time_match_the_events(name):
    raw = [e for e in _raw(name)["traceEvents"] if e.get("ph") == "X"]
    trace = load_trace(DATA / f"{name}.json.gz")
    table = kernel_table(trace)
    for cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        events = [e for e in raw if e.get("cat") == cat]
        rows = table[table["kind"] == cat]
        assert rows["count"].sum() == len(events)
        assert rows["total (us)"].sum() == pytest.approx(sum(e["dur"] for e in events))


def test_a100_kernel_args_are_lifted():
    trace = load_trace(DATA / "a100_simple_add.json.gz")
    kernel = trace.kernels.dropna(subset=["registers"]).iloc[0]
    assert kernel["grid"] and kernel["block"] and kernel["occupancy"] >= 0
    assert trace.devices == ["NVIDIA A100-PG509-200"]
    assert trace.device_properties[0]["regsPerMultiprocessor"] == 65536


def test_no_kernels_trace_is_empty_but_keeps_its_schema():
    table = kernel_table(load_trace(DATA / "cupti_counters_no_kernels.json.gz"))
    assert table.empty and "registers/thread" in table.columns


def test_cpu_only_trace():
    trace = load_trace(DATA / "cpu_only.json.gz")
    assert trace.devices == ["cpu"] and trace.kernels.empty and len(trace.events) == 30


def test_bare_list_and_plain_json(tmp_path):
    events = _raw("triton_driver_launch")["traceEvents"]
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(events))
    assert len(load_trace(path).kernels) == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "is not valid JSON"),
        (b'{"foo": 1}', "has no `traceEvents`"),
        (b'{"traceEvents": {"a": 1}}', "`traceEvents` must be a list"),
        (b'"a string"', "must hold a JSON object or list"),
    ],
)
def test_bad_documents(data, message):
    with pytest.raises(TraceError, match=message):
        parse_trace(data)


def test_bad_events_are_skipped_and_counted():
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 2},  # wrong type
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": -1},  # negative duration
        {"ph": "X", "cat": "kernel", "ts": 5, "dur": 1},  # no name
        {"ph": "X", "cat": "kernel", "name": "k", "ts": True, "dur": 1},  # a bool is not a time
        42,
        ["not", "an", "event"],
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 3, "dur": 1, "args": "junk"},
    ]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    assert len(trace.events) == 2 and trace.skipped == 6
    assert trace.kernels["dur"].sum() == 3


def test_truncated_gzip(tmp_path):
    path = tmp_path / "cut.json.gz"
    path.write_bytes((DATA / "a100_simple_add.json.gz").read_bytes()[:5000])
    with pytest.raises(TraceError, match="truncated"):
        load_trace(path)


def test_corrupt_gzip(tmp_path):
    data = bytearray((DATA / "a100_simple_add.json.gz").read_bytes())
    data[100:200] = b"\x00" * 100
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="corrupt|truncated|not valid JSON"):
        load_trace(path)


def test_gzip_bomb_stops_at_the_limit(tmp_path):
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        event = b'{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1, "args": {"Bytes": 4}},'
        f.write(b'{"traceEvents": [' + event * (64 * 1024**2 // len(event)))  # 64 MiB, ~200 KiB on disk
    assert path.stat().st_size < 400_000
    with pytest.raises(TraceError, match=r"inflates to more than 8 MiB of JSON \(the limit\)"):
        load_trace(path, inflated_bytes=8 * 1024**2)


def test_file_over_the_size_limit(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 2048)
    with pytest.raises(TraceError, match=r"the file is 2,048 bytes; the limit is 1,024 bytes"):
        load_trace(path, upload_bytes=1024)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "nope.json")
