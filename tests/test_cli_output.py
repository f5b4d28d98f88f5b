"""What the CLI prints (issue 20, CLI): torch's stderr noise in `<trace-dir>/profiler.log`, compare and sweep
tables within 120 columns, `--json` with every key, and the help's example, run as written. Real CLI runs in
subprocesses on tiny CPU shapes; numbers are checked against the `--json` samples by a plain computation."""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from attention import RUNS, run_label
from profiling.cli_tables import WIDTH, compare_lines
from profiling.summary import RunSummary
from profiling.sweep import POINT_KEYS, SPREAD_KEYS
from profiling.worker import Worker
from tests.conftest import ROOT
from tests.timing_slack import slack

NOISE = ("USDT", "CPUAllocator")  # what torch 2.x writes to stderr around every profiled run
LOG_LINE = re.compile(r"^profiler log: (.+)$", re.MULTILINE)
SWEEP_ARGS = ("--variants", "naive,inplace", "--seq-lens", "32,131072")  # 131072: over any budget, stops unrun
CELLS = re.compile(r"\s{2,}")  # the tables' column gap


def cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "profiling", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=slack(600),
    )


def assert_quiet(out: subprocess.CompletedProcess[str]) -> None:
    for stream in (out.stdout, out.stderr):
        assert not [line for line in stream.splitlines() if any(n in line for n in NOISE)], stream[-2000:]


