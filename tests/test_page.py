"""The page's wiring (issue 20: layout, progress and state, Diff labels), read from the demo's config and
checked against a live server through gradio_client. The browser's view of it is tests/test_browser_page.py."""

from __future__ import annotations

import gzip
import html
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gradio as gr
import pytest

from tests.conftest import ROOT
from tests.timing_slack import slack

SHAPED = {"Profile", "Compare", "Sweep"}  # the tabs whose endpoints take the shape, by their signatures
TINY = dict(batch=2, heads=2, seq_len=32, head_dim=16, dtype="float32", device="cpu", compile=False)


@pytest.fixture(scope="module")
def demo() -> gr.Blocks:
    import app

    return app.build_demo()


@pytest.fixture(scope="module")
def config(demo: gr.Blocks) -> dict[str, Any]:
    return demo.get_config_file()


def _by_elem_id(config: dict[str, Any], elem_id: str) -> dict[str, Any]:
    [found] = [c for c in config["components"] if c["props"].get("elem_id") == elem_id]
    return found


def _node(layout: dict[str, Any], node_id: int) -> dict[str, Any] | None:
    if layout["id"] == node_id:
        return layout
    for child in layout.get("children", []):
        found = _node(child, node_id)
        if found:
            return found
    return None


def _inside(layout: dict[str, Any]) -> set[int]:
    """Every component id at or under `layout`."""
    return {layout["id"]} | {i for child in layout.get("children", []) for i in _inside(child)}


def _under(config: dict[str, Any], node_id: int) -> set[int]:
    node = _node(config["layout"], node_id)
    assert node is not None, node_id
    return _inside(node)


def _first(config: dict[str, Any], dep: dict[str, Any]) -> dict[str, Any]:
    """The event that starts `dep`'s chain (`.then`/`.success` steps point back with `trigger_after`)."""
    deps = config["dependencies"]
    while dep.get("trigger_after") is not None:
        dep = deps[dep["trigger_after"]]
    return dep


def _endpoint(config: dict[str, Any], api_name: str) -> dict[str, Any]:
    [dep] = [d for d in config["dependencies"] if d.get("api_name") == api_name]
    return dep


def _tabs(config: dict[str, Any]) -> dict[str, set[int]]:
    """Each tab's label and the components in it."""
    tabs = _by_elem_id(config, "tabs")
    items = {c["id"]: c for c in config["components"] if c["type"] == "tabitem"}
    children = _node(config["layout"], tabs["id"])["children"]  # type: ignore[index]
    return {items[child["id"]]["props"]["label"]: _inside(child) for child in children}


def test_the_shape_panel_shows_exactly_on_the_tabs_whose_endpoints_read_it(demo, config):
    panel = _under(config, _by_elem_id(config, "shape-panel")["id"])
    tabs = _tabs(config)
    deps = config["dependencies"]
    # A tab uses the panel when an event started from inside it reads one of the panel's controls.
    using = {
        label
        for label, inside in tabs.items()
        for dep in deps
        if set(dep["inputs"]) & panel and any(t[0] in inside for t in _first(config, dep)["targets"])
    }
    assert using == SHAPED
    assert panel.isdisjoint(set().union(*tabs.values()))  # rendered once, above the tabs

    tabs_id = _by_elem_id(config, "tabs")["id"]
    [select] = [d for d in deps if any(tuple(t) == (tabs_id, "select") for t in d["targets"])]
    assert select["outputs"] == [_by_elem_id(config, "shape-panel")["id"]]
    assert select["api_visibility"] == "private"
    rule = demo.fns[select["id"]].fn
    shown = {
        label for i, label in enumerate(tabs) if rule(gr.SelectData(None, {"value": label, "index": i}))["visible"]
    }
    assert shown == using


def _lessons_dataset(config: dict[str, Any]) -> dict[str, Any]:
    [dataset] = [c for c in config["components"] if c["type"] == "dataset" and c["props"]["headers"][-1:] == ["lesson"]]
    return dataset


def test_every_example_has_its_lesson(config):
    from ui.profile_tab import EXAMPLE_INPUTS

    dataset = _lessons_dataset(config)
    assert len(dataset["props"]["headers"]) == len(EXAMPLE_INPUTS) + 1
    lesson_box = _by_elem_id(config, "lesson")
    assert lesson_box["props"]["interactive"] is False  # read-only: it says what the example teaches
    rows = dataset["props"]["samples"]
    lessons = [row[-1] for row in rows]
    assert all(lessons) and len(set(lessons)) == len(lessons)
    _check_lessons_match_their_rows([dict(zip(EXAMPLE_INPUTS, row[:-1], strict=True)) for row in rows], lessons)


