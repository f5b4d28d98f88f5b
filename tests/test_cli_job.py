"""`python -m profiling job`: a generated 3-rank job with a straggler, printed within 120 columns and as
JSON; bad input exits 2 naming the field; names from a trace reach the terminal plain; and the job run on a
Dask scheduler and worker started here as a user would start them."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bench import make_ranks
from profiling.cli_views import WIDTH
from tests.conftest import ROOT
from tests.timing_slack import slack

SOURCE = ROOT.parent / "shared" / "traces" / "hta_ranks" / "sampled_rank-0.json.gz"
STRAGGLER = 1


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SOURCE.exists():
        pytest.skip(f"{SOURCE} (the shared HTA rank) is absent")
    out = tmp_path_factory.mktemp("cli_job")
    make_ranks.main([str(SOURCE), str(out), "--ranks", "3", "--straggler", str(STRAGGLER), "--factor", "1.5"])
    return out


def run_main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    from profiling.__main__ import main

    status = main(["job", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_text_fits_and_names_the_straggler(job_dir: Path, capsys: pytest.CaptureFixture) -> None:
    status, out, _ = run_main(capsys, str(job_dir))
    assert status == 0
    assert max(len(line) for line in out.splitlines()) <= WIDTH
    assert f"Rank {STRAGGLER} is a straggler" in out and "job: 3 rank traces (world size 3), on " in out


def test_json_keeps_every_table(job_dir: Path, capsys: pytest.CaptureFixture) -> None:
    status, out, _ = run_main(capsys, str(job_dir / "*.json.gz"), "--json")
    record = json.loads(out)
    assert status == 0 and record["missing_ranks"] == [] and len(record["per_step"]) == 6
    assert [f["evidence"]["rank"] for f in record["findings"] if "straggler" in f["title"]] == [STRAGGLER]
    assert [s["collectives"] for s in record["sync_wait"]] == [10, 10, 10]


@pytest.mark.parametrize(
    ("args", "field"),
    [(("/no/such/folder",), "traces"), (("{job}", "--scheduler", "localhost:1"), "scheduler")],
)
def test_bad_input_exits_2_naming_the_field(
    job_dir: Path, capsys: pytest.CaptureFixture, args: tuple[str, ...], field: str
) -> None:
    status, _, err = run_main(capsys, *(a.format(job=job_dir) for a in args))
    assert status == 2 and err.startswith(f"error: {field}:")


def test_names_from_a_trace_reach_the_terminal_plain(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if not SOURCE.exists():
        pytest.skip(f"{SOURCE} is absent")
    data = json.loads(gzip.decompress(SOURCE.read_bytes()))
    for event in data["traceEvents"]:
        if str(event.get("name", "")).startswith("ncclKernel"):
            event["name"] = "ncclKernel_\x1b]0;owned\x07\x1b[2J_AllReduce(x)"
    for rank in (0, 1):
        data["distributedInfo"] = {"rank": rank, "world_size": 2, "backend": "nccl"}
        (tmp_path / f"r{rank}.json").write_text(json.dumps(data))
    status, out, _ = run_main(capsys, str(tmp_path))
    assert status == 0 and "\x1b" not in out and "ncclKernel__AllReduce" in out


def wait_for(path: Path, seconds: float) -> None:
    """Until `path` exists (a process started elsewhere writes it); fails past `seconds`."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def start_dask(*args: str) -> subprocess.Popen:
    """`dask ARGS` from the repository, its output dropped; the worker imports profiling.job to run a rank."""
    dask = shutil.which("dask")
    if dask is None:
        pytest.skip("the `dask` command (dask[distributed]) is not installed")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([dask, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_job_on_a_running_dask_scheduler(job_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("dask.distributed")
    scheduler_file = tmp_path / "scheduler.json"
    local = ("--host", "127.0.0.1")
    started: list[subprocess.Popen] = []
    try:
        started.append(
            start_dask("scheduler", *local, "--port", "0", "--scheduler-file", str(scheduler_file), "--no-dashboard")
        )
        wait_for(scheduler_file, slack(60))
        started.append(
            start_dask("worker", "--scheduler-file", str(scheduler_file), *local, "--nworkers", "1", "--nthreads", "1")
        )
        address = json.loads(scheduler_file.read_text())["address"]
        status, out, _ = run_main(capsys, str(job_dir), "--json", "--scheduler", address)
        record = json.loads(out)
        assert status == 0 and record["engine"] == "dask"
        assert [f["evidence"]["rank"] for f in record["findings"] if "straggler" in f["title"]] == [STRAGGLER]
    finally:
        for process in reversed(started):  # the worker first; SIGTERM lets its nanny stop the worker process
            process.terminate()
            try:
                process.wait(timeout=slack(30))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_a_job_none_of_whose_traces_reads_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "rank0.json").write_text("not json")
    (tmp_path / "rank1.json").write_text('{"traceEvents": 5}')
    status, out, err = run_main(capsys, str(tmp_path))
    assert status == 2 and out == "" and "error: traces: none of the 2 traces could be read" in err
    assert "rank 0: TraceError" in err and "rank 1: TraceError" in err
