"""`python -m profiling analyze` on a trace whose names carry terminal escapes: none reaches the terminal."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

TITLE, CLEAR, RED = "\x1b]0;pwned\x07", "\x1b[2J", "\x9b31m"  # retitle, clear the screen, recolour (8-bit CSI)
OP = f"aten::mm{TITLE}"
KERNEL = f"{CLEAR}ampere_sgemm_128x64_tn{RED}\x7f\x00\x85"
# An op that launches the kernel and calls an aten::clone, so both names reach the printed insights
# ("Hidden copy ... called by <op>", "FP32 math ... (<kernel>)") and the kernel table.
EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": OP, "pid": 1, "tid": 1, "ts": 10, "dur": 50},
    {
        "ph": "X", "cat": "cpu_op", "name": "aten::clone", "pid": 1, "tid": 1, "ts": 12, "dur": 5,
        "args": {"Input Dims": [[4, 4]], "Input type": ["float"]},
    },
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 20, "dur": 5,
     "args": {"correlation": 7}},
    {"ph": "X", "cat": "kernel", "name": KERNEL, "pid": 0, "tid": 7, "ts": 30, "dur": 40,
     "args": {"correlation": 7, "stream": 7, "device": 0}},
]  # fmt: skip
# Written by hand, not with the code under test: what must be left of each name once stripped.
SHOWN_OP, SHOWN_KERNEL = "aten::mm", "ampere_sgemm_128x64_tn"


@pytest.fixture(scope="module")
def hostile_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli_names") / "hostile.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": EVENTS}).encode()))
    return path


def _analyze(path: Path, *flags: str) -> subprocess.CompletedProcess[bytes]:
    # Bytes, not text: what a terminal would receive.
    return subprocess.run(
        [sys.executable, "-m", "profiling", "analyze", str(path), *flags],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
        check=False,
    )


def _controls(data: bytes) -> list[str]:
    """Every C0 control but newline, DEL and C1 control in `data` read as UTF-8."""
    text = data.decode("utf-8")
    return sorted({repr(c) for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0})


@pytest.mark.parametrize("flags", [(), ("--json",)], ids=["plain", "json"])
def test_names_reach_the_output_without_their_escapes(hostile_trace, flags):
    done = _analyze(hostile_trace, *flags)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert b"\x1b" not in done.stdout and b"\x07" not in done.stdout
    assert _controls(done.stdout) == [] and _controls(done.stderr) == []
    text = done.stdout.decode()
    assert "pwned" not in text  # the whole title sequence went, not only its ESC and BEL
    assert SHOWN_KERNEL in text and f"by {SHOWN_OP} " in text  # the names are still shown, stripped
    if flags:  # and JSON's own escapes do not smuggle them back: the decoded values are plain too
        decoded = json.dumps(json.loads(done.stdout), ensure_ascii=False).encode()
        assert b"\x1b" not in decoded and _controls(decoded.replace(b"\\n", b"")) == []


def test_an_error_naming_the_file_is_stripped_too(tmp_path):
    # A downloaded trace's file name is data too, and the error message quotes it.
    bad = tmp_path / f"t{TITLE}{RED}.json"
    bad.write_text('{"a": tru}')
    done = _analyze(bad)
    assert done.returncode == 2 and done.stderr.startswith(b"error: trace: t.json is not valid JSON")
    assert b"\x1b" not in done.stderr and _controls(done.stderr) == []
