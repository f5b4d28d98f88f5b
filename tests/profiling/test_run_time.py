"""The run-time estimate against real runs: within 3x both ways, for every kind of forward it models."""

import time

import pytest

from attention import AttentionSpec
from profiling.pipeline import profile_attention
from profiling.run_time import FORWARDS, estimate_run_time, refuse_if_too_long
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
