"""The plugin's step "0" for traces without ProfilerSteps, against a plain reading of its rule.

The rule (torch-tb-profiler 0.4.3, event_parser.py `StepParser._parse_step` and `parse_steps`;
trace.py `EventTypeMap`, `create_trace_event`): from the earliest start to the latest end of the
events typed PYTHON (category `Python`), OPERATOR (`Operator` or `cpu_op`) or PROFILER_STEP (a
`ProfilerStep#` name in either of those or in `user_annotation`). Restated below on the raw JSON.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from profiling.fallback_step import fallback_step
from profiling.trace import load_trace, parse_trace
from tests.conftest import DATA


def _raw(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    document = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return document["traceEvents"] if isinstance(document, dict) else document


def _plugin_span(events: list[dict[str, Any]]) -> tuple[float, float] | None:
    """cpu_min_ts .. cpu_max_ts, read the plugin's way from the raw events."""
    host = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = str(e.get("cat", "")).lower(), str(e.get("name", ""))
        if cat in ("operator", "cpu_op", "python") or (cat == "user_annotation" and name.startswith("ProfilerStep#")):
            host.append(e)
    if not host:
        return None
    return min(e["ts"] for e in host), max(e["ts"] + e["dur"] for e in host)


CASES = [
    DATA / "plugin_cases" / "no_profilerstep.json",  # Operator, Runtime, Kernel: the ops alone
    DATA / "plugin_cases" / "distributed_gloo_gpu_worker0.json",  # cpu_op on three threads
    DATA / "vintages" / "kineto_2021.json",  # 2021 Python and Operator-recorded steps count
    DATA / "vintages" / "kineto_2024.json",  # python_function does not; a user_annotation step does
    DATA / "a100_simple_add.json.gz",  # a real trace without ProfilerSteps, with user annotations
    DATA / "cupti_counters_no_kernels.json.gz",
]


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_step_0_spans_what_the_plugin_counts_as_host_events(path):
    trace = load_trace(path)
    step = fallback_step(trace)
    start, stop = _plugin_span(_raw(path))
    assert len(step) == 1
    row = step.iloc[0]
    assert (row["name"], row["cat"], row["ph"]) == ("0", "user_annotation", "X")
    assert (row["ts"], row["end"], row["dur"]) == (start, stop, stop - start)
    # Shaped as the trace's rows, on the thread of the op it starts with.
    assert list(step.columns) == list(trace.events.columns)
    first = trace.events.loc[step.index[0]]
    assert first["ts"] == start and (row["pid"], row["tid"]) == (first["pid"], first["tid"])
    assert row[["correlation", "external_id", "device"]].isna().all() and row["input_dims"] is None


def test_a_datapipe_recorded_as_an_op_counts():
    # The plugin's test_datapipe: a `cpu_op` the app reads as an annotation is an OPERATOR to the plugin.
    step = fallback_step(load_trace(DATA / "plugin_cases" / "datapipe.json"))
    assert (step.iloc[0]["ts"], step.iloc[0]["end"]) == (100, 123)


def _events(*spec: tuple[str, str, float, float]) -> bytes:
    return json.dumps(
        [{"ph": "X", "cat": c, "name": n, "pid": 1, "tid": 1, "ts": ts, "dur": d} for c, n, ts, d in spec]
    ).encode()


def test_todays_annotations_and_python_functions_do_not_count():
    trace = parse_trace(
        _events(
            ("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 100),
            ("python_function", "nn.Module: Linear", 10, 200),
            ("cpu_op", "aten::mm", 20, 30),
            ("cuda_runtime", "cudaLaunchKernel", 25, 100),
            ("kernel", "gemm", 60, 500),
        )
    )
    step = fallback_step(trace)
    assert (step.iloc[0]["ts"], step.iloc[0]["end"]) == (20, 50)


def test_without_host_ops_there_is_no_step():
    # The plugin's own step here is (maxsize, -maxsize - 1); the app makes none.
    trace = load_trace(DATA / "plugin_cases" / "distributed_nccl_user_annotation.json")
    step = fallback_step(trace)
    assert step.empty and list(step.columns) == list(trace.events.columns)
    assert fallback_step(parse_trace(b"[]")).empty


def test_2021_python_events_count_and_todays_do_not():
    # `Python` was the plugin's PYTHON; `python_function` is PYTHON_FUNCTION, which it leaves out.
    old = fallback_step(parse_trace(_events(("Operator", "aten::mm", 20, 30), ("Python", "train_step", 10, 100))))
    assert (old.iloc[0]["ts"], old.iloc[0]["end"]) == (10, 110)
    both = _events(("cpu_op", "aten::mm", 20, 30), ("Python", "f", 15, 10), ("python_function", "g", 10, 100))
    step = fallback_step(parse_trace(both))  # which rows were `Python` is lost: none counts
    assert (step.iloc[0]["ts"], step.iloc[0]["end"]) == (20, 50)
