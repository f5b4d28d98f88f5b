"""GPU idle time: how long no kernel ran in the steps' span, and why each stream waited (HTA's rules).

`idle_time_us` is the steps' span (`step_breakdown.steps_span`: the ProfilerSteps, else the plugin's
step "0" over the host's ops, else the whole trace) minus the union of kernel intervals inside it,
on every GPU together, so the TensorBoard plugin's utilization and this idle time add up to the span.

`idle_breakdown_us` follows Holistic Trace Analysis 0.5.0
(`hta/analyzers/breakdown_analysis.py`, `BreakdownAnalysis._analyze_idle_time_for_stream` and
`get_idle_time_breakdown`): on each stream, GPU activity (kernels, memcpy, memset) in start
order; the gap before each one is
- `host_wait` when its launch started after the previous activity on the stream had ended
  (the CPU did not enqueue work fast enough);
- else `kernel_wait` when the gap is under `consecutive_kernel_delay`, 30 by default, compared
  with timestamps in µs (HTA's docstring says ns, but its trace timestamps are µs);
- else `other` (e.g. waiting on an event from another stream).
The first activity on a stream has no gap. Per-stream totals overlap in time, so they need not
add up to the merged idle time.

Where we differ from HTA, on purpose: "the previous activity's end" is the latest end of all the
activity before it on the stream (the end of their union), not the end of the one just before.
Activity that overlaps on one stream (real traces have it: 74 such kernels in a B200 vLLM trace)
then leaves no gap rather than a negative one; HTA would report the overlap as negative
`kernel_wait`. Without overlap the two readings are the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.step_breakdown import launch_spans, steps_span
from profiling.trace import Trace, per_trace

CONSECUTIVE_KERNEL_DELAY_US = 30.0  # HTA TraceAnalysis.get_idle_time_breakdown(consecutive_kernel_delay=30)
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")


def merged_idle_us(trace: Trace) -> float | None:
    """The span minus the union of kernel intervals inside it; None without kernels or span."""
    span = steps_span(trace)
    kernels = trace.kernels
    if span is None or kernels.empty:
        return None
    busy = iv.clip(iv.union(kernels["ts"].to_numpy(), kernels["end"].to_numpy()), *span)
    return float(span[1] - span[0]) - iv.total(busy)


def stream_keys(gpu: pd.DataFrame) -> pd.Series:
    """`7` for stream 7; `1:7` for stream 7 of device 1 when several devices ran work."""
    stream = gpu["stream"].astype(np.int64).astype(str)
    if gpu["device"].nunique(dropna=True) > 1:
        return gpu["device"].fillna(-1).astype(np.int64).astype(str) + ":" + stream
    return stream


def idle_breakdown_us(trace: Trace, consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US) -> dict:
    """`{stream: {host_wait, kernel_wait, other}}` in µs, by HTA's idle-time rules; {} without GPU work."""
    if consecutive_kernel_delay_us == CONSECUTIVE_KERNEL_DELAY_US:
        return _default_breakdown(trace)  # the summary's and launch_stats's: computed once per trace
    return _breakdown(trace, consecutive_kernel_delay_us)


@per_trace
def _default_breakdown(trace: Trace) -> dict:
    return _breakdown(trace, CONSECUTIVE_KERNEL_DELAY_US)


def _breakdown(trace: Trace, consecutive_kernel_delay_us: float) -> dict:
    gpu = trace.gpu_activity
    gpu = gpu[gpu["stream"].notna() & gpu["stream"].ge(0)]
    if gpu.empty:
        return {}
    frame = pd.DataFrame(
        {
            "key": stream_keys(gpu).to_numpy(),
            "ts": gpu["ts"].to_numpy(),
            "end": gpu["end"].to_numpy(),
            "launch": launch_spans(trace, gpu["correlation"].to_numpy())[0],
        }
    ).sort_values(["key", "ts"], kind="stable")
    # The union's reach so far on the stream: an activity inside a longer earlier one waited for nothing.
    previous_end = frame.groupby("key", sort=False)["end"].cummax().groupby(frame["key"], sort=False).shift(1)
    gap = (frame["ts"] - previous_end).clip(lower=0.0)
    host_wait = frame["launch"] > previous_end  # NaN compares False, as in HTA
    kernel_wait = ~host_wait & (gap < consecutive_kernel_delay_us)
    category = np.select([host_wait, kernel_wait], ["host_wait", "kernel_wait"], "other")
    sums = pd.DataFrame({"key": frame["key"], "category": category, "gap": gap}).dropna(subset=["gap"])
    table = sums.groupby(["key", "category"])["gap"].sum().unstack(fill_value=0.0)
    table = table.reindex(columns=list(IDLE_CATEGORIES), fill_value=0.0)
    keys = frame["key"].unique()
    return {key: {c: float(table.at[key, c]) if key in table.index else 0.0 for c in IDLE_CATEGORIES} for key in keys}


def idle_time(trace: Trace) -> dict[str, Any]:
    """`idle_time_us` (merged, over the steps' span) and `idle_breakdown_us` (per stream, HTA's rules)."""
    breakdown = idle_breakdown_us(trace)
    return {"idle_time_us": merged_idle_us(trace), "idle_breakdown_us": breakdown or None}
