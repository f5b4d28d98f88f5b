"""Real profiled CPU runs reproduce the blog's findings, and the exported files agree."""

import json
import statistics

import pytest

from attention import AttentionSpec, SpecError
from profiling import runner, timing
from profiling.pipeline import profile_attention
from profiling.runner import ACTIVE, RunError
from profiling.summary import SUMMARY_KEYS
from profiling.windows import FORWARD
from profiling.worker import Worker


def test_summary_has_every_public_key(cpu_runs):
    for result in cpu_runs.values():
        assert set(SUMMARY_KEYS) <= set(result.summary)
        assert result.summary["forward_device_ms"] is None  # CPU run
        assert result.summary["self_device_total_ms"] is None
        assert result.summary["forwards"] == ACTIVE


def test_naive_clones_and_inplace_does_not(cpu_runs):
    naive, inplace = cpu_runs["naive"].summary, cpu_runs["inplace"].summary
    assert naive["per_forward_ops"]["aten::clone"] == 1
    assert "aten::clone" not in inplace["per_forward_ops"]
    assert naive["kernels_per_forward"] == inplace["kernels_per_forward"] + 1


def test_kernel_ordering_math_gt_inplace_gt_fused(cpu_runs):
    kernels = {name: r.summary["kernels_per_forward"] for name, r in cpu_runs.items()}
    assert kernels["math"] > kernels["inplace"] > kernels["flash"] == 1
    assert kernels["math-bf16"] > kernels["math"]  # the upcast and downcast copies


def test_math_rebuilds_the_mask_and_uses_safe_softmax(cpu_runs):
    ops = cpu_runs["math"].summary["per_forward_ops"]
    assert ops["aten::_safe_softmax"] == 1
    assert ops["aten::tril"] == 1
    assert "aten::tril" not in cpu_runs["naive"].summary["per_forward_ops"]  # naive's mask is built once, outside


def test_error_is_small_and_measured(cpu_runs):
    assert 0 < cpu_runs["naive"].summary["max_abs_error"] < 1e-5
    assert 1e-4 < cpu_runs["math-bf16"].summary["max_abs_error"] < 5e-2


def test_peak_memory_comes_from_memory_events(cpu_runs):
    naive, flash = cpu_runs["naive"].summary, cpu_runs["flash"].summary
    scores = 1 * 4 * 256 * 256 * 4
    assert naive["peak_memory_bytes"] >= 2 * scores  # two score matrices alive at once
    assert 0 < flash["peak_memory_bytes"] < scores  # fused: no score matrix


def test_trace_is_valid_json_with_three_forwards(cpu_runs):
    result = cpu_runs["naive"]
    document = json.loads(result.trace_path.read_text())
    forwards = [e for e in document["traceEvents"] if e.get("name") == FORWARD and e.get("cat") == "user_annotation"]
    assert len(forwards) == ACTIVE
    assert all(e["ph"] == "X" and e["dur"] > 0 for e in forwards)
    # The op counts in the file agree with the summary.
    aten = [
        e
        for e in document["traceEvents"]
        if e.get("cat") == "cpu_op"
        and e["name"].startswith("aten::")
        and any(f["ts"] <= e["ts"] and e["ts"] + e["dur"] <= f["ts"] + f["dur"] for f in forwards)
    ]
    assert len(aten) / ACTIVE == result.summary["ops_per_forward"]
    assert result.table_path.read_text().count("aten::bmm") >= 1
    assert result.trace_path.parent == result.table_path.parent


