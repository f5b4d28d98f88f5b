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


def stream_codes(gpu: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per activity the code of its stream's key, and the keys by code, in the keys' sorted order: `7` for stream
    7; `1:7` for stream 7 of device 1 when several devices ran work.

    Each distinct (device, stream) pair's text is made once: a string per GPU event, sorted and grouped by,
    took half of the idle breakdown's time on a big trace."""
    stream = gpu["stream"].to_numpy().astype(np.int64)
    several = gpu["device"].nunique(dropna=True) > 1
    device = gpu["device"].fillna(-1).to_numpy().astype(np.int64) if several else np.zeros(len(stream), np.int64)
    stream_of, streams = pd.factorize(stream)
    device_of, devices = pd.factorize(device)
    codes, pairs = pd.factorize(device_of * len(streams) + stream_of)
    texts = np.array(
        [
            f"{devices[pair // len(streams)]}:{streams[pair % len(streams)]}" if several else str(streams[pair])
            for pair in pairs.tolist()
        ],
        dtype=object,
    )
    order = np.argsort(texts, kind="stable")
    rank = np.empty(len(order), np.intp)
    rank[order] = np.arange(len(order))
    return rank[codes], texts[order]


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
    codes, keys = stream_codes(gpu)  # a code per stream, in its key's sorted order
    frame = pd.DataFrame(
        {
            "key": codes,
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
    category = np.select([host_wait, kernel_wait], [0, 1], 2)  # positions in IDLE_CATEGORIES
    sums = pd.DataFrame({"key": frame["key"], "category": category, "gap": gap}).dropna(subset=["gap"])
    table = sums.groupby(["key", "category"])["gap"].sum().unstack(fill_value=0.0)
    table = table.reindex(index=range(len(keys)), columns=range(len(IDLE_CATEGORIES)), fill_value=0.0)
    totals = table.to_numpy().tolist()
    rows = zip(keys, totals, strict=True)
    return {key: dict(zip(IDLE_CATEGORIES, map(float, row), strict=True)) for key, row in rows}


def idle_time(trace: Trace) -> dict[str, Any]:
    """`idle_time_us` (merged, over the steps' span) and `idle_breakdown_us` (per stream, HTA's rules)."""
    breakdown = idle_breakdown_us(trace)
    return {"idle_time_us": merged_idle_us(trace), "idle_breakdown_us": breakdown or None}
