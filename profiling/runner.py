"""One profiled run, measured: warm up, profile `ACTIVE` forwards, export the trace and the table.

The runner only measures (the trace, the unprofiled time, the error against float64, the
device's yardstick); `profiling.analysis.analyze` reads the trace and builds everything else.
A `Measurement` is plain, picklable data, so a run can happen in a worker process.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import attention
from attention import AttentionSpec
from profiling.reader import Progress
from profiling.roofline import device_name, peak_gbps, peak_tflops
from profiling.timing import TimingStats, time_calls, timing_budget_s
from profiling.windows import FORWARD

WARMUP_CALLS = 3
# After the profiled steps, the forward (and in training the backward) is timed without the profiler
# by `profiling.timing.time_calls`: its stop rules and budget are there.
WAIT, WARMUP, ACTIVE = 1, 1, 3  # the profiler schedule; ACTIVE forwards are measured

CPU_OOM = "can't allocate memory"  # what the CPU allocator's RuntimeError says


class RunError(RuntimeError):
    """A run that started but could not finish (compile failure, out of memory, time limit)."""


KEY_AVERAGES_ROWS = 60  # rows of the `key_averages` text table written beside the trace
KEY_AVERAGES_NAME_WIDTH = 80
BACKWARD = "attn_bwd"


@dataclass(frozen=True)
class Measurement:
    """What one run measured, besides the trace it wrote. Plain data: it crosses process boundaries."""

    spec: AttentionSpec
    trace_path: Path
    table_path: Path
    unprofiled_ms: float  # a forward alone, without the profiler: forward_stats' median
    max_abs_error: float
    device_name: str
    torch_version: str
    peak_tflops: float
    peak_source: str
    peak_gbps: float
    bandwidth_source: str
    first_call_ms: float  # the spec's first forward in this process, before any warm-up
    first_call_fresh: bool  # False when this process had already run the same spec
    backend_reasons: dict[str, str] = field(default_factory=dict)  # SDPA backends that refuse this call, and why
    step_unprofiled_ms: float | None = None  # training: forward median plus backward median, without the profiler
    max_abs_grad_error: float | None = None  # training: the largest error in dQ, dK, dV against float64
    forward_stats: TimingStats | None = None  # the forward's unprofiled wall clock, every sample
    backward_stats: TimingStats | None = None  # training: the backward's, timed alone


def run_name(spec: AttentionSpec) -> str:
    """Readable and unique: two runs of one spec, even in one second, never collide."""
    shape = f"{spec.batch}x{spec.heads}x{spec.seq_len}x{spec.head_dim}"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{spec.name}_{spec.dtype}_{shape}_{stamp}_{uuid.uuid4().hex[:6]}"  # uuid: same spec, same second


@functools.cache
def keep_freed_cpu_memory() -> bool:
    """Ask glibc to keep freed memory instead of trimming it back to the OS (Linux only, once).

    Measured on this project's 2-core VM: without it, in-place attention's unprofiled forward
    was bimodal (10 or 22 ms at 2x8x512x64) as 24 MiB of freed scores were returned and
    page-faulted back on every call; with it, 10 to 12 ms in every run. Timings should measure
    attention, not the hypervisor's page faults.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False  # not glibc: nothing to tune
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_trim_threshold, 1 << 30) and libc.mallopt(m_mmap_threshold, 32 << 20))


def _shape(spec: AttentionSpec) -> str:
    return f"{spec.batch}x{spec.heads}x{spec.seq_len}x{spec.head_dim} {spec.dtype}"


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _activities(device: str) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]


