"""The run-time estimate against real runs: within 3x both ways, for every kind of forward it models."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention import AttentionSpec
from profiling.pipeline import profile_attention
from profiling.run_time import FORWARDS, compile_s, estimate_run_time, refuse_if_too_long
from profiling.runner import UNPROFILED_CALLS, RunError
from profiling.worker import Worker

SHAPE = dict(batch=1, heads=8, head_dim=64, device="cpu")
# Sizes where a run takes seconds here, so the estimate's fixed part does not dominate.
RUNS = {
    "naive": dict(variant="naive", seq_len=1536),
    "inplace": dict(variant="inplace", seq_len=1536),
    "math": dict(variant="sdpa", backend="math", seq_len=1536),
    "flash": dict(variant="sdpa", backend="flash", seq_len=2048),
    "flex": dict(variant="flex", seq_len=1024),
    "naive training": dict(variant="naive", seq_len=1024, mode="training"),
    "flash window": dict(variant="sdpa", seq_len=2048, mask="sliding_window", window=256),
    "flash decode": dict(variant="sdpa", backend="flash", seq_len=16384, q_len=1),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_the_estimate_is_within_3x_of_the_whole_run(name, tmp_path):
    spec = AttentionSpec(**SHAPE, **RUNS[name])
    estimate = estimate_run_time(spec).seconds
    start = time.perf_counter()
    profile_attention(spec, tmp_path, worker=Worker(enabled=False))  # in-process: no worker start counted
    wall = time.perf_counter() - start
    assert estimate / 3 < wall < estimate * 3, f"{name}: ran {wall:.2f} s, estimated {estimate:.2f} s"


def test_the_estimate_counts_every_call_the_runner_makes():
    inference = estimate_run_time(AttentionSpec(**SHAPE, variant="naive", seq_len=512))
    training = estimate_run_time(AttentionSpec(**SHAPE, variant="naive", seq_len=512, mode="training"))
    assert inference.calls == FORWARDS and training.calls == FORWARDS + UNPROFILED_CALLS
    assert training.forward_s > 2 * inference.forward_s and training.reference_s > 2 * inference.reference_s


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


def test_a_compiled_run_is_within_3x_of_its_cold_estimate(tmp_path):
    """naive+compile at a size where compiling is nearly all of the run (~15-30 s here)."""
    fields = dict(SHAPE, variant="naive", seq_len=256, compile=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run(
        [sys.executable, "-c", COMPILED_CHILD, json.dumps(fields)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["estimate"] / 3 < got["wall"] < got["estimate"] * 3, got
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