def test_the_gpu_lessons_match_their_rows():
    from ui.profile_tab import BLOG_EXAMPLES, BLOG_LESSONS, EXAMPLE_INPUTS

    assert len(BLOG_LESSONS) == len(BLOG_EXAMPLES) and len(set(BLOG_LESSONS)) == len(BLOG_LESSONS)
    _check_lessons_match_their_rows(
        [dict(zip(EXAMPLE_INPUTS, row, strict=True)) for row in BLOG_EXAMPLES], BLOG_LESSONS
    )


def _check_lessons_match_their_rows(rows: list[dict[str, Any]], lessons: list[str]) -> None:
    """A lesson names what its row changes: a row out of step with its lesson is caught here."""
    for row, lesson in zip(rows, lessons, strict=True):
        text = lesson.lower()
        if row["mode"] == "training":
            assert "training" in text, (row, lesson)
        if row["q_len"] == 1:
            assert "decode" in text, (row, lesson)
        elif row["kv_heads"]:
            assert "gqa" in text, (row, lesson)
        if row["mask"] != "causal":
            assert row["mask"].replace("_", " ") in text or row["mask"] in text, (row, lesson)
        if row["variant"] in ("naive", "inplace") and row["mode"] == "inference" and not row["kv_heads"]:
            assert "masked_fill" in text, (row, lesson)
        if row["variant"] == "sdpa" and row["backend"] != "auto" and row["mode"] == "inference" and not row["kv_heads"]:
            assert {"math": "math", "flash": "fused", "efficient": "fused", "cudnn": "fused"}[
                row["backend"]
            ] in text or (row["backend"] in text), (row, lesson)


def _sample_files(config: dict[str, Any]) -> list[str]:
    upload = _by_elem_id(config, "upload")["id"]
    [dataset] = [c for c in config["components"] if c["type"] == "dataset" and c["props"]["component_ids"] == [upload]]
    return [Path(row[0] if isinstance(row[0], str) else row[0]["path"]).name for row in dataset["props"]["samples"]]


def test_analyze_offers_two_samples_each_beside_its_licence(config):
    names = _sample_files(config)
    assert len(names) == 2 and any("resnet50" in n for n in names)
    readme = (ROOT / "samples" / "README.md").read_text(encoding="utf-8")
    for name in names:
        path = ROOT / "samples" / name
        assert path.read_bytes()[:2] == b"\x1f\x8b" and path.stat().st_size < 2 * 1024**2  # small, gzipped
        row = next(line for line in readme.splitlines() if f"`{name}`" in line)
        licences = re.findall(r"`(LICENSE-[\w-]+)`", row)
        assert licences and all((ROOT / "samples" / licence).is_file() for licence in licences)


