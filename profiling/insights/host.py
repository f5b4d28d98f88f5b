"""The host: who waits for whom (host-bound, launch overhead, profiler overhead, first call, missing kernels)."""

from __future__ import annotations

from profiling import intervals as iv
from profiling.insights.base import Evidence, Finding, Rule
from profiling.trace import LAUNCH_CATEGORIES

PROFILER_OVERHEAD_NOTICE = 0.15  # say so when the profiler adds more than this share


def overhead_bound(ev: Evidence) -> Finding | None:
    """Host time per forward vs device time per forward, with the idle gaps between kernels."""
    scope = ev.scope
    if not scope.on_gpu or scope.device_ms is None or not len(scope.gpu):
        return None
    busy_ms = iv.total(iv.union(scope.gpu["ts"], scope.gpu["end"])) / 1e3 / ev.per  # intervals merged: streams overlap
    gap_ms = max(0.0, scope.device_ms - busy_ms)
    if ev.whole_trace:
        busy = 100 * busy_ms / scope.device_ms if scope.device_ms else 0.0
        return Finding(
            "GPU busy",
            f"{busy:.0f}% of the time from its first to its last activity ({scope.device_ms:.3f} ms); "
            f"{gap_ms:.3f} ms with no GPU activity on any stream (see the idle-time breakdown for their causes).",
            {"span_ms": scope.device_ms, "busy_ms": busy_ms, "gap_ms": gap_ms},
        )
    bound = "overhead-bound (the CPU is the bottleneck)" if scope.cpu_ms > scope.device_ms else "device-bound"
    return Finding(
        bound[0].upper() + bound[1:],
        f"{scope.cpu_ms:.3f} ms of CPU {ev.unit} vs {scope.device_ms:.3f} ms on the device, of which {gap_ms:.3f} ms "
        "are gaps between kernels (launch latency).",
        {"cpu_ms": scope.cpu_ms, "device_ms": scope.device_ms, "busy_ms": busy_ms, "gap_ms": gap_ms},
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
    Rule("no_kernels", "GPU launches or devices but no kernel events", no_kernels),
    Rule("profiler_overhead", "profiled vs unprofiled forward time (CPU runs)", profiler_overhead),
    Rule("first_call", "first forward vs the steady state, with its cause", first_call),
)