def table_rows(stdout: str) -> list[list[str]]:
    """The cells of the table's rows: the lines after the header (`run  …`) up to the first blank line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run "))
    end = lines.index("", start)
    return [CELLS.split(line.strip()) for line in lines[start + 1 : end]]


def help_examples(*args: str) -> list[str]:
    out = cli(*args, "--help")
    assert out.returncode == 0, out.stderr
    return [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("python -m profiling ")]


# ---------------------------------------------------------------- the log


def test_the_help_example_runs_as_written_and_sends_torchs_noise_to_the_log(tmp_path):
    examples = help_examples("run")
    assert len(examples) == 1 and examples == help_examples()  # one example, the same in the top-level help
    argv = shlex.split(examples[0])
    assert argv[0] == "python"
    out = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=slack(600),
    )
    assert out.returncode == 0, out.stderr
    assert_quiet(out)
    assert out.stderr == ""  # piped: no progress bar, and the noise went to the log
    traces = list((tmp_path / "traces").glob("*.json"))
    assert len(traces) == 1 and f"trace: traces/{traces[0].name}" in out.stdout  # paths as the user gave them
    logs = LOG_LINE.findall(out.stdout)
    assert logs == ["traces/profiler.log"] and out.stdout.rstrip().endswith(logs[0])  # the last line
    noise = (tmp_path / logs[0]).read_text()
    assert noise.strip(), "the path is printed only for a log with content"
    assert not [line for line in noise.splitlines() if line in out.stdout]


def test_run_json_keeps_every_summary_key_and_names_the_log_on_stderr(tmp_path):
    out = cli("run", "--device", "cpu", "--seq-len", "16", "--trace-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    assert_quiet(out)
    summary = json.loads(out.stdout)  # stdout is the JSON alone
    assert set(RunSummary.__annotations__) <= set(summary)
    assert LOG_LINE.findall(out.stderr) == [str(tmp_path / "profiler.log")]
    assert (tmp_path / "profiler.log").stat().st_size > 0


def test_a_run_that_writes_no_log_prints_no_path_and_leaves_no_file(tmp_path):
    # In-process (the ZeroGPU mode), the worker's redirection does not apply: the log stays empty.
    out = cli(
        "run", "--device", "cpu", "--seq-len", "16", "--trace-dir", str(tmp_path),
        env={"ATTENTION_PROFILER_WORKER": "0"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "profiler log" not in out.stdout + out.stderr
    assert not (tmp_path / "profiler.log").exists() and len(list(tmp_path.glob("*.json"))) == 1


def write_to_stderr_then_fail(text: str) -> None:
    """Writes as C++ does (to file descriptor 2) and as Python does, then fails like a run."""
    os.write(2, f"{text} (fd 2)\n".encode())
    print(f"{text} (sys.stderr)", file=sys.stderr)
    raise ValueError("seq_len: the run failed")


def write_to_stderr(text: str) -> int:
    os.write(2, f"{text}\n".encode())
    return 7


def test_the_worker_logs_its_stderr_and_still_returns_the_error(tmp_path, capfd):
    log = tmp_path / "profiler.log"
    worker = Worker(enabled=True)
    try:
        with worker.stderr_to(log):
            with pytest.raises(ValueError, match="seq_len: the run failed"):  # the error is not lost
                worker.call(write_to_stderr_then_fail, "first")
            assert worker.call(write_to_stderr, "second") == 7
        assert worker.call(write_to_stderr, "after the block") == 7
    finally:
        worker.close()
    assert log.read_text().splitlines() == ["first (fd 2)", "first (sys.stderr)", "second"]
    assert "first" not in capfd.readouterr().err


def test_in_process_calls_leave_stderr_alone(tmp_path, capfd):
    log = tmp_path / "profiler.log"
    here = Worker(enabled=False)
    with here.stderr_to(log):
        assert here.call(write_to_stderr, "here") == 7
    assert not log.exists() and "here" in capfd.readouterr().err


# ---------------------------------------------------------------- compare


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    where = tmp_path_factory.mktemp("compare")
    text = cli("compare", "--device", "cpu", "--seq-len", "32", "--trace-dir", str(where / "text"))
    as_json = cli("compare", "--device", "cpu", "--seq-len", "32", "--trace-dir", str(where / "json"), "--json")
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    return text, as_json


def test_compare_prints_one_line_per_run_within_120_columns(compared):
    text, _ = compared
    assert_quiet(text)
    assert max(len(line) for line in text.stdout.splitlines()) <= WIDTH
    rows = table_rows(text.stdout)
    assert [r[0] for r in rows] == [run_label(v, b) for v, b in RUNS]
    unrun = [r[0] for r in rows if r[-1] == "not run"]
    listed = text.stdout.split("\nnot run:\n")[1]
    assert unrun and all(f"  {label}: " in listed for label in unrun)  # each says why, in full, below
    assert LOG_LINE.findall(text.stdout)


def test_compare_json_keeps_every_summary_key(compared):
    _, as_json = compared
    assert_quiet(as_json)
    rows = json.loads(as_json.stdout)
    assert len(rows) == len(RUNS)
    ran = [r for r in rows if "error" not in r]
    keys = set(RunSummary.__annotations__) | {"speedup", "speedup_ci", "speedup_status"}
    assert ran and all(keys <= set(r) for r in ran)


def test_compare_table_cells_match_a_plain_computation_on_the_json(compared):
    rows = json.loads(compared[1].stdout)
    lines = compare_lines(rows)
    assert max(len(line) for line in lines) <= WIDTH
    cells = {r[0]: r for r in table_rows("\n".join(lines))}
    header = CELLS.split(lines[0])
    for row in (r for r in rows if "error" not in r):
        samples = row["forward_ms_stats"]["samples"]
        median = statistics.median(samples)
        # numpy's linear percentiles; one sample (a slow run under a short budget) is its own quartiles
        p25, _, p75 = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else samples * 3
        assert max(median, p75) < 1000  # below the thousands separator: `.3g` is the whole format
        shown = dict(zip(header, cells[run_label(row["variant"], row["backend"])], strict=True))
        assert shown["fwd ms"] == f"{median:.3g}"
        assert shown["IQR ms"] == f"{p25:.3g}–{p75:.3g}"
        assert float(shown["kern/fwd"]) == row["kernels_per_forward"]
    naive, inplace = (dict(zip(header, cells[name], strict=True)) for name in ("naive", "inplace"))
    assert (naive["kern/fwd"], inplace["kern/fwd"]) == ("6", "5")  # the blog's hidden copy, gone in place


def test_compare_table_fits_a_gpus_extra_column_and_the_longest_labels(compared):
    # No GPU here: the CPU rows get what a CUDA run adds (the profiler's device time, the backend sdpa-auto
    # chose) and --compile's longer labels; the run names give way, the numbers stay whole.
    rows = json.loads(compared[1].stdout)
    for row in (r for r in rows if "error" not in r):
        row.update(compile=True, forward_device_ms=12345.678)
        row["backend_used"] = "efficient" if row["variant"] == "sdpa" else None
    lines = compare_lines(rows)
    assert max(len(line) for line in lines) <= WIDTH
    header = CELLS.split(lines[0])
    shown = [dict(zip(header, cells, strict=True)) for cells in table_rows("\n".join(lines))]
    assert [s["device ms"] for s in shown] == ["-" if "error" in r else "12,346" for r in rows]
    assert shown[2]["run"].startswith("sdpa-math+compile")  # "(efficient)" may be cut to fit, the name is not


# ---------------------------------------------------------------- sweep


def test_sweep_prints_one_line_per_point_within_120_columns(tmp_path):
    out = cli("sweep", "--device", "cpu", *SWEEP_ARGS, "--trace-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert_quiet(out)
    assert max(len(line) for line in out.stdout.splitlines()) <= WIDTH
    rows = table_rows(out.stdout)
    assert [(r[0], r[1]) for r in rows] == [(v, s) for v in ("naive", "inplace") for s in ("32", "131072")]
    assert [r[-1].split(",")[0] for r in rows] == ["ok", "stopped", "ok", "stopped"]
    stopped = out.stdout.split("\nstopped:\n")[1]
    assert "  naive at seq_len 131072: needs about" in stopped and "  inplace at seq_len 131072: " in stopped


def test_sweep_json_keeps_every_key_of_every_point(tmp_path):
    out = cli("sweep", "--device", "cpu", *SWEEP_ARGS, "--trace-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    assert_quiet(out)
    points = json.loads(out.stdout)
    keys = {"run", "seq_len", "status", "reason", "q_len", *POINT_KEYS, *SPREAD_KEYS}
    assert [set(p) for p in points] == [keys] * 4
    assert [(p["run"], p["seq_len"], p["status"]) for p in points] == [
        (v, s, status) for v in ("naive", "inplace") for s, status in ((32, "ok"), (131072, "stopped"))
    ]