def _plain_kernels(path: Path) -> tuple[int, float]:
    """Count and Σ dur of the complete kernel events, read with plain json (both category spellings)."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    kernels = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"]
    return len(kernels), sum(float(e["dur"]) for e in kernels)


@pytest.mark.parametrize("name", ["h100_bert-small_sdpa-flash.json.gz", "resnet50_num_workers_4.pt.trace.json.gz"])
def test_a_sample_analyzes_without_error(client, name):
    from gradio_client import handle_file

    path = ROOT / "samples" / name
    summary, *_, insights, _steps_chart = client.predict(handle_file(str(path)), api_name="/analyze")
    count, total_us = _plain_kernels(path)
    assert summary["kernel_events"] == count > 0
    assert summary["kernel_time_us"] == pytest.approx(total_us, rel=1e-6)
    assert insights.startswith("- **")


@pytest.fixture(scope="module")
def window_and_padding(client) -> tuple[dict, dict]:
    """Two tiny real runs that the old labels could not tell apart: a sliding window and a padding mask."""
    common = dict(variant="sdpa", backend="auto", **TINY)
    window = client.predict(**common, mask="sliding_window", window=8, api_name="/profile")[0]
    padding = client.predict(**common, mask="padding", valid_len="20,32", api_name="/profile")[0]
    return window, padding


def test_diff_labels_tell_a_window_run_from_a_padding_run(window_and_padding):
    from ui.diff_tab import remember, run_labels

    history = remember(remember([], window_and_padding[0]), window_and_padding[1])
    first, second = run_labels(history)
    assert first != second
    assert "mask=sliding_window" in first and "window=8" in first and "valid_len" not in first
    assert "mask=padding" in second and "valid_len=20,32" in second and "window" not in second
    for label in (first, second):
        assert re.search(r" · \d\d:\d\d:\d\d UTC$", label)
        assert "batch=" not in label and "dtype=" not in label  # the same in both runs: no noise


@pytest.mark.parametrize(
    "field, before, after",
    [
        ("mode", "inference", "training"),
        ("mask", "causal", "none"),
        ("q_len", 32, 1),
        ("kv_heads", 2, 1),
        ("batch", 1, 2),
        ("dtype", "float32", "bfloat16"),
        ("seq_len", 32, 64),
    ],
)
def test_a_label_shows_each_field_that_differs(field, before, after):
    from ui.diff_tab import run_labels

    run = {"variant": "sdpa", "backend": "auto", **TINY, "mode": "inference", "kv_heads": 2, "q_len": 32}
    run |= {"mask": "causal", "window": 0, "valid_len": []}
    labels = run_labels([{**run, field: before}, {**run, field: after}])
    assert labels == [f"1. sdpa-auto · {field}={before}", f"2. sdpa-auto · {field}={after}"]


def test_a_label_shows_the_backend_that_differs():
    from ui.diff_tab import run_labels

    run = {"variant": "sdpa", **TINY}
    assert run_labels([{**run, "backend": "math"}, {**run, "backend": "flash"}]) == ["1. sdpa-math", "2. sdpa-flash"]


def test_the_cli_command_repeats_the_run(window_and_padding, tmp_path):
    from profiling.__main__ import build_parser, spec_from_args
    from profiling.summary import RUN_FIELDS
    from ui.diff_tab import cli_command

    for summary in window_and_padding:
        words = shlex.split(cli_command(summary))
        assert words[:4] == ["python", "-m", "profiling", "run"]
        args = build_parser().parse_args(words[3:])
        spec = spec_from_args(args, variant=args.variant, backend=args.backend).as_dict()
        assert {f: spec[f] for f in RUN_FIELDS} == {f: summary[f] for f in RUN_FIELDS}

    # Pasted as written (with this interpreter), it runs, and finds what the app found.
    padding = window_and_padding[1]
    command = [sys.executable, *shlex.split(cli_command(padding))[1:], "--trace-dir", str(tmp_path), "--json"]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=slack(300))
    assert out.returncode == 0, out.stderr[-2000:]
    printed = json.loads(out.stdout[out.stdout.index("{") :])
    assert printed["kernels_per_forward"] == padding["kernels_per_forward"]
    assert printed["valid_len"] == [20, 32] and printed["mask"] == "padding"


def test_the_diff_result_offers_both_commands(window_and_padding):
    from ui.diff_tab import _diff_picked, cli_command, remember

    history = remember(remember([], window_and_padding[0]), window_and_padding[1])
    table, commands = _diff_picked(history, 0, 1)
    assert commands.splitlines() == ["# before", cli_command(history[0]), "# after", cli_command(history[1])]
    assert len(table) > 0


def test_each_profile_and_analyze_click_first_clears_what_it_shows(demo, config):
    deps = config["dependencies"]
    handlers = [_endpoint(config, "profile"), _endpoint(config, "analyze")]
    # The samples run /analyze's function too, privately, behind the same first step.
    handlers += [d for d in deps if demo.fns[d["id"]].fn is demo.fns[handlers[1]["id"]].fn and d not in handlers]
    assert len(handlers) == 3
    for handler in handlers:
        clear = deps[handler["trigger_after"]]
        assert not handler["trigger_only_on_success"]  # the handler runs whatever the clearing did
        assert clear["api_visibility"] == "private" and clear["inputs"] == []
        values = demo.fns[clear["id"]].fn()
        assert all(v == {"__type__": "update", "value": None} for v in values)
        # Everything the run shows, its outputs and what its follow-ups draw from them, was emptied first.
        shown = set(handler["outputs"])
        shown |= {o for d in deps if d.get("trigger_after") == handler["id"] for o in d["outputs"]}
        states = {c["id"] for c in config["components"] if c["type"] == "state"}
        assert shown - states <= set(clear["outputs"]), "a result that a failed run would leave on screen"


def test_analyze_shows_its_progress_where_its_results_appear(config):
    handler = _endpoint(config, "analyze")
    overview = {_by_elem_id(config, e)["id"] for e in ("gpu-card", "idle-chart", "breakdown-chart", "analyze-insights")}
    assert overview <= set(handler["show_progress_on"])
    profile = _endpoint(config, "profile")
    assert _by_elem_id(config, "metric-cards")["id"] in profile["show_progress_on"]


def test_output_files_are_not_drop_zones(config):
    outputs = {o for d in config["dependencies"] if d.get("api_name") in ("profile",) for o in d["outputs"]}
    files = [c for c in config["components"] if c["type"] == "file" and c["id"] in outputs]
    assert len(files) == 2 and all(c["props"]["interactive"] is False for c in files)


PROGRESS = re.compile(
    r"^(?P<stage>.+) · (?P<elapsed>\d+) s(?: of about (?:\d+ s|< 1 s)| \(estimated (?:\d+ s|< 1 s)\))$"
)


def _stage(message: str) -> str:
    return message.split(":")[0].removesuffix(" (compiling)")  # "reading the trace: 1.2 MiB of 3.4 MiB"


def test_profile_shows_the_stage_the_time_and_the_estimate(client, tmp_path):
    """Every update the client receives names a stage, the time and the estimate, in the run's own order.

    Gradio sends the latest progress of a job at most every 0.1 s, so a fast run shows only some of its
    stages: which ones depends on the machine's speed, and is not asserted. Each one shown must be a stage
    that the same run, profiled here, reports, and they must come in its order.
    """
    from attention import AttentionSpec
    from profiling.pipeline import profile_attention
    from profiling.progress_text import FIRST_STAGE

    reported: list[str] = [FIRST_STAGE]  # the stopwatch's stage before the run reports one
    profile_attention(AttentionSpec(variant="naive", backend="auto", **TINY), tmp_path, lambda f, m: reported.append(m))
    order = list(dict.fromkeys(_stage(m) for m in reported))
    started = time.monotonic()
    job = client.submit("naive", "auto", *TINY.values(), api_name="/profile")
    job.result(timeout=slack(120))
    wall_s = time.monotonic() - started
    updates = job.communicator.updates  # every status update the client received, in order
    seen = []
    while not updates.empty():
        update = updates.get_nowait()
        for unit in getattr(update, "progress_data", None) or []:
            if unit.desc and (not seen or seen[-1] != unit.desc):
                seen.append(unit.desc)
    matched = [PROGRESS.match(desc) for desc in seen]
    assert seen and all(matched), seen
    stages = [_stage(m["stage"]) for m in matched if m]
    assert set(stages) <= set(order), (stages, order)
    positions = [order.index(stage) for stage in stages]
    assert positions == sorted(positions), (stages, order)
    elapsed = [int(m["elapsed"]) for m in matched if m]
    assert elapsed == sorted(elapsed) and elapsed[-1] <= wall_s + 1


def test_the_page_gets_its_stylesheet(app_url):
    import httpx

    css = httpx.get(f"{app_url}config", timeout=slack(30)).json()["css"]
    assert re.search(r"#metric-cards \.metric-cards \{[^}]*display: grid", css)
    assert "@media (max-width: 640px)" in css


def test_metric_cards_are_a_grid_of_escaped_text():
    from profiling.markdown import metric_cards

    hostile = "<img src=x onerror=alert(1)>\n**bold**"
    text = metric_cards({"backend_used": hostile, "kernels_per_forward": 6, "mode": "training"})
    cards = re.findall(r'<dt class="metric-label">(.*?)</dt><dd class="metric-value">(.*?)</dd>', text)
    assert text.startswith('<dl class="metric-cards">') and "<table" not in text and "|" not in text.split("\n")[0]
    assert len(cards) == 8  # training adds backward and saved for backward to the six
    shown = {html.unescape(k): html.unescape(v) for k, v in cards}
    assert shown["backend used"] == "<img src=x onerror=alert(1)> **bold**" and shown["kernels / forward"] == "6"
    assert "<img" not in text


def test_progress_lines():
    from profiling.progress_text import progress_line

    assert progress_line("warm-up", 12.4, 40.2) == "warm-up · 12 s of about 40 s"
    assert progress_line("warm-up", 52, 40) == "warm-up · 52 s (estimated 40 s)"
    assert progress_line("warm-up", 0.2, 0.4) == "warm-up · 0 s of about < 1 s"
    assert progress_line("reading", 3, None) == "reading · 3 s"


def test_the_stopwatch_repeats_the_stage_with_the_time_brought_up_to_date():
    from profiling.progress_text import Stopwatch, refreshed

    now = [100.0]
    sent: list[tuple[float, str]] = []
    watch = Stopwatch(lambda f, m: sent.append((f, m)), 30.0, clock=lambda: now[0])

    def run():
        watch(0.25, "warm-up")
        now[0] += 2
        yield "tick"
        now[0] += 3
        yield "tick"
        return "result"

    steps = refreshed(run(), watch.refresh)
    assert list(_drain(steps)) == ["tick", "tick", ("returned", "result")]
    assert sent == [
        (0.0, "starting · 0 s of about 30 s"),  # before the first stage
        (0.25, "warm-up · 0 s of about 30 s"),
        (0.25, "warm-up · 2 s of about 30 s"),  # after the first tick: the page shows it again
        (0.25, "warm-up · 5 s of about 30 s"),
    ]


def _drain(steps):
    try:
        while True:
            yield next(steps)
    except StopIteration as done:
        yield ("returned", done.value)


def test_closing_the_refreshed_steps_closes_the_run():
    """A client that leaves closes the handler's generator: the run under it must be closed too."""
    from profiling.progress_text import refreshed

    closed = []

    def run():
        try:
            while True:
                yield "tick"
        finally:
            closed.append(True)

    steps = refreshed(run(), lambda: None)
    assert next(steps) == "tick"
    steps.close()
    assert closed == [True]