def test_run_names_never_collide(tmp_path):
    spec = AttentionSpec(seq_len=32, device="cpu")
    first, second = profile_attention(spec, tmp_path), profile_attention(spec, tmp_path)
    assert first.trace_path != second.trace_path
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_progress_is_reported(tmp_path):
    seen = []
    profile_attention(AttentionSpec(seq_len=32, device="cpu"), tmp_path, progress=lambda f, m: seen.append((f, m)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any("profiling step" in m for _, m in seen)


def test_unsupported_backend_is_refused_before_running(tmp_path):
    with pytest.raises(SpecError, match="^backend: the efficient"):
        profile_attention(AttentionSpec(variant="sdpa", backend="efficient", device="cpu"), tmp_path)
    assert not list(tmp_path.iterdir())


def test_time_limit_is_reported(tmp_path):
    with pytest.raises(RunError, match=r"^time limit: this run would take about \d+ s"):
        profile_attention(AttentionSpec(seq_len=32, device="cpu"), tmp_path, time_limit_s=0.0)


def test_out_of_memory_is_caught_and_the_next_run_works(tmp_path, monkeypatch):
    import attention.budget
    import attention.support

    # Claim a machine with an exabyte free so the guard lets an impossible shape through to the allocator.
    monkeypatch.setattr(attention.support, "available_bytes", lambda device: 2**60)
    monkeypatch.setattr(attention.support, "machine_budget", lambda: attention.budget.MemoryBudget(2**62))
    huge = AttentionSpec(variant="inplace", batch=512, heads=256, seq_len=131072, head_dim=64, device="cpu")
    here = Worker(enabled=False)  # the patch holds in this process only
    with pytest.raises(RunError, match="^out of CPU memory for 512x256x131072x64 float32"):
        profile_attention(huge, tmp_path, worker=here)
    monkeypatch.undo()
    assert profile_attention(AttentionSpec(seq_len=32, device="cpu"), tmp_path).summary["kernels_per_forward"] == 6


def test_cpu_runs_keep_freed_memory_on_glibc():
    import platform

    from profiling.runner import keep_freed_cpu_memory

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt tuning applies to glibc only")
    assert keep_freed_cpu_memory() is True


def test_every_run_carries_its_timing_spread(cpu_runs):
    """The unprofiled loop's samples, and statistics that agree with them by the standard library."""
    for name, result in cpu_runs.items():
        summary = result.summary
        stats = summary["forward_ms_stats"]
        samples = stats["samples"]
        assert 1 <= stats["n"] == len(samples) <= timing.MAX_CALLS, name
        assert stats["median"] == pytest.approx(statistics.median(samples), abs=1e-6), name
        assert (stats["min"], stats["max"]) == (min(samples), max(samples))
        assert summary["forward_unprofiled_ms"] == pytest.approx(stats["median"], abs=1e-4)
        cv = statistics.stdev(samples) / statistics.fmean(samples) if len(samples) > 1 else 0.0
        assert stats["cv"] == pytest.approx(cv, abs=1e-4) and stats["noisy"] == (stats["cv"] > timing.NOISY_CV)
        assert summary["backward_ms_stats"] is None and summary["backward_unprofiled_ms"] is None  # inference


def test_training_times_the_backward_alone_and_checks_the_deadline(tmp_path, monkeypatch):
    loops: list[dict] = []
    stages: list[str] = []

    def spy(call, **hooks):
        got = timing.time_calls(call, **{**hooks, "budget_s": 0.05})
        loops.append({"hooks": set(hooks) - {"budget_s"}, "n": got.n})
        return got

    check = runner.Deadline.check
    monkeypatch.setattr(runner, "time_calls", spy)
    monkeypatch.setattr(runner.Deadline, "check", lambda self, stage: (stages.append(stage), check(self, stage))[1])
    spec = AttentionSpec(seq_len=32, device="cpu", mode="training")
    summary = profile_attention(spec, tmp_path, worker=Worker(enabled=False)).summary
    forward, backward = loops
    assert forward["hooks"] == {"after", "sync"}  # the forward alone
    assert backward["hooks"] == {"before", "after", "sync"}  # its forward untimed, before each backward
    assert stages.count("timing") == forward["n"] + backward["n"]  # the deadline, checked after every call
    fwd, bwd = summary["forward_ms_stats"], summary["backward_ms_stats"]
    assert (fwd["n"], bwd["n"]) == (forward["n"], backward["n"])
    assert summary["backward_unprofiled_ms"] == pytest.approx(statistics.median(bwd["samples"]), abs=1e-4)
    assert summary["step_unprofiled_ms"] == pytest.approx(fwd["median"] + bwd["median"], abs=1e-4)
    # On the CPU the backward's rate comes from its own unprofiled time, never from a step less a forward.
    assert summary["backward_tflops"] == pytest.approx(
        spec.backward_flops() / summary["backward_unprofiled_ms"] / 1e9, rel=1e-3, abs=1e-4
    )


def test_the_time_limit_stops_the_timing_loop(tmp_path, monkeypatch):
    """A deadline passed during the timing loop ends it with the stage named, not after MAX_CALLS calls."""
    calls: list[int] = []

    def expire_when_timing(self, stage):
        if stage == "timing":
            calls.append(1)
            raise RunError("time limit: the run passed 0 s during timing; try a smaller shape")

    monkeypatch.setattr(runner.Deadline, "check", expire_when_timing)
    with pytest.raises(RunError, match="during timing"):
        profile_attention(AttentionSpec(seq_len=32, device="cpu"), tmp_path, worker=Worker(enabled=False))
    assert calls == [1]


def test_a_bad_timing_budget_is_refused_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv(timing.BUDGET_ENV, "soon")
    with pytest.raises(ValueError, match=f"^{timing.BUDGET_ENV}"):
        runner.measure(AttentionSpec(seq_len=32, device="cpu"), tmp_path)
    assert not list(tmp_path.iterdir())  # no trace written: nothing ran
