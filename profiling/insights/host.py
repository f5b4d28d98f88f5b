"""The host: who waits for whom (host-bound, launch-bound, blocking syncs, profiler overhead, first call,
missing kernels)."""

from __future__ import annotations

import numpy as np

from profiling import intervals as iv
from profiling.host_stalls import BlockingSync, LaunchStats, blocking_syncs, launch_stats
from profiling.insights.base import NAME_IN_LIST, Evidence, Finding, Rule, fmt_bytes, short
from profiling.step_breakdown import step_at
from profiling.trace import LAUNCH_CATEGORIES

PROFILER_OVERHEAD_NOTICE = 0.15  # say so when the profiler adds more than this share
# launch_bound: HTA's host wait on the busiest stream, as a share of the steps' span, from which the GPU
# is called launch-bound (the threshold: the host, not the GPU, sets the pace).
LAUNCH_BOUND_HOST_WAIT_PERCENT = 50.0


def overhead_bound(ev: Evidence) -> Finding | None:
    """Host time per forward vs device time per forward, with the idle gaps between kernels."""
    scope = ev.scope
    if not scope.on_gpu or scope.device_ms is None or not len(scope.gpu):
        return None
    busy_ms = iv.total(iv.union(scope.gpu["ts"], scope.gpu["end"])) / 1e3 / ev.per  # intervals merged: streams overlap
    gap_ms = max(0.0, scope.device_ms - busy_ms)
    if ev.whole_trace:
        busy = 100 * busy_ms / scope.device_ms if scope.device_ms else 0.0
        cause = _blocked(ev)
        return Finding(
            "GPU busy",
            f"{busy:.0f}% of the time from its first to its last activity ({scope.device_ms:.3f} ms); "
            f"{gap_ms:.3f} ms with no GPU activity on any stream"
            + (
                f", of which the host spent {cause.idle_us / 1e3:.3f} ms blocked in {short(cause.name, NAME_IN_LIST)}"
                f"{_issued_by(cause)} (see the blocking-sync finding)."
                if cause
                else " (see the launch-bound finding)."
                if _is_launch_bound(launch_stats(ev.trace))
                else " (see the idle-time breakdown for their causes)."
            ),
            {"span_ms": scope.device_ms, "busy_ms": busy_ms, "gap_ms": gap_ms}
            | ({"blocked_in": cause.name, "blocked_ms": cause.idle_us / 1e3} if cause else {}),
        )
    bound = "overhead-bound (the CPU is the bottleneck)" if scope.cpu_ms > scope.device_ms else "device-bound"
    return Finding(
        bound[0].upper() + bound[1:],
        f"{scope.cpu_ms:.3f} ms of CPU {ev.unit} vs {scope.device_ms:.3f} ms on the device, of which {gap_ms:.3f} ms "
        "are gaps between kernels (launch latency).",
        {"cpu_ms": scope.cpu_ms, "device_ms": scope.device_ms, "busy_ms": busy_ms, "gap_ms": gap_ms},
    )


def _blocked(ev: Evidence) -> BlockingSync | None:
    """The sync that covers the most GPU idle time, where one passes blocking_sync's thresholds."""
    report = blocking_syncs(ev.trace)
    return report.worst[0] if report and report.worst else None


def _issued_by(sync: BlockingSync) -> str:
    if sync.op is None or sync.op == sync.name:
        return ""
    return f" issued by {short(sync.op, NAME_IN_LIST)}"


def _sync_advice(name: str) -> str:
    """What to do about one kind of sync; the kind is read from its name."""
    if "Memcpy" in name or "memcpy" in name.lower():
        return (
            "A synchronous copy returns only once all work queued before it has run: copy with "
            "non_blocking=True into pinned memory and read the result later, or keep the value on the GPU."
        )
    if name in ("aten::item", "aten::_local_scalar_dense"):
        return (
            "Reading a GPU value on the host (.item(), .tolist(), printing, or Python control flow on a GPU "
            "tensor) waits for all queued work: keep the value on the GPU, or read it once after the step."
        )
    return "A synchronize waits for all queued work: drop it from the step, or move it after the timed region."


