"""The API for agents: an MCP client against the real app served as the Space `owner/attention-profiler`.

It lists the tools (names, descriptions, integer ranges, enums), calls the compact endpoints over MCP,
gradio_client and plain HTTP, and checks their JSON (under 20 kB, also on the shared GPU traces) against
the full endpoints and against plain counts over the trace files.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from endpoints.compact import MAX_RESULT_BYTES
from tests.conftest import DATA, _free_port
from tests.timing_slack import slack

SPACE = "owner/attention-profiler"
PREFIX = "attention_profiler_"  # Gradio's MCP server names a Space's tools `<space name>_<function name>`
COMPACT = ("profile_summary", "compare_summary", "analyze_summary")
ORIGINALS = ("profile", "compare", "sweep", "analyze", "analyze_job", "diff_traces", "diff", "share")
SHAPE = dict(batch=1, heads=2, seq_len=64, head_dim=32, dtype="float32", device="cpu", compile=False)
INTEGERS = {
    "batch": (1, 512),
    "heads": (1, 256),
    "seq_len": (1, 131_072),
    "head_dim": (1, 512),
    "kv_heads": (0, 256),
    "q_len": (0, 131_072),
    "window": (0, 131_072),
}
SHARED_GPU = Path("/work/shared/traces/gpu")
GPU_TRACES = sorted({p.name: p for p in [*SHARED_GPU.glob("*.json.gz"), *(DATA / "gpu").glob("*.json.gz")]}.values())
SMALL_GPU_TRACE = DATA / "gpu" / "h100_nn-mha_fp32.json.gz"


@pytest.fixture(scope="module")
def space_app() -> Iterator[tuple[Any, str]]:
    """The app served as the Space SPACE: Gradio reads `SYSTEM=spaces` and `SPACE_ID` when it starts the
    MCP server, at launch.

    It is built without them: with SPACE_ID the page adds the Hub login button, whose OAuth routes need
    gradio[oauth] and a Space's OAuth variables, neither here. And Gradio's Spaces hot reloader, which
    needs the `spaces` package, is kept off."""
    import gradio.http_server

    import app

    demo = app.build_demo()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SYSTEM", "spaces")
        patch.setenv("SPACE_ID", SPACE)
        patch.setattr(gradio.http_server, "get_space", lambda: None)
        port = _free_port()
        app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield demo, f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="module")
def space_url(space_app: tuple[Any, str]) -> str:
    return space_app[1]


@pytest.fixture(scope="module")
def space_client(space_url: str) -> Client:
    return Client(space_url, verbose=False)


def mcp(url: str, call: str | None = None, arguments: dict[str, Any] | None = None) -> Any:
    """The tools listed by the app's MCP server, or the result of calling the tool `call`."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def session() -> Any:
        transport = streamablehttp_client(url + "gradio_api/mcp/", timeout=slack(30))
        async with transport as (read, write, _), ClientSession(read, write) as client:
            await client.initialize()
            if call is None:
                return (await client.list_tools()).tools
            return await client.call_tool(call, arguments or {})

    return asyncio.run(session())


@pytest.fixture(scope="module")
def tools(space_url: str) -> dict[str, Any]:
    return {tool.name: tool for tool in mcp(space_url)}


def kernel_oracle(path: Path) -> tuple[int, float]:
    """Kernel events and their summed duration, counted over the raw JSON: complete (`ph` X) events whose
    category is `kernel` in any case (Kineto wrote `Kernel` before 2.0); durations in µs as written."""
    document = json.loads(gzip.decompress(path.read_bytes()))
    events = document["traceEvents"] if isinstance(document, dict) else document
    kernels = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"]
    return len(kernels), sum(float(e.get("dur", 0)) for e in kernels)


def compact_result(text: str) -> dict[str, Any]:
    """A compact endpoint's result: one JSON string, under MAX_RESULT_BYTES, strict JSON (no NaN)."""
    assert isinstance(text, str) and len(text.encode()) < MAX_RESULT_BYTES
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in a compact result"))


def test_tools_are_named_for_the_space_and_say_what_they_return(tools):
    assert {PREFIX + name for name in (*COMPACT, *ORIGINALS)} <= set(tools)
    for name, tool in tools.items():
        assert "Returns" in tool.description, name
    for name in COMPACT:
        description = tools[PREFIX + name].description
        assert "JSON" in description and "20,000 bytes" in description
    for name in ("profile", "compare", "analyze", "diff_traces"):  # the numbers' units, spelled out
        assert any(unit in tools[PREFIX + name].description for unit in (" ms", " µs")), name


