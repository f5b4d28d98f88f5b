"""Time and memory bounds through the real client: every stage of a run within its limit, a client
that leaves stops its run, and /analyze under its own time limit and memory admission."""

import os
import signal
import subprocess
import sys
import time

import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

import endpoints
import profiling.run_time
import profiling.uploads
from profiling.admission import AnalysisGate
from profiling.worker import default_worker
from tests.conftest import DATA, ROOT
from tests.timing_slack import slack

# A naive float32 run at 1x16x2048x64: each forward takes ~0.3 s here and the float64 reference
# several seconds, so a 2 s limit lands inside warm-up, profiling, timing or the reference.
LONG = dict(variant="naive", backend="auto", batch=1, heads=16, seq_len=2048, head_dim=64)
SHAPE = dict(dtype="float32", device="cpu", compile=False)
# The documented margin past the limit: the worker's poll, SIGTERM's grace, the reply, the analysis
# of a trace cut short (none), all on a loaded 2-core machine; TIMING_SLACK widens it further.
MARGIN_S = slack(1.5)


def test_a_run_that_cannot_finish_in_time_is_refused_at_once_with_the_estimate(client, monkeypatch):
    monkeypatch.setattr(endpoints.common, "RUN_TIME_LIMIT_S", 2.0)
    start = time.monotonic()
    with pytest.raises(AppError, match=r"^time limit: this run would take about \d+ s \(\d+ forwards of ~"):
        client.predict(**LONG, **SHAPE, api_name="/profile")
    assert time.monotonic() - start < slack(2.0)


def test_a_run_is_stopped_at_its_time_limit_in_any_stage(client, monkeypatch):
    # The limit counts from a ready worker: the app starts one at launch; here the first run does.
    client.predict(**{**LONG, "seq_len": 32}, **SHAPE, api_name="/profile")
    # An estimate 100x too hopeful lets the run start: the worker's kill must hold the limit alone.
    monkeypatch.setitem(profiling.run_time.MATMUL_SHARE, "naive", 25.0)
    monkeypatch.setattr(profiling.run_time, "REFERENCE_SHARE", 30.0)
    monkeypatch.setattr(profiling.run_time, "FIXED_S", 0.0)
    monkeypatch.setattr(profiling.run_time, "timing_budget_s", lambda: 1e-6)  # the timing loop: one call
    for limit in (0.5, 2.0, 4.0):
        monkeypatch.setattr(endpoints.common, "RUN_TIME_LIMIT_S", limit)
        start = time.monotonic()
        with pytest.raises(AppError, match=rf"^time limit: the run passed {limit:g} s during "):
            client.predict(**LONG, **SHAPE, api_name="/profile")
        assert time.monotonic() - start < limit + MARGIN_S + slack(1.0)  # + the client's own round trip
    monkeypatch.undo()
    summary, *_ = client.predict(**{**LONG, "seq_len": 32}, **SHAPE, api_name="/profile")
    assert summary["kernels_per_forward"] == 6  # the next run gets a fresh worker, and the same lesson


def test_compare_holds_one_limit_for_all_its_runs(client, monkeypatch):
    monkeypatch.setattr(endpoints.common, "RUN_TIME_LIMIT_S", 2.0)
    for kind in profiling.run_time.MATMUL_SHARE:  # too hopeful: every run starts, and the limit must hold
        monkeypatch.setitem(profiling.run_time.MATMUL_SHARE, kind, 100.0)
    start = time.monotonic()
    rows, *_ = client.predict(*(1, 16, 2048, 64), *SHAPE.values(), api_name="/compare")
    assert time.monotonic() - start < 2.0 + MARGIN_S + slack(5.0)  # + analysing and drawing the runs that finished
    assert any("time limit" in row.get("error", "") for row in rows)


_LEAVER = """
import sys
from gradio_client import Client
client = Client(sys.argv[1], verbose=False)
job = client.submit("naive", "auto", 1, 16, 4096, 64, "float32", "cpu", False, api_name="/profile")
print("submitted", flush=True)
job.result()
"""


def _worker_pid_within(seconds: float) -> int | None:
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        if default_worker().pid is not None and default_worker()._lock.locked():
            return default_worker().pid
        time.sleep(0.05)
    return None


def test_a_client_that_leaves_stops_its_run(app_url, client):
    # A long run (~a minute here) from a client in another process, which is then killed.
    leaver = subprocess.Popen([sys.executable, "-c", _LEAVER, app_url], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert leaver.stdout.readline().strip() == "submitted"
        busy = _worker_pid_within(slack(60))
        assert busy is not None, "the run never started"
        time.sleep(1.0)  # well inside warm-up
    finally:
        leaver.send_signal(signal.SIGKILL)
        leaver.wait()
    start = time.monotonic()
    while time.monotonic() - start < slack(15):
        try:
            os.kill(busy, 0)
        except ProcessLookupError:
            break  # the run's worker process was killed
        time.sleep(0.1)
    else:
        pytest.fail("the run went on after its client left")
    summary, *_ = client.predict(**{**LONG, "seq_len": 32}, **SHAPE, api_name="/profile")
    assert summary["kernels_per_forward"] == 6


def test_analyze_has_a_time_limit(client, monkeypatch):
    monkeypatch.setenv(profiling.uploads.TIME_LIMIT_ENV, "0.000001")
    with pytest.raises(AppError, match=r"^trace: the analysis passed its 1e-06 s limit while "):
        client.predict(handle_file(str(DATA / "sampled_training_rank0.json.gz")), api_name="/analyze")


def test_analyze_refuses_what_its_memory_budget_cannot_hold(client, monkeypatch):
    monkeypatch.setattr(profiling.uploads, "analysis_gate", lambda: AnalysisGate(32 * 1024**2))
    refused = r"^trace: analysing .* of JSON in [\d,]+ objects needs about .* this server allows 32 MiB"
    with pytest.raises(AppError, match=refused):
        client.predict(handle_file(str(DATA / "sampled_training_rank0.json.gz")), api_name="/analyze")


def test_a_second_analysis_waits_for_the_first_ones_memory(client, monkeypatch):
    """Two analyses that fit the budget one at a time, not together: the second waits, then runs."""
    from profiling.admission import analysis_cost

    need = analysis_cost(DATA / "sampled_training_rank0.json.gz").peak_bytes
    gate = AnalysisGate(int(need * 1.5))
    monkeypatch.setattr(profiling.uploads, "analysis_gate", lambda: gate)
    held = gate.admit(need, what="a trace already being analysed")
    held.__enter__()
    job = client.submit(handle_file(str(DATA / "sampled_training_rank0.json.gz")), api_name="/analyze")
    time.sleep(2.0)
    assert not job.done()  # waiting for memory
    held.__exit__(None, None, None)
    summary, *_ = job.result(timeout=slack(120))
    assert summary["kernel_events"] > 0 and gate.in_use_bytes == 0