def blocking_sync(ev: Evidence) -> Finding | None:
    """A sync call or op that alone covers >= 10% of the GPU's merged idle time and >= 1 ms of it."""
    report = blocking_syncs(ev.trace)
    if report is None or not report.worst:
        return None
    worst = report.worst[0]
    trace = ev.trace
    copy = _copy_of(ev, worst)
    caller = next((f for f in worst.python if not _in_torch(f)), None)
    moved = (
        f" The copy itself moved {fmt_bytes(copy[0])} in {copy[1]:.1f} µs: the rest was waiting."
        if copy and copy[0] is not None
        else ""
    )
    return Finding(
        "Blocking sync",
        f"{short(worst.name, NAME_IN_LIST)}{_issued_by(worst)}"
        + (f" (from {short(_frame(caller), NAME_IN_LIST)})" if caller else "")
        + f" held the host for {worst.dur / 1e3:.3f} ms, {worst.idle_us / 1e3:.3f} ms of it with no kernel running "
        f"on any GPU: {100 * worst.idle_us / report.idle_us:.0f}% of the GPU's {report.idle_us / 1e3:.3f} ms idle "
        f"time in the steps' span, where it was busy {report.busy_percent:.0f}% of the time.{moved} "
        + ("" if report.qualifying == 1 else f"{report.qualifying} such syncs in all. ")
        + _sync_advice(worst.name),
        {
            "name": worst.name,
            "op": worst.op,
            "top_op": worst.top_op,
            "python": list(worst.python),
            "dur_us": worst.dur,
            "idle_covered_us": worst.idle_us,
            "idle_us": report.idle_us,
            "span_us": report.span_us,
            "syncs": report.qualifying,
            "copy_bytes": copy[0] if copy else None,
            "ts_us": worst.ts + trace.ts_base_us,
            "step": worst.step,
        },
        # About idle time, not about GPU events: no share of GPU time.
        None,
    )


def _copy_of(ev: Evidence, sync: BlockingSync) -> tuple[float | None, float] | None:
    """Bytes and µs of the GPU copy a sync call made (same correlation id), where it made one."""
    correlation = ev.trace.events["correlation"].to_numpy()[sync.row]
    if np.isnan(correlation):
        return None
    copies = ev.trace.of_category("gpu_memcpy")
    copies = copies[copies["correlation"].to_numpy() == correlation]
    if copies.empty:
        return None
    size = copies["bytes"].iloc[0]
    return (None if np.isnan(size) else float(size)), float(np.nansum(copies["dur"].to_numpy()))


def _frame(frame: str) -> str:
    """A Python frame `/long/path/file.py(276): func` as `file.py(276): func`: the path is in the evidence."""
    location, sep, function = frame.partition("(")
    return location.rsplit("/", 1)[-1] + sep + function


def _in_torch(frame: str) -> bool:
    """A Python frame in torch's own files (`torch/...py(99): ...`), which says nothing about the caller."""
    return frame.startswith("torch/") or "/torch/" in frame.split("(", 1)[0]


def _is_launch_bound(stats: LaunchStats | None) -> bool:
    return stats is not None and not stats.graph_launches and stats.host_wait_percent >= LAUNCH_BOUND_HOST_WAIT_PERCENT