@pytest.mark.parametrize("name", ["profile_summary", "compare_summary", "profile", "compare", "sweep"])
def test_integers_are_typed_with_their_ranges_and_device_lists_what_this_machine_accepts(tools, name):
    import torch

    properties = tools[PREFIX + name].inputSchema["properties"]
    for field, (low, high) in INTEGERS.items():
        if field in properties:
            assert (properties[field]["type"], properties[field]["minimum"], properties[field]["maximum"]) == (
                "integer",
                low,
                high,
            ), field
    device = properties["device"]
    assert device["enum"] == (["auto", "cpu", "cuda"] if torch.cuda.is_available() else ["auto", "cpu"])
    assert "GPU" in device["description"] and device["default"] == "auto"


def test_profile_summary_over_mcp_matches_the_full_endpoint(space_url, space_client, tools):
    called = mcp(space_url, PREFIX + "profile_summary", {"variant": "naive", **SHAPE})
    assert not called.isError and len(called.content) == 1
    compact = compact_result(called.content[0].text)
    full, *_, insights = space_client.predict(variant="naive", backend="auto", **SHAPE, api_name="/profile")
    summary = compact["summary"]
    for key in ("kernels_per_forward", "ops_per_forward", "per_forward_ops", "per_forward_kernels", "seq_len"):
        assert summary[key] == full[key], key  # counts are exact between two runs of one spec
    assert "insights" not in summary and "samples" not in summary["forward_ms_stats"]
    # The structural findings agree; timing ones (noise, profiler overhead) may differ between two runs.
    for findings in (compact["findings"], full["findings"]):
        assert {"hidden_copy", "unfused_attention"} <= {f["rule"] for f in findings}
    hidden_copy = next(f for f in compact["findings"] if f["rule"] == "hidden_copy")
    assert hidden_copy["detail"].startswith("aten::clone") and "\\" not in hidden_copy["detail"]  # text, not Markdown
    assert "aten\\:\\:clone" in insights  # the page's output stays escaped
    assert compact["cut"] is None


def test_non_integers_are_refused_naming_the_field_not_rounded(space_client):
    with pytest.raises(AppError, match="^seq_len: must be a whole number"):
        space_client.predict(variant="naive", backend="auto", **{**SHAPE, "seq_len": 64.5}, api_name="/profile_summary")


def test_analyze_summary_over_mcp_takes_a_data_url(space_url):
    trace = "data:application/gzip;base64," + base64.b64encode(SMALL_GPU_TRACE.read_bytes()).decode()
    called = mcp(space_url, PREFIX + "analyze_summary", {"trace": trace})
    assert not called.isError
    summary = compact_result(called.content[0].text)["summary"]
    assert (summary["kernel_events"], summary["kernel_time_us"]) == pytest.approx(kernel_oracle(SMALL_GPU_TRACE))


@pytest.mark.parametrize("path", GPU_TRACES, ids=lambda p: p.name)
def test_analyze_summary_fits_on_every_shared_gpu_trace(space_client, path):
    result = compact_result(space_client.predict(trace=handle_file(path), api_name="/analyze_summary"))
    kernels, kernel_us = kernel_oracle(path)
    assert result["summary"]["kernel_events"] == kernels
    assert result["summary"]["kernel_time_us"] == pytest.approx(kernel_us, rel=1e-9)
    assert result["findings"] and all({"rule", "title", "detail"} <= set(f) for f in result["findings"])


def test_analyze_summary_equals_the_full_summary(space_client):
    full = space_client.predict(trace=handle_file(SMALL_GPU_TRACE), api_name="/analyze")[0]
    compact = compact_result(space_client.predict(trace=handle_file(SMALL_GPU_TRACE), api_name="/analyze_summary"))
    assert compact["cut"] is None
    assert compact["summary"] == {k: v for k, v in full.items() if k not in ("insights", "findings")}
    assert compact["findings"] == [
        {k: f[k] for k in ("rule", "title", "gpu_time_percent", "detail", "evidence")} for f in full["findings"]
    ]


