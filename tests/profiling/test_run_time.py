"""The run-time estimate: the calls it counts, the timing loops and compile time it adds, and the refusal it makes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attention import AttentionSpec
from profiling.run_time import BACKWARD_COST, FORWARDS, compile_s, estimate_run_time, refuse_if_too_long, timing_loop_s
from profiling.runner import ACTIVE, WAIT, WARMUP, WARMUP_CALLS, RunError
from profiling.timing import BUDGET_ENV, MAX_CALLS

SHAPE = dict(batch=1, heads=8, head_dim=64, device="cpu")
# How close the estimate comes to real runs depends on this machine's speed and load: bench/estimate.py
# measures it (on the machine's own peaks). The tests here check what the estimate counts and adds.


def test_the_estimate_counts_every_call_the_runner_makes(monkeypatch):
    monkeypatch.setenv(BUDGET_ENV, "0.5")
    inference = estimate_run_time(AttentionSpec(**SHAPE, variant="naive", seq_len=512))
    training = estimate_run_time(AttentionSpec(**SHAPE, variant="naive", seq_len=512, mode="training"))
    assert inference.calls == training.calls == FORWARDS == WARMUP_CALLS + WAIT + WARMUP + ACTIVE
    assert training.forward_s > 2 * inference.forward_s and training.reference_s > 2 * inference.reference_s
    # The timing loops: the forward's, and in training the backward's, each call after an untimed forward.
    forward = inference.forward_s
    assert inference.timing_s == pytest.approx(timing_loop_s(forward, 0.5))
    assert training.timing_s == pytest.approx(timing_loop_s(forward, 0.5) + timing_loop_s(training.forward_s, 0.5))
    assert training.forward_s == pytest.approx(forward * (1 + BACKWARD_COST))
    assert inference.seconds == pytest.approx(
        inference.setup_s + FORWARDS * forward + inference.timing_s + inference.reference_s
    )


@pytest.mark.parametrize(
    ("call_s", "budget_s", "calls"),
    [
        (1e-6, 0.5, MAX_CALLS),  # a call far under the budget: the loop ends at MAX_CALLS
        (2.0, 0.5, 1),  # a call over the budget: timed once
        (0.15, 0.5, 4),  # 0.45 s < 0.5 s: the fourth call crosses the budget
        (0.1, 0.5, 5),  # exactly spent after the fifth
    ],
)
def test_a_timing_loop_takes_the_budget_or_max_calls_whichever_is_less(call_s, budget_s, calls):
    assert timing_loop_s(call_s, budget_s) == pytest.approx(calls * call_s)


def test_the_estimate_grows_with_the_timing_budget(monkeypatch):
    spec = AttentionSpec(**SHAPE, variant="naive", seq_len=1024, mode="training")
    monkeypatch.setenv(BUDGET_ENV, "0.1")
    short = estimate_run_time(spec)
    monkeypatch.setenv(BUDGET_ENV, "2.0")
    long = estimate_run_time(spec)
    assert long.timing_s > short.timing_s and long.seconds - short.seconds == pytest.approx(
        long.timing_s - short.timing_s
    )
    assert long.timing_s <= 2 * (2.0 + long.forward_s)  # two loops, each the budget plus one crossing call


def test_the_zerogpu_duration_holds_the_timing_loops(monkeypatch):
    from endpoints import common as endpoints

    monkeypatch.setenv(BUDGET_ENV, "0.5")
    quick = endpoints.gpu_seconds(1)
    monkeypatch.setenv(BUDGET_ENV, "5")
    assert endpoints.gpu_seconds(1) - quick == 2 * (5 - 0.5)  # a forward and a backward loop per run
    assert endpoints.gpu_seconds(1000) == endpoints.RUN_TIME_LIMIT_S + endpoints.GPU_MARGIN_S  # the limit caps it


def test_a_run_over_the_limit_is_refused_with_its_estimate():
    spec = AttentionSpec(**SHAPE, variant="naive", seq_len=4096)
    estimate = estimate_run_time(spec)
    with pytest.raises(RunError, match=rf"^time limit: this run would take about {estimate.seconds:.0f} s"):
        refuse_if_too_long(spec, estimate.seconds / 2)
    refuse_if_too_long(spec, estimate.seconds * 2)  # within the limit: no error
    refuse_if_too_long(spec, None)


ROOT = Path(__file__).resolve().parents[2]
# A whole compiled run in a fresh process with an empty Inductor cache: what a run costs the first time
# the app compiles it, the cost the estimate takes. The estimate is made first, so its one-off measurement
# of the matmul rate is not counted in the run.
COMPILED_CHILD = """
import json, sys, tempfile, time
from attention import AttentionSpec
from profiling.pipeline import profile_attention
from profiling.run_time import estimate_run_time
from profiling.worker import Worker

spec = AttentionSpec(**json.loads(sys.argv[1]))
estimate = estimate_run_time(spec).seconds
with tempfile.TemporaryDirectory() as out:
    start = time.perf_counter()
    profile_attention(spec, out, worker=Worker(enabled=False))
    print(json.dumps({"wall": time.perf_counter() - start, "estimate": estimate}))
"""


def test_a_compiled_run_is_mostly_its_compile(tmp_path):
    """naive+compile at a size where compiling is nearly all of the run (~15-30 s here)."""
    fields = dict(SHAPE, variant="naive", seq_len=256, compile=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run(
        [sys.executable, "-c", COMPILED_CHILD, json.dumps(fields)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # How close the cold estimate comes is this machine's to say (bench/estimate.py); that compiling, not
    # the run, took the time is not: seconds of Inductor against a forward of milliseconds.
    eager = estimate_run_time(AttentionSpec(**{**fields, "compile": False})).seconds
    assert got["wall"] > eager * 3  # the compile, not the run, is what was measured


def test_compiling_costs_most_where_inductor_generates_the_most():
    """Inductor generates nothing around one fused SDPA call, kernels for every op around naive's matmuls."""
    base = dict(SHAPE, seq_len=256, compile=True)
    flash = compile_s(AttentionSpec(**base, variant="sdpa", backend="flash"))
    assert 0 < flash < compile_s(AttentionSpec(**base, variant="sdpa", backend="flash", mode="training"))
    assert flash < compile_s(AttentionSpec(**base, variant="sdpa", mask="padding", valid_len=9))
    assert flash < compile_s(AttentionSpec(**base, variant="naive")) < compile_s(AttentionSpec(**base, variant="flex"))
    assert compile_s(AttentionSpec(**{**base, "compile": False}, variant="naive")) == 0