def launch_bound(ev: Evidence) -> Finding | None:
    """No graph launches, and HTA's host wait on the busiest stream >= 50% of the steps' span."""
    stats = launch_stats(ev.trace)
    if stats is None or not _is_launch_bound(stats):
        return None
    gap = stats.median_gap_us
    cadence = f"{stats.kernels_per_step:.0f} kernels per step, {stats.median_kernel_us:.1f} µs each (median), " + (
        f"{gap:.1f} µs apart (median gap on stream {stats.stream})" if gap is not None else ""
    )
    if gap is not None and gap > stats.median_kernel_us:
        why = (
            "the gaps between kernels are longer than the kernels: the CPU launches them more slowly than the GPU "
            "runs them, and no CUDA/HIP graph is replayed. Capture the step in a CUDA graph (torch.cuda.graphs, or "
            'torch.compile(mode="reduce-overhead")), or fuse kernels with torch.compile.'
        )
    else:
        why = (
            f"most kernels follow each other closely, so the wait is in a few long gaps (the widest "
            f"{(stats.widest_gap_us or 0.0) / 1e3:.3f} ms): see what the host does there; CUDA graphs or "
            "torch.compile help only where the gaps are launch overhead."
        )
    return Finding(
        "Launch-bound",
        f"the GPU waited on the host for {stats.host_wait_us / 1e3:.3f} of the steps' {stats.span_us / 1e3:.3f} ms "
        f"({stats.host_wait_percent:.0f}%, HTA's host wait on stream {stats.stream}): {cadence}; " + why,
        {
            "host_wait_us": stats.host_wait_us,
            "span_us": stats.span_us,
            "host_wait_percent": stats.host_wait_percent,
            "stream": stats.stream,
            "steps": stats.steps,
            "kernels_per_step": stats.kernels_per_step,
            "median_kernel_us": stats.median_kernel_us,
            "median_gap_us": gap,
            "widest_gap_us": stats.widest_gap_us,
            "graph_launches": 0,
            "ts_us": None if stats.ts is None else stats.ts + ev.trace.ts_base_us,
            "step": None if stats.ts is None else step_at(ev.trace, stats.ts, device_side=True),
        },
        # About idle time between kernels, not about GPU events: no share of GPU time.
        None,
    )


def no_kernels(ev: Evidence) -> Finding | None:
    """A trace that should hold kernels but holds none. Checks first that none is truly there."""
    trace = ev.trace
    if len(trace.gpu_activity):
        return None
    launches = len(trace.of_category(*LAUNCH_CATEGORIES))
    expected_gpu = ev.device == "cuda" or launches > 0 or bool(trace.device_properties)
    if not expected_gpu:
        return None
    return Finding(
        "No kernels recorded",
        f"the trace has {launches} CUDA runtime/driver calls but no kernel, memcpy or memset events. Likely causes: "
        "ProfilerActivity.CUDA was not enabled, CUPTI ran in counter (range-profiling) mode, the process lacked "
        "GPU performance-counter permission, or the trace ended before the device was synchronised.",
        {"launch_calls": launches, "kernel_events": 0},
    )


def profiler_overhead(ev: Evidence) -> Finding | None:
    """On CPU the profiler's per-op bookkeeping lands inside the forward it measures."""
    scope = ev.scope
    if ev.unprofiled_ms is None or scope.on_gpu or not scope.count or ev.unprofiled_ms <= 0:
        return None
    ratio = scope.cpu_ms / ev.unprofiled_ms
    if ratio < 1 + PROFILER_OVERHEAD_NOTICE:
        return None
    return Finding(
        "Profiler overhead",
        f"a forward took {scope.cpu_ms:.3f} ms under the profiler but {ev.unprofiled_ms:.3f} ms without it "
        f"(x{ratio:.2f}); its {scope.ops_per_window:g} ops per forward each pay the profiler's bookkeeping, so "
        "compare runs by their unprofiled time.",
        {"profiled_ms": scope.cpu_ms, "unprofiled_ms": ev.unprofiled_ms, "ratio": ratio},
    )


def first_call(ev: Evidence) -> Finding | None:
    """The spec's first call, much slower than the steady state, with its cause."""
    cause = ev.numbers.get("first_call_cause")
    if not cause:
        return None
    first, steady = ev.numbers["first_call_ms"], ev.numbers["forward_unprofiled_ms"]
    return Finding(
        "First call >> steady state",
        f"the first forward took {first:.3f} ms against {steady:.3f} ms once warm (x{first / steady:.1f}): {cause}.",
        {"first_call_ms": first, "steady_ms": steady, "cause": cause},
    )


RULES: tuple[Rule, ...] = (
    Rule("overhead_bound", "CPU vs device time per forward, kernel gaps", overhead_bound),
    Rule("blocking_sync", "a sync call or .item() covering >= 10% and >= 1 ms of GPU idle time", blocking_sync),
    Rule("launch_bound", "no graph launches; HTA host wait >= 50% of the steps' span", launch_bound),
    Rule("no_kernels", "GPU launches or devices but no kernel events", no_kernels),
    Rule("profiler_overhead", "profiled vs unprofiled forward time (CPU runs)", profiler_overhead),
    Rule("first_call", "first forward vs the steady state, with its cause", first_call),
)
