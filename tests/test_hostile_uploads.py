"""Hostile uploads through the real app and the CLI: a clear `trace:` error each, and the server keeps serving."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiling.reader import MAX_DEPTH, MAX_EVENT_BYTES, MIN_AVERAGE_EVENT_BYTES, TraceError
from profiling.trace import load_trace
from tests.conftest import DATA, ROOT
from tests.test_fuzz import documents
from tests.timing_slack import slack


def _analyze(client, path: Path) -> tuple:
    return client.predict(handle_file(str(path)), api_name="/analyze")


def _gzip(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data, compresslevel=6, mtime=0))
    return path


@pytest.fixture
def keeps_serving(client):
    """After each hostile upload, a real trace still analyses, exactly."""
    yield
    raw = json.loads(gzip.decompress((DATA / "cpu_only.json.gz").read_bytes()))["traceEvents"]
    summary, *_ = _analyze(client, DATA / "cpu_only.json.gz")
    assert summary["events"] == len(raw)


def _nested(levels: int, kind: str, where: str) -> bytes:
    opener, closer = (b'{"a":', b"}") if kind == "objects" else (b"[", b"]")
    inner = opener * levels + b"1" + closer * levels
    if where == "top level":
        return inner
    return b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 1, "args": {"a": ' + inner + b"}}]}"


@pytest.mark.parametrize("levels", [10**5, 10**6])
@pytest.mark.parametrize("kind", ["objects", "lists"])
@pytest.mark.parametrize("where", ["args", "top level"])
def test_deep_nesting_is_refused_by_the_app(client, keeps_serving, tmp_path, levels, kind, where):
    upload = _gzip(tmp_path / "deep.json.gz", _nested(levels, kind, where))
    with pytest.raises(AppError, match=rf"^trace: nested deeper than {MAX_DEPTH} levels; not a torch.profiler trace$"):
        _analyze(client, upload)


def test_tiny_object_bomb_is_refused_at_once(client, keeps_serving, tmp_path):
    # The case: ~400 kB of gzip inflating to 399 MiB of `{},`, 140 million dicts if parsed.
    member = gzip.compress(b"{}," * 2**20, compresslevel=9, mtime=0)
    upload = tmp_path / "tiny.json.gz"
    upload.write_bytes(gzip.compress(b"[", mtime=0) + member * 133 + gzip.compress(b"{}]", mtime=0))
    assert upload.stat().st_size < 500_000
    # Memory admission counts its objects before any is parsed, and refuses it at once.
    objects = 2**20 * 133 + 1
    with pytest.raises(AppError, match=rf"^trace: analysing 399 MiB of JSON in {objects:,} objects needs about"):
        _analyze(client, upload)
    # Past admission (a machine with memory to spare), the reader's tiny-event rule refuses it.
    tiny = rf"average 3 bytes; torch.profiler events take over {MIN_AVERAGE_EVENT_BYTES}"
    with pytest.raises(TraceError, match=tiny):
        load_trace(upload)


def test_blank_bomb_is_refused_early(client, keeps_serving, tmp_path):
    member = gzip.compress(b" " * 64 * 2**20, compresslevel=9, mtime=0)  # 64 MiB of blanks, ~65 kB
    upload = tmp_path / "blank.json.gz"
    upload.write_bytes(member * 80)  # 5 GiB inflated, 5 MB uploaded
    with pytest.raises(AppError, match="starts with more than 64 MiB of blanks"):
        _analyze(client, upload)


def test_an_event_over_the_size_cap_is_refused(client, keeps_serving, tmp_path):
    name = b"n" * (MAX_EVENT_BYTES + 1)
    event = b'{"ph": "X", "cat": "kernel", "name": "' + name + b'", "ts": 1, "dur": 1}'
    upload = _gzip(tmp_path / "big_event.json.gz", b'{"traceEvents": [' + event + b"]}")
    with pytest.raises(AppError, match=r"^trace: event 0 is larger than 4 MiB \(the cap per event\)"):
        _analyze(client, upload)


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        (b'[{"id": "x", "name": "GPU"}]', r"`deviceProperties\[0\].id` must be a whole number, got 'x'"),
        (b'[{"id": 0}, [1, 2]]', r"`deviceProperties\[1\]` must be an object, got list"),
        (b'{"id": 0}', r"`deviceProperties` must be a list of objects, got dict"),
    ],
)
def test_bad_device_properties_name_the_field(client, keeps_serving, tmp_path, properties, message):
    upload = tmp_path / "devices.json"
    upload.write_bytes(b'{"deviceProperties": ' + properties + b', "traceEvents": []}')
    with pytest.raises(AppError, match=f"^trace: {message}"):
        _analyze(client, upload)


def test_cli_refuses_dev_zero_with_exit_2():
    done = subprocess.run(
        [sys.executable, "-m", "profiling", "analyze", "/dev/zero"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=slack(120),
        check=False,
    )
    assert done.returncode == 2
    assert "trace: not valid JSON: it starts with b'\\x00" in done.stderr


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_fuzzed_sample_through_the_app(client, tmp_path, data):
    """The in-process fuzzer's traces, a few through the server: a result or a `trace:` error, and it keeps serving."""
    document, _ = data.draw(documents())
    upload = _gzip(tmp_path / "fuzzed.json.gz", json.dumps(document).encode())
    try:
        summary, *_ = _analyze(client, upload)
    except AppError as exc:
        assert str(exc).startswith("trace: ")
    else:
        assert summary["events"] >= 0
    summary, *_ = _analyze(client, DATA / "cpu_only.json.gz")
    assert summary["events"] == 30
