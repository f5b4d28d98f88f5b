"""Figures are bounded, say what they merged, and show CPU and GPU lanes."""

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from profiling.analysis import analyze
from profiling.charts import compare_chart, sweep_chart, timeline
from profiling.trace import load_trace, parse_trace
from tests.conftest import DATA


def lanes(fig):
    return list(fig.layout.yaxis.ticktext)


def test_our_run_has_cpu_lanes_and_zooms_to_the_first_forward(cpu_runs):
    result = cpu_runs["naive"]
    fig = timeline(result.analysis)
    assert any(re.fullmatch(r"thread \d+ \(.+\)", lane) for lane in lanes(fig))  # torch's name for the thread
    first = result.trace.complete.query("name == 'attn_fwd'").sort_values("ts").iloc[0]
    start, stop = fig.layout.xaxis.range
    assert stop - start < 1.2 * first["dur"] / 1e3
    drawable = result.trace.complete.query("name != '' and cat != 'Trace'")
    assert sum(len(t.x) for t in fig.data) == len(drawable)  # a small trace is drawn whole, nothing merged


def test_gpu_trace_has_stream_lanes_and_kernel_hover():
    fig = timeline(analyze(load_trace(DATA / "a100_simple_add.json.gz")))
    assert any(lane.startswith("GPU 0 · stream") for lane in lanes(fig))
    assert not any(lane in ("CPU thread 7", "CPU thread 20") for lane in lanes(fig))  # device syncs sit on GPU lanes
    kernel = next(t for t in fig.data if t.name == "kernel")
    assert any("regs/thread" in h and "occupancy" in h for h in kernel.hovertext)


def test_large_trace_is_merged_and_says_so():
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "ts": i * 2.0, "dur": 1.0, "pid": 1, "tid": 1}
        for i in range(30_000)
    ]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    fig = timeline(analyze(trace), max_bars=2000)
    bars = sum(len(t.x) for t in fig.data)
    assert bars <= 2000
    assert "merged into" in fig.layout.title.text
    assert len(fig.to_json()) < 3_000_000


def test_compare_and_sweep_charts():
    rows = [
        {
            "variant": "naive",
            "backend": "auto",
            "forward_cpu_ms": 2.0,
            "kernels_per_forward": 6,
            "peak_memory_bytes": 2**20,
        },
        {"variant": "sdpa", "backend": "cudnn", "error": "only on CUDA"},
    ]
    fig = compare_chart(rows)
    assert [list(t.y) for t in fig.data] == [["naive", "sdpa-cudnn"]] * 3  # the run that could not run keeps its row
    assert [list(t.x) for t in fig.data] == [[1.0, None], [6, None], [1.0, None]]  # ×naive, kernels, MiB
    assert "2.000 ms" in fig.data[0].hovertext[0] and "only on CUDA" in fig.data[0].hovertext[1]
    points = pd.DataFrame(
        [
            {"run": "naive", "seq_len": 128, "status": "ok", "forward_ms": 1.0, "peak_memory_bytes": 10},
            {"run": "naive", "seq_len": 256, "status": "ok", "forward_ms": 4.0, "peak_memory_bytes": 40},
            {
                "run": "naive",
                "seq_len": 512,
                "status": "stopped",
                "reason": "too big",
                "forward_ms": None,
                "peak_memory_bytes": None,
            },
        ]
    ).to_dict("records")
    fig = sweep_chart(points)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    guide = next(t for t in fig.data if t.name == "O(S²)")
    assert list(guide.y) == pytest.approx([1.0, 4.0, 16.0])
    assert any(t.name == "naive stopped" for t in fig.data)


def test_step_chart_from_a_real_trace():
    from profiling.analysis import analyze_file
    from profiling.charts import window_chart

    fig = window_chart(analyze_file(DATA / "sampled_training_rank0.json.gz").steps)
    assert [t.name for t in fig.data] == ["cpu (ms)", "device (ms)"] and len(fig.data[0].x) == 2
    fallback = window_chart(analyze_file(DATA / "a100_simple_add.json.gz").steps)  # the plugin's step "0"
    assert [list(t.x) for t in fallback.data] == [["0"], ["0"]]
    events = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 5, "pid": 0, "tid": 7}]
    assert "No ProfilerStep" in window_chart(analyze(parse_trace(json.dumps(events).encode())).steps).layout.title.text


