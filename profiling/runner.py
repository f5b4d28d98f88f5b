"""One profiled run, measured: warm up, profile `ACTIVE` forwards, export the trace and the table.

The runner only measures (the trace, the unprofiled time, the error against float64, the
device's yardstick); `profiling.analysis.analyze` reads the trace and builds everything else.
A `Measurement` is plain, picklable data, so a run can happen in a worker process.
"""

from __future__ import annotations

import ctypes
import functools
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import attention
from attention import AttentionSpec
from profiling.roofline import device_name, peak_tflops
from profiling.windows import FORWARD

WARMUP_CALLS = 3
# Forwards timed without the profiler, to show what its per-op overhead adds: at least
# UNPROFILED_CALLS, and more up to UNPROFILED_MAX_CALLS until UNPROFILED_MIN_S have passed,
# so a noisy machine gives a median of enough samples.
UNPROFILED_CALLS, UNPROFILED_MAX_CALLS, UNPROFILED_MIN_S = 5, 50, 0.2
WAIT, WARMUP, ACTIVE = 1, 1, 3  # the profiler schedule; ACTIVE forwards are measured

CPU_OOM = "can't allocate memory"  # what the CPU allocator's RuntimeError says

Progress = Callable[[float, str], None]


class RunError(RuntimeError):
    """A run that started but could not finish (compile failure, out of memory, time limit)."""


KEY_AVERAGES_ROWS = 60  # rows of the `key_averages` text table written beside the trace
KEY_AVERAGES_NAME_WIDTH = 80


@dataclass(frozen=True)
class Measurement:
    """What one run measured, besides the trace it wrote."""

    spec: AttentionSpec
    trace_path: Path
    table_path: Path
    unprofiled_ms: float
    max_abs_error: float
    device_name: str
    torch_version: str
    peak_tflops: float
    peak_source: str


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


def measure(
    spec: AttentionSpec,
    trace_dir: str | Path,
    progress: Progress | None = None,
    time_limit_s: float | None = None,
) -> Measurement:
    """Profile `ACTIVE` forwards of `spec`; write `<run-name>.json` (Chrome trace) and `.txt` to `trace_dir`.

    Raises SpecError when the spec cannot run on its device, RunError when the run fails.
    """
    report = progress or (lambda fraction, message: None)
    attention.preflight(spec)  # CUDA present, supported, fits in memory: else SpecError naming the field
    if spec.device == "cpu":
        keep_freed_cpu_memory()
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    deadline = Deadline(time_limit_s)
    name = run_name(spec)
    try:
        report(0.05, "allocating inputs")
        forward = attention.prepare(spec)
        with torch.no_grad():
            _warm_up(forward, spec, report, deadline)
            prof, out = _profile(forward, spec, report, deadline)
            report(0.8, "timing without the profiler")
            unprofiled_ms = _unprofiled_ms(forward, spec.device)
            deadline.check("timing")
            report(0.85, "measuring error against float64")
            error = (out.double() - forward.reference().output).abs().max().item()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        raise RunError(
            f"out of GPU memory for {_shape(spec)}; the cache was freed, try a smaller seq_len or batch"
        ) from None
    except RuntimeError as exc:
        if CPU_OOM not in str(exc):
            raise
        raise RunError(f"out of CPU memory for {_shape(spec)}; try a smaller seq_len or batch") from None
    report(0.9, "exporting the trace")
    trace_path, table_path = _export(prof, spec, trace_dir / name)
    report(0.95, "measuring the device's peak")
    gpu_name = device_name(spec.device)
    peak, source = peak_tflops(spec.device, gpu_name, spec.dtype)
    return Measurement(spec, trace_path, table_path, unprofiled_ms, error, gpu_name, torch.__version__, peak, source)


def _warm_up(forward: Callable[[], torch.Tensor], spec: AttentionSpec, report: Progress, deadline: Deadline) -> None:
    for i in range(WARMUP_CALLS):
        report(0.1 + 0.2 * i / WARMUP_CALLS, "warm-up" + (" (compiling)" if spec.compile and i == 0 else ""))
        _warm(forward, spec)
        deadline.check("warm-up")
    _sync(spec.device)


def _profile(
    forward: Callable[[], torch.Tensor], spec: AttentionSpec, report: Progress, deadline: Deadline
) -> tuple[profile, torch.Tensor]:
    steps = WAIT + WARMUP + ACTIVE
    with profile(
        activities=_activities(spec.device),
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE),
        record_shapes=True,
        profile_memory=True,
    ) as prof:
        for step in range(steps):
            report(0.3 + 0.5 * step / steps, f"profiling step {step + 1}/{steps}")
            with record_function(FORWARD):
                out = forward()
            _sync(spec.device)
            prof.step()
            deadline.check("profiling")
    return prof, out


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


def _unprofiled_ms(forward: Callable[[], torch.Tensor], device: str) -> float:
    """Median wall time of a forward with no profiler attached (synchronised on CUDA)."""
    times: list[float] = []
    while len(times) < UNPROFILED_CALLS or (sum(times) < UNPROFILED_MIN_S and len(times) < UNPROFILED_MAX_CALLS):
        _sync(device)
        start = time.perf_counter()
        forward()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _warm(forward: Callable[[], torch.Tensor], spec: AttentionSpec) -> torch.Tensor:
    if not spec.compile:
        return forward()
    try:
        return forward()
    except Exception as exc:  # Inductor raises many types: a missing compiler, a lowering bug, ...
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunError(
            f"compile: torch.compile failed ({type(exc).__name__}: {first_line[:300]}); untick compile"
        ) from None
