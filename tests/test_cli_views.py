"""`python -m profiling view` on real traces read again with plain loops: run as a user would (a subprocess,
once with gradio and plotly unimportable), and, to spare a process start per case, through `main` itself."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, ROOT
from tests.timing_slack import slack

CPU_MEMORY = DATA / "cpu_memory" / "mlp_cpu_memory.json.gz"
CPU_MODULES = DATA / "cpu_modules" / "seq_linear_with_stack.json.gz"
MHA = DATA / "gpu" / "h100_nn-mha_fp32.json.gz"
VIEW_NAMES = ("memory", "memory events", "modules", "ops by input shape", "ops by call stack", "kernels by launch")


def cli(*args: str, blocked: bool = False) -> subprocess.CompletedProcess:
    """The CLI in a fresh process; `blocked`: with gradio and plotly made unimportable."""
    if blocked:
        code = (
            "import sys; sys.modules['gradio'] = None; sys.modules['plotly'] = None; "
            f"from profiling.__main__ import main; sys.exit(main({list(args)!r}))"
        )
        command = [sys.executable, "-c", code]
    else:
        command = [sys.executable, "-m", "profiling", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=slack(120))


def run_main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """The CLI's `main` in this process: its exit status, stdout and stderr."""
    from profiling.__main__ import main

    try:
        status = main(list(args))
    except SystemExit as exc:  # argparse's own refusals
        status = exc.code
    out = capsys.readouterr()
    return status, out.out, out.err


def raw(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def test_json_modules_match_the_raw_events():
    out = cli("view", str(MHA), "--view", "modules", "--json", blocked=True)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    modules = [e for e in raw(MHA) if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")]
    assert sum(row["calls"] for row in found["table"]) == len(modules) == 33
    assert found["view"] == "modules" and found["rows"] == found["shown"] == 11


def test_json_memory_peak_is_the_raw_peak():
    out = cli("view", str(CPU_MEMORY), "--view", "memory", "--json", "--top", "3")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    peak = max(e["args"]["Total Allocated"] for e in raw(CPU_MEMORY) if e.get("name") == "[memory]")
    assert found["chart"]["peaks"] == [
        {
            "device": "CPU",
            "peak allocated (B)": peak,
            "peak time (ms)": pytest.approx(201.752, abs=1e-3),
            "peak reserved (B)": 0,
        }
    ]
    assert len(found["table"]) == 3 and found["rows"] > 3


@pytest.mark.parametrize("name", VIEW_NAMES)
def test_text_fits_in_120_columns(capsys, name):
    status, out, err = run_main(capsys, "view", str(MHA), "--view", name, "--top", "50")
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) > 3 and all(len(line) <= 120 for line in lines), max(lines, key=len)


def test_text_rows_follow_top_and_counts_are_plain(capsys):
    lines = run_main(capsys, "view", str(MHA), "--view", "kernels by launch", "--top", "3")[1].splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("kernel "))
    assert len(lines) - header - 1 == 3
    assert "The first 3 of 13 kernel groups are shown" in " ".join(lines)
    everything = json.loads(run_main(capsys, "view", str(MHA), "--view", "kernels by launch", "--json")[1])
    assert sum(row["calls"] for row in everything["table"]) == sum(1 for e in raw(MHA) if e.get("cat") == "kernel")


def test_a_trace_without_memory_says_why(capsys):
    status, out, err = run_main(capsys, "view", str(CPU_MODULES), "--view", "memory")
    assert status == 0, err
    assert "profile_memory=True" in out and "(no rows)" in out


def test_bad_input_names_the_field(capsys, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    out = cli("view", str(broken))  # as a user sees it: a message, no traceback
    assert out.returncode == 2 and out.stderr.startswith("error: trace:") and "Traceback" not in out.stderr
    status, _, err = run_main(capsys, "view", str(MHA), "--view", "flame graph")
    assert status == 2 and "--view" in err
    status, _, err = run_main(capsys, "view", str(tmp_path))
    assert status == 2 and err.startswith("error: trace:")
    status, _, err = run_main(capsys, "view", str(MHA), "--top", "-1")
    assert status == 2 and "top:" in err


def test_names_from_a_trace_cannot_drive_the_terminal(capsys, tmp_path):
    hostile = "aten::\x1b]0;owned\x07mm\x1b[2J"
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": hostile,
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 5,
            "args": {"Input Dims": [[2]]},
        }
    ]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"traceEvents": events}))
    for name in ("ops by input shape", "tensor cores"):
        status, out, err = run_main(capsys, "view", str(path), "--view", name)
        assert status == 0, err
        assert "\x1b" not in out and "\x07" not in out and "aten::" in out