class Deadline:
    """The run's time limit, checked between stages and between forwards."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s
        self.started = time.monotonic()

    def remaining_s(self) -> float | None:
        return None if self.limit_s is None else max(0.0, self.limit_s - (time.monotonic() - self.started))

    def check(self, stage: str) -> None:
        if self.limit_s is not None and time.monotonic() - self.started > self.limit_s:
            raise RunError(f"time limit: the run passed {self.limit_s:.0f} s during {stage}; try a smaller shape")


_RUN_HERE: set[AttentionSpec] = set()  # specs this process has run: their first call is no longer cold


def measure(
    spec: AttentionSpec,
    trace_dir: str | Path,
    progress: Progress | None = None,
    time_limit_s: float | None = None,
) -> Measurement:
    """Profile `ACTIVE` steps of `spec`; write `<run-name>.json` (Chrome trace) and `.txt` to `trace_dir`.

    A step is one forward in `record_function("attn_fwd")`, and in training mode one backward in
    `record_function("attn_bwd")` after it. Raises SpecError when the spec cannot run here, RunError
    when the run fails.
    """
    report = progress or (lambda fraction, message: None)
    attention.preflight(spec)  # CUDA present, supported, fits in memory: else SpecError naming the field
    if spec.device == "cpu":
        keep_freed_cpu_memory()
    budget_s = timing_budget_s()  # a bad ATTENTION_PROFILER_TIMING_BUDGET_S fails here, before any work
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    deadline = Deadline(time_limit_s)
    try:
        with torch.set_grad_enabled(spec.training), _out_of_memory_is_a_run_error(spec):
            report(0.05, "allocating inputs")
            run = attention.prepare(spec)
            reasons = attention.backend_reasons(run) if spec.variant == "sdpa" else {}
            first_ms, fresh = _warm_up(run, report, deadline)
            prof, out = _profile(run, report, deadline)
            report(0.8, "timing without the profiler")
            forward_stats, backward_stats = _unprofiled(run, deadline, budget_s)
            report(0.85, "measuring error against float64")
            error, grad_error = _errors(run, out)
    finally:
        _RUN_HERE.add(spec)
    report(0.9, "exporting the trace")
    trace_path, table_path = _export(prof, spec, trace_dir / run_name(spec))
    report(0.95, "measuring the device's peaks")
    gpu = device_name(spec.device)
    tflops, tflops_source = peak_tflops(spec.device, gpu, spec.dtype)
    gbps, gbps_source = peak_gbps(spec.device, gpu)
    step_ms = forward_stats.median + backward_stats.median if backward_stats else None
    return Measurement(
        spec, trace_path, table_path, forward_stats.median, error, gpu, torch.__version__, tflops, tflops_source,
        gbps, gbps_source, first_ms, fresh, reasons, step_ms, grad_error, forward_stats, backward_stats,
    )  # fmt: skip


@contextlib.contextmanager
def _out_of_memory_is_a_run_error(spec: AttentionSpec) -> Iterator[None]:
    try:
        yield
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        raise RunError(
            f"out of GPU memory for {_shape(spec)}; the cache was freed, try a smaller seq_len or batch"
        ) from None
    except RuntimeError as exc:
        if CPU_OOM not in str(exc):
            raise
        raise RunError(f"out of CPU memory for {_shape(spec)}; try a smaller seq_len or batch") from None


def _step(run: attention.Prepared) -> torch.Tensor:
    """One forward, and in training its backward, each in its own annotated window."""
    with record_function(FORWARD):
        out = run()
    if run.spec.training:
        with record_function(BACKWARD):
            run.backward(out)
    return out


def _warm_up(run: attention.Prepared, report: Progress, deadline: Deadline) -> tuple[float, bool]:
    """The warm-up steps; returns the first forward's time (ms) and whether it was this process's first."""
    spec = run.spec
    fresh = spec not in _RUN_HERE
    for i in range(WARMUP_CALLS):
        report(0.1 + 0.2 * i / WARMUP_CALLS, "warm-up" + (" (compiling)" if spec.compile and i == 0 else ""))
        _sync(spec.device)
        start = time.perf_counter()
        out = _warm(run, spec)
        _sync(spec.device)
        if i == 0:
            first_ms = (time.perf_counter() - start) * 1e3
        if spec.training:
            run.backward(out)
        deadline.check("warm-up")
    _sync(spec.device)
    return first_ms, fresh


def _profile(run: attention.Prepared, report: Progress, deadline: Deadline) -> tuple[profile, torch.Tensor]:
    steps = WAIT + WARMUP + ACTIVE
    with profile(
        activities=_activities(run.spec.device),
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE),
        record_shapes=True,
        profile_memory=True,
    ) as prof:
        for step in range(steps):
            report(0.3 + 0.5 * step / steps, f"profiling step {step + 1}/{steps}")
            out = _step(run)
            _sync(run.spec.device)
            prof.step()
            deadline.check("profiling")
    return prof, out


def _errors(run: attention.Prepared, out: torch.Tensor) -> tuple[float, float | None]:
    """The largest |out - ref| and, in training, the largest error of dQ, dK, dV, against float64."""
    ref = run.reference()
    error = (out.detach().double() - ref.output).abs().max().item()
    if ref.grads is None:
        return error, None
    grads = (run.query.grad, run.key.grad, run.value.grad)
    return error, max((g.double() - r).abs().max().item() for g, r in zip(grads, ref.grads, strict=True))


def _export(prof: profile, spec: AttentionSpec, stem: Path) -> tuple[Path, Path]:
    """The Chrome trace, and torch's own `key_averages` table beside it (the blog's printout)."""
    trace_path, table_path = stem.with_suffix(".json"), stem.with_suffix(".txt")
    prof.export_chrome_trace(str(trace_path))
    sort_by = "self_device_time_total" if spec.device == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(
        sort_by=sort_by, row_limit=KEY_AVERAGES_ROWS, max_name_column_width=KEY_AVERAGES_NAME_WIDTH
    )
    table_path.write_text(table)
    return trace_path, table_path


def _unprofiled(run: attention.Prepared, deadline: Deadline, budget_s: float) -> tuple[TimingStats, TimingStats | None]:
    """The forward timed alone without the profiler, and in training the backward timed alone: an
    untimed forward before each timed backward, so forward and backward are measured the same way."""
    device = run.spec.device
    check = functools.partial(deadline.check, "timing")
    forward = time_calls(run, after=check, budget_s=budget_s, sync=lambda: _sync(device))
    if not run.spec.training:
        return forward, None
    outputs: list[torch.Tensor] = []
    backward = time_calls(
        lambda: run.backward(outputs.pop()),
        before=lambda: outputs.append(run()),
        after=check,
        budget_s=budget_s,
        sync=lambda: _sync(device),
    )
    return forward, backward


def _warm(forward: Callable[[], torch.Tensor], spec: AttentionSpec) -> torch.Tensor:
    """A forward; with torch.compile, a failed compile becomes a clear RunError."""
    if not spec.compile:
        return forward()
    try:
        return forward()
    except Exception as exc:  # Inductor raises many types: a missing compiler, a lowering bug, ...
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunError(
            f"compile: torch.compile failed ({type(exc).__name__}: {first_line[:300]}); untick compile"
        ) from None
