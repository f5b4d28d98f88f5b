"""/trace_views through a real Gradio server and gradio_client, uploading real traces, against plain readings
of their JSON (and torch's own key_averages for the memory trace)."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from tests.conftest import DATA

CPU_MEMORY = DATA / "cpu_memory" / "mlp_cpu_memory.json.gz"
CPU_MODULES = DATA / "cpu_modules" / "seq_linear_with_stack.json.gz"
MHA = DATA / "gpu" / "h100_nn-mha_fp32.json.gz"


def raw(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def array(value: list | dict) -> np.ndarray:
    """A plotly JSON array: a list, or the typed binary form plotly writes for numpy arrays."""
    if isinstance(value, dict):
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
    return np.asarray(value)


def trace_views(client, path: Path, name: str) -> tuple:
    return client.predict(handle_file(str(path)), name, api_name="/trace_views")


def test_the_page_offers_every_registered_view():
    from profiling.views import VIEWS
    from ui.views_box import VIEW_NAMES

    assert tuple(VIEWS) == VIEW_NAMES


def test_memory_view_over_the_api(client):
    table, chart, note, found = trace_views(client, CPU_MEMORY, "memory")
    averages = json.loads((DATA / "cpu_memory" / "key_averages.json").read_text())["key_averages"]
    rows = {row["name"]: row for row in found["table"]}
    for name, figures in averages.items():
        if name != "[memory]":
            assert rows[name]["self increase (B)"] == figures["self_cpu_memory_usage"], name
    assert table["headers"] == found["columns"] and len(table["data"]) == found["shown"] == found["rows"]
    peak = max(e["args"]["Total Allocated"] for e in raw(CPU_MEMORY) if e.get("name") == "[memory]")
    assert found["chart"]["peaks"][0]["peak allocated (B)"] == peak == 91208
    assert f"Peak allocated: CPU {peak / 1024:.1f} KiB" in note.replace("\\", "")  # Markdown-escaped punctuation
    lines = [t for t in json.loads(chart["plot"])["data"] if t["mode"] == "lines"]
    assert max(array(t["y"]).max() for t in lines) == peak / 2**20
    assert json.dumps(found, allow_nan=False)


def test_modules_and_kernels_of_a_gpu_trace(client):
    events = raw(MHA)
    _, chart, _, found = trace_views(client, MHA, "modules")
    modules = [e for e in events if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")]
    assert sum(row["calls"] for row in found["table"]) == len(modules) == 33
    assert chart is None
    root = next(r for r in found["table"] if r["module path"] == "SimpleTransformerLayer_0")
    assert root["host total (us)"] == sum(e["dur"] for e in modules if e["name"].endswith("SimpleTransformerLayer_0"))
    _, _, _, kernels = trace_views(client, MHA, "kernels by launch")
    assert sum(row["calls"] for row in kernels["table"]) == sum(1 for e in events if e.get("cat") == "kernel") == 48


def test_unknown_device_time_is_null_not_nan(client):
    """A CPU trace's modules: no GPU activity, so device time is unknown: null in the JSON and the table."""
    table, _, note, found = trace_views(client, CPU_MODULES, "modules")
    assert [row["calls"] for row in found["table"]] == [3, 3, 3]
    assert all(row["device total (us)"] is None for row in found["table"])
    column = table["headers"].index("device total (us)")
    assert all(row[column] in (None, "", "NaN") for row in table["data"]) and "unknown" in note


def test_a_trace_without_memory_events_says_why(client):
    table, chart, note, found = trace_views(client, CPU_MODULES, "memory")
    assert found["rows"] == 0 and found["table"] == [] and found["chart"] is None and chart is None
    assert "profile_memory=True" in note.replace("\\", "") and table["data"] in ([], [[]])
    assert not any(e.get("name") == "[memory]" for e in raw(CPU_MODULES))


def test_bad_inputs_name_their_field(client, tmp_path):
    with pytest.raises(AppError, match="^view:"):
        trace_views(client, CPU_MEMORY, "flame graph")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(AppError, match="^trace:"):
        trace_views(client, bad, "memory")
