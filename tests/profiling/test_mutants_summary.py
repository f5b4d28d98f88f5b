"""`/analyze`'s summary, key by key, against plain loops over the raw JSON (gaps mutation testing found)."""

from __future__ import annotations

import pandas as pd
import pytest

from profiling.analysis import analyze
from profiling.step_breakdown import step_breakdown
from profiling.summary import per_window_counts, trace_summary
from profiling.trace import load_trace
from tests import reference
from tests.conftest import DATA
from tests.profiling.test_gpu_metrics import kernels_by_device, plain_utilization, span_of
from tests.profiling.test_step_breakdown import plain_steps, raw_events

TRACES = ("a100_simple_add", "sampled_training_rank0", "triton_driver_launch", "cpu_only")


@pytest.mark.parametrize("name", TRACES)
def test_trace_summary_counts_match_plain_loops(name):
    path = DATA / f"{name}.json.gz"
    events = raw_events(path)
    summary = analyze(load_trace(path)).summary
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert summary["kernel_events"] == len(kernels)
    assert summary["kernel_time_us"] == pytest.approx(sum(e["dur"] for e in kernels))
    assert summary["gpu_activity_events"] == sum(e["cat"] in reference.GPU for e in events)
    steps = plain_steps(events)
    expected_step = sum(end - start for _, start, end in steps) / len(steps) if steps else None
    assert summary["average_step_time_us"] == (pytest.approx(expected_step) if steps else None)
    devices = kernels_by_device(events)
    if len(devices) == 1:  # one GPU: the card's utilisation is that GPU's
        lo, hi = span_of(events)
        (only,) = devices.values()
        assert summary["gpu_utilization_percent"] == pytest.approx(plain_utilization(only, lo, hi))
    elif not devices:
        assert summary["gpu_utilization_percent"] is None


def test_trace_summary_of_our_own_trace_counts_its_forwards(cpu_runs):
    """One of our CPU traces analysed as an upload: its `attn_fwd` windows and the aten ops in them."""
    path = cpu_runs["naive"].trace_path
    summary = analyze(load_trace(path)).summary
    ops = reference.aten_ops_in(path, "attn_fwd")
    assert summary["forwards"] == len(ops) == len(reference.windows(path, "attn_fwd"))
    assert summary["ops_per_forward"] == pytest.approx(sum(map(len, ops)) / len(ops))


def test_trace_summary_leaves_an_empty_list_for_the_insights():
    trace = load_trace(DATA / "a100_simple_add.json.gz")
    summary = trace_summary(trace, None, 0, 0, step_breakdown(trace))
    assert summary["insights"] == [] and summary["forwards"] == 0 and summary["ops_per_forward"] is None


def test_per_window_counts_name_only_what_the_windows_hold():
    # Kernel names are categoricals of every name in the trace: one not in a window is not counted at 0.
    names = pd.Series(pd.Categorical(["k1", "k1", "k2"], categories=["k0", "k1", "k2", "k3"]))
    assert per_window_counts(names, 2) == {"k1": 1.0, "k2": 0.5}
    assert per_window_counts(names, 0) == {}
