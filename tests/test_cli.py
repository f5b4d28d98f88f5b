"""The CLI, run as a user would run it, in a subprocess."""

import gzip
import json
import subprocess
import sys
import tempfile

import pytest

from profiling.records import KERNEL_FIELDS, OP_FIELDS
from tests.conftest import DATA, ROOT


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "profiling", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_run_writes_a_trace_and_a_table_and_prints_the_summary(tmp_path):
    out = cli(
        "run",
        "--variant",
        "naive",
        "--device",
        "cpu",
        "--batch",
        "1",
        "--heads",
        "4",
        "--seq-len",
        "256",
        "--head-dim",
        "64",
        "--dtype",
        "float32",
        "--trace-dir",
        str(tmp_path),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["kernels_per_forward"] == 6 and summary["variant"] == "naive"
    traces, tables = list(tmp_path.glob("*.json")), list(tmp_path.glob("*.txt"))
    assert len(traces) == 1 and len(tables) == 1 and traces[0].stem == tables[0].stem
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("name") == "attn_fwd" and e.get("cat") == "user_annotation") == 3


def test_bad_flag_value_names_the_field():
    out = cli("run", "--seq-len", "0", "--device", "cpu")
    assert out.returncode == 2 and "seq_len: must be from 1" in out.stderr and "Traceback" not in out.stderr


def test_analyze_a_gpu_trace():
    out = cli("analyze", str(DATA / "a100_simple_add.json.gz"), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kernel_events"] == 79


def test_analyze_json_carries_kernels_and_ops_checked_by_a_plain_loop():
    trace = DATA / "a100_simple_add.json.gz"
    out = cli("analyze", str(trace), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))
    json.dumps(report, allow_nan=False)
    expected: dict[str, list[float]] = {}  # the plain loop: every complete GPU event, by name (its first 4,000 chars:
    # the reader cuts names at MAX_NAME_CHARS, and one of this trace's names is longer)
    with gzip.open(trace) as f:
        events = json.load(f)["traceEvents"]
    for e in events:
        if e.get("ph") == "X" and e.get("cat", "").lower() in ("kernel", "gpu_memcpy", "gpu_memset"):
            expected.setdefault(e["name"][:4000], []).append(e["dur"])
    kernels = {k["name"][:4000]: k for k in report["kernels"]}
    assert kernels.keys() == expected.keys()
    for name, durs in expected.items():
        assert kernels[name]["count"] == len(durs)
        assert kernels[name]["total_us"] == pytest.approx(sum(durs))
        assert kernels[name]["max_us"] == max(durs) and kernels[name]["min_us"] == min(durs)
    assert set(report["kernels"][0]) == set(KERNEL_FIELDS) and set(report["ops"][0]) == set(OP_FIELDS)
    assert [k["total_us"] for k in report["kernels"]] == sorted(
        (k["total_us"] for k in report["kernels"]), reverse=True
    )
    assert {o["kind"] for o in report["ops"]} <= {"op", "annotation"} and report["findings"] is not None


def test_analyze_prints_the_top_kernels_then_every_finding():
    trace = str(DATA / "gpu" / "h100_bert-small_sdpa-flash.json.gz")
    findings = json.loads(cli("analyze", trace, "--json").stdout)["findings"]
    out = cli("analyze", trace, "--top", "3")
    assert out.returncode == 0, out.stderr
    table, listed = out.stdout.split("findings")
    assert [line.split()[0] for line in table.strip().splitlines()[-3:]] == ["0", "1", "2"]
    assert listed.startswith(f" ({len(findings)}):") and len(findings) > 0
    for finding in findings:
        assert f"  - {finding['title']}" in listed


def test_analyze_top_must_be_a_whole_number():
    out = cli("analyze", str(DATA / "a100_simple_add.json.gz"), "--top", "-1")
    assert out.returncode == 2 and "top: give a whole number" in out.stderr and "Traceback" not in out.stderr


def test_analyze_a_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    out = cli("analyze", str(bad))
    assert out.returncode == 2 and "not valid JSON" in out.stderr


def test_sweep_and_compare_print_tables(tmp_path):
    out = cli(
        "sweep",
        "--device",
        "cpu",
        "--variants",
        "inplace,sdpa-flash",
        "--seq-lens",
        "32,64",
        "--json",
        "--trace-dir",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert [r["seq_len"] for r in json.loads(out.stdout)] == [32, 64, 32, 64]
    out = cli("compare", "--device", "cpu", "--seq-len", "32", "--trace-dir", str(tmp_path))
    assert out.returncode == 0 and "sdpa-cudnn" in out.stdout and "naive" in out.stdout


def test_progress_is_drawn_on_a_terminal_and_silent_off_one():
    import os
    import pty

    trace = str(DATA / "sampled_training_rank0.json.gz")
    quiet = cli("analyze", trace, "--json")
    assert quiet.returncode == 0 and quiet.stderr == ""  # piped: nothing but the result
    leader, follower = pty.openpty()
    # stdout to a file, not a pipe: the JSON passes a pipe's 64 KiB, and a child blocked on a full pipe would
    # never close the terminal this loop reads to its end.
    with tempfile.TemporaryFile() as out:
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "profiling", "analyze", trace, "--json"],
                cwd=ROOT, stdout=out, stderr=follower,
            )  # fmt: skip
            os.close(follower)  # the child holds it now: its exit closes the terminal
            drawn = b""
            while chunk := _read_or_none(leader):  # read as it is drawn: a full terminal would block the child
                drawn += chunk
            child.wait(timeout=300)
        finally:
            os.close(leader)
        out.seek(0)
        done = subprocess.CompletedProcess(child.args, child.returncode, out.read())
    assert done.returncode == 0 and json.loads(done.stdout) == json.loads(quiet.stdout)
    assert b"reading the trace" in drawn and b"finding insights" in drawn  # the reader's bytes, then the stages


def _read_or_none(fd):
    import os

    try:
        return os.read(fd, 65536)
    except OSError:  # the terminal closed
        return None