def test_compare_summary_has_every_run(space_client):
    from attention import RUNS

    result = compact_result(space_client.predict(**SHAPE, api_name="/compare_summary"))
    runs = [(r["summary"]["variant"], r["summary"]["backend"]) for r in result["runs"]]
    assert runs == list(RUNS)
    refused = {r["summary"]["backend"] for r in result["runs"] if r["summary"].get("error")}
    assert {"efficient", "cudnn"} <= refused  # CUDA-only backends, with the reason
    assert result["lesson"]


def sse_result(url: str, api_name: str, data: list[Any]) -> tuple[str, Any]:
    """A plain-HTTP call (POST /gradio_api/call, then its server-sent events): the last event and its data."""
    with httpx.Client(base_url=url, timeout=slack(120)) as http:
        event_id = http.post(f"gradio_api/call/{api_name}", json={"data": data}).json()["event_id"]
        lines = http.get(f"gradio_api/call/{api_name}/{event_id}").text.strip().splitlines()
    return lines[-2].removeprefix("event: "), json.loads(lines[-1].removeprefix("data: "))


@pytest.mark.parametrize("value", [str(SMALL_GPU_TRACE), {"path": str(SMALL_GPU_TRACE)}, 7])
def test_a_path_over_plain_http_is_refused_naming_the_field(space_url, value):
    event, data = sse_result(space_url, "analyze_summary", [value])
    assert event == "error" and data["error"].startswith("trace: got ")
    assert "POST /gradio_api/upload" in data["error"]


def test_plain_http_after_an_upload(space_url):
    with httpx.Client(base_url=space_url, timeout=slack(60)) as http, SMALL_GPU_TRACE.open("rb") as file:
        (uploaded,) = http.post("gradio_api/upload", files={"files": file}).json()
    file_data = {"path": uploaded, "meta": {"_type": "gradio.FileData"}}
    event, data = sse_result(space_url, "analyze_summary", [file_data])
    assert event == "complete"
    assert compact_result(data[0])["summary"]["kernel_events"] == kernel_oracle(SMALL_GPU_TRACE)[0]


def test_compact_endpoints_keep_their_originals_queue_concurrency_and_time_limit(space_app):
    demo, _ = space_app
    by_name = {fn.api_name: fn for fn in demo.fns.values() if fn.api_name}
    kept = ("queue", "concurrency_id", "concurrency_limit", "time_limit")
    for compact, original in [
        ("profile_summary", "profile"),
        ("compare_summary", "compare"),
        ("analyze_summary", "analyze"),
    ]:
        assert {k: getattr(by_name[compact], k) for k in kept} == {k: getattr(by_name[original], k) for k in kept}
    assert by_name["profile_summary"].concurrency_id == "device" and by_name["analyze_summary"].concurrency_limit == 2


def test_a_comparison_of_gpu_sized_runs_is_cut_to_fit_and_keeps_the_documented_keys():
    """Eight runs with the largest shared GPU trace's findings (this machine has no GPU to compare on)."""
    from endpoints.compact import compare_json
    from profiling.analysis import analyze_file

    largest = DATA / "gpu" / "b200_vllm_gpt-oss_eager_rank0.json.gz"
    summary = dict(analyze_file(largest, lambda fraction, message: None).summary)
    assert len(json.dumps([summary] * 8)) > 8 * MAX_RESULT_BYTES // 2  # far over the limit whole
    result = compact_result(compare_json([summary] * 8, "lesson"))
    assert result["cut"].startswith(f"left out to fit {MAX_RESULT_BYTES:,} bytes")
    kernels, kernel_us = kernel_oracle(largest)
    for run in result["runs"]:
        assert (run["summary"]["kernel_events"], run["summary"]["kernel_time_us"]) == pytest.approx(
            (kernels, kernel_us)
        )


def test_non_finite_numbers_become_null_and_the_result_stays_strict_json():
    from endpoints.compact import summary_json

    finding = {"rule": "r", "title": "t", "detail": "d", "evidence": {"x": float("nan")}, "gpu_time_percent": None}
    result = compact_result(summary_json({"kernel_time_us": float("inf"), "findings": [finding], "insights": ["t: d"]}))
    assert result["summary"] == {"kernel_time_us": None}
    assert result["findings"] == [{**finding, "evidence": {"x": None}}]