def test_first_window_zoom_keeps_its_gpu_work_in_view():
    # A forward whose kernel runs after the window closes, as in our CUDA runs (they sync after it).
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "attn_fwd", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 2,
            "dur": 3,
            "pid": 1,
            "tid": 1,
            "args": {"correlation": 7},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "flash_fwd_kernel",
            "ts": 6,
            "dur": 94,
            "pid": 0,
            "tid": 7,
            "args": {"correlation": 7, "device": 0, "stream": 7},
        },
        {"ph": "X", "cat": "user_annotation", "name": "attn_fwd", "ts": 200, "dur": 10, "pid": 1, "tid": 1},
    ]
    fig = timeline(analyze(parse_trace(json.dumps({"traceEvents": events}).encode())))
    start, stop = fig.layout.xaxis.range
    assert start < 0 < 0.1 <= stop < 0.2  # ms: the first forward and its kernel, not the second forward


def test_forwards_are_shaded_and_steps_marked_where_the_trace_has_them(cpu_runs):
    """One shaded rectangle per forward and one line per profiler step, at their own times."""
    result = cpu_runs["naive"]
    raw = [e for e in json.loads(result.trace_path.read_text())["traceEvents"] if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in raw if e.get("name") and e.get("cat") != "Trace")
    forwards = sorted(e["ts"] for e in raw if e.get("name") == "attn_fwd")
    steps = sorted(e["ts"] for e in raw if str(e.get("name")).startswith("ProfilerStep#"))
    fig = timeline(result.analysis)
    rects = sorted(s.x0 for s in fig.layout.shapes if s.type == "rect")
    lines = sorted(s.x0 for s in fig.layout.shapes if s.type == "line")
    assert rects == pytest.approx([(ts - t0) / 1e3 for ts in forwards])
    assert lines == pytest.approx([(ts - t0) / 1e3 for ts in steps])
    assert len(rects) == 3 and len(lines) == 3


def test_timeline_bars_are_the_events_at_their_times(cpu_runs):
    """Every drawn bar starts and lasts as its event does (a small trace is drawn whole)."""
    result = cpu_runs["inplace"]
    raw = [
        e
        for e in json.loads(result.trace_path.read_text())["traceEvents"]
        if e.get("ph") == "X" and e.get("name") and e.get("cat") != "Trace"
    ]
    t0 = min(e["ts"] for e in raw)
    fig = timeline(result.analysis)
    drawn = sorted(b for t in fig.data for b in t.base)
    assert drawn == pytest.approx(sorted((e["ts"] - t0) / 1e3 for e in raw), abs=1e-4)
    ops = next(t for t in fig.data if t.name == "cpu_op")
    assert len(ops.x) == sum(e["cat"] == "cpu_op" for e in raw)


def test_hover_shows_cpp_names_escaped_not_as_markup():
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "foo<float>", "ts": 0, "dur": 5, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": '<img src="http://x/y.png">', "ts": 6, "dur": 5, "pid": 1, "tid": 1},
    ]
    fig = timeline(analyze(parse_trace(json.dumps({"traceEvents": events}).encode())))
    hover = " ".join(fig.data[0].hovertext)
    assert "foo&lt;float&gt;" in hover and "<img" not in hover and "&lt;img" in hover


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")
def test_the_timeline_legend_never_covers_the_title_on_a_phone(tmp_path):
    """Drawn by plotly.js in headless Chromium at 390 and 1400 px: the category legend sits below the x axis,
    clear of the title and its notes, and neither runs past the page's width."""
    import plotly
    from playwright.sync_api import sync_playwright

    fig = timeline(analyze(load_trace(DATA / "gpu" / "h100_qwen1.5-0.5b_prefill.json.gz")), max_bars=2000)
    assert "merged into" in fig.layout.title.text  # a title with its note: the longest it gets
    script = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text()
    page = tmp_path / "timeline.html"
    page.write_text(
        f"<!doctype html><meta charset=utf-8><body style='margin:0'><div id=p></div><script>{script}</script>"
        f"<script>const f = {fig.to_json()}; Plotly.newPlot('p', f.data, f.layout, {{responsive: true}});</script>"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless=new", "--no-sandbox", "--disable-gpu"])
        try:
            for width in (390, 1400):
                view = browser.new_page(viewport={"width": width, "height": 900})
                view.goto(page.as_uri())
                view.locator(".legend").first.wait_for()
                title, legend, axis = (view.locator(s).first.bounding_box() for s in (".gtitle", ".legend", ".xtitle"))
                assert legend["y"] >= axis["y"] + axis["height"], (width, legend, axis)  # below the plot
                assert title["y"] + title["height"] <= legend["y"], (width, title, legend)
                for box in (title, legend):
                    assert box["x"] >= 0 and box["x"] + box["width"] <= width, (width, box)
                view.close()
        finally:
            browser.close()
