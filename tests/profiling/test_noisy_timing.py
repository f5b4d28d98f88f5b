"""`noisy_timing`: fires on a spread too wide to compare, or on a CPU forward timed slower without the profiler
than with it; silent on steady timings, on GPU runs' device time, and on uploads (which carry no timing)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator

import pytest

from attention import AttentionSpec
from profiling.analysis import analyze
from profiling.insights import Evidence
from profiling.insights.timing import noisy_timing
from profiling.pipeline import RunResult, profile_attention
from profiling.timing import NOISY_CV, TimingStats, stats_of
from profiling.trace import load_trace, parse_trace
from profiling.windows import FORWARD, window_stats
from profiling.worker import Worker
from tests import reference
from tests.conftest import DATA

NOISY = [1.0, 1.1, 0.9, 3.0, 1.0, 2.5, 1.2, 0.95]  # cv ~ 0.5: a busy machine
STEADY = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0]  # cv ~ 0.013


def plain_cv(samples: list[float]) -> float:
    return statistics.stdev(samples) / statistics.fmean(samples)


# ---- synthetic evidence ---------------------------------------------------------------------------------------------


def evidence(numbers: dict, device: str | None = "cpu") -> Evidence:
    """One 1 ms forward window holding one op, with our run's `numbers` (no spec: an upload)."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": FORWARD, "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::bmm", "pid": 1, "tid": 1, "ts": 10, "dur": 900},
    ]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    spec = AttentionSpec(batch=1, heads=2, seq_len=8, head_dim=4, device=device) if device else None
    return Evidence(trace, window_stats(trace, FORWARD, device), trace.kernels, spec, numbers)


def timed(forward: list[float], backward: list[float] | None = None, profiled_ms: float = 10.0) -> dict:
    """A run summary's timing keys, the forward profiled at `profiled_ms`."""
    return {
        "forward_ms_stats": stats_of(forward).as_dict(),
        "forward_unprofiled_ms": statistics.median(forward),
        "backward_ms_stats": stats_of(backward).as_dict() if backward else None,
        "forward_cpu_ms": profiled_ms,
    }


def test_a_noisy_forward_fires_with_its_figures():
    found = noisy_timing(evidence(timed(NOISY)))
    assert found is not None and found.gpu_time_percent is None
    figures = found.evidence["forward"]
    assert figures["cv"] == pytest.approx(plain_cv(NOISY)) and plain_cv(NOISY) > NOISY_CV
    assert figures["n"] == len(NOISY) and figures["median_ms"] == pytest.approx(statistics.median(NOISY))
    p25, _, p75 = statistics.quantiles(NOISY, n=4, method="inclusive")
    assert (figures["p25_ms"], figures["p75_ms"]) == pytest.approx((p25, p75))
    assert "backward" not in found.evidence and "forward_cpu_ms" not in found.evidence
    assert "unsafe" in found.detail and f"{100 * plain_cv(NOISY):.0f}%" in found.detail


def test_a_noisy_backward_fires_alone():
    found = noisy_timing(evidence(timed(STEADY, backward=NOISY)))
    assert found is not None and set(found.evidence) == {"backward"}
    assert found.evidence["backward"]["cv"] == pytest.approx(plain_cv(NOISY))


def test_a_cpu_forward_slower_unprofiled_than_profiled_fires():
    found = noisy_timing(evidence(timed([12.0, 12.1, 11.9, 12.0, 12.0, 12.05, 11.95], profiled_ms=10.0)))
    assert found is not None
    assert found.evidence == {"forward_unprofiled_ms": 12.0, "forward_cpu_ms": 10.0}
    assert "12.000 ms without the profiler but 10.000 ms under it" in found.detail


@pytest.mark.parametrize(
    ("numbers", "device"),
    [
        (timed(STEADY), "cpu"),  # steady, and faster than profiled
        (timed(STEADY, backward=STEADY), "cpu"),
        (timed([12.0] * 7, profiled_ms=10.0), "cuda"),  # a GPU's wall clock holds its launches: never compared
        (timed(NOISY), None),  # an upload: no run of ours, whatever its numbers say
        ({}, "cpu"),  # a summary made before the spread was kept
        ({"forward_ms_stats": {"samples": "garbage"}, "forward_unprofiled_ms": "x", "forward_cpu_ms": None}, "cpu"),
    ],
)
def test_silent_without_its_evidence(numbers, device):
    assert noisy_timing(evidence(numbers, device)) is None


def test_a_single_sample_is_not_called_noisy():
    assert noisy_timing(evidence(timed([50.0], profiled_ms=60.0))) is None


# ---- real runs, their timings injected ------------------------------------------------------------------------------


def run_with(samples: list[float], tmp: pytest.TempPathFactory) -> RunResult:
    """A real CPU run (in this process) whose unprofiled loop is replaced by `samples`."""
    injected: Iterator[TimingStats] = iter([stats_of(samples)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("profiling.runner.time_calls", lambda call, **hooks: next(injected))
        spec = AttentionSpec(variant="naive", seq_len=32, device="cpu")
        return profile_attention(spec, tmp.mktemp("run"), worker=Worker(enabled=False))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    return {
        "noisy": run_with(NOISY, tmp_path_factory),
        "inverted": run_with([1e4] * 7, tmp_path_factory),  # 10 s: slower than any profiled forward of 32x32
        "steady": run_with([1e-3 * s for s in STEADY], tmp_path_factory),  # 1 µs: faster than any
    }


def finding(result: RunResult) -> dict | None:
    return next((f for f in result.summary["findings"] if f["rule"] == "noisy_timing"), None)


def test_a_real_run_with_noisy_timings_gets_the_finding(runs):
    summary = runs["noisy"].summary
    assert summary["forward_ms_stats"]["samples"] == NOISY
    assert summary["forward_unprofiled_ms"] == pytest.approx(statistics.median(NOISY))
    found = finding(runs["noisy"])
    assert found is not None and found["gpu_time_percent"] is None
    assert found["evidence"]["forward"]["cv"] == pytest.approx(plain_cv(NOISY))
    assert any(line.startswith("Noisy timing: ") for line in summary["insights"])


def test_a_real_run_timed_slower_than_profiled_names_both_times(runs):
    found = finding(runs["inverted"])
    assert found is not None and "forward" not in found["evidence"]
    # The profiled forward from the raw file: the mean `attn_fwd` window, by a plain loop.
    windows = reference.windows(runs["inverted"].trace_path, FORWARD)
    assert found["evidence"]["forward_cpu_ms"] == pytest.approx(
        statistics.fmean(e["dur"] for e in windows) / 1e3, abs=1e-4
    )
    assert found["evidence"]["forward_unprofiled_ms"] == 1e4


def test_a_real_run_with_steady_timings_is_silent(runs):
    assert finding(runs["steady"]) is None


def test_our_own_trace_as_an_upload_is_silent(runs):
    assert "noisy_timing" not in {i.rule for i in analyze(load_trace(runs["noisy"].trace_path)).insights}


@pytest.mark.parametrize("name", ["cpu_only", "a100_simple_add"])
def test_real_uploads_are_silent(name):
    assert "noisy_timing" not in {i.rule for i in analyze(load_trace(DATA / f"{name}.json.gz")).insights}
