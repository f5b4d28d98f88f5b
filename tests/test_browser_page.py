"""The page as a reader sees it, in Debian's headless Chromium at 1400 px and at 390 px (issue 20's "Done when").

Every tab is opened on a laptop and on a phone. A real tiny CPU run and a real GPU trace fill the results;
each figure the page shows is checked against a plain loop over the trace's own JSON. "Open in Perfetto"
posts to a local stub that speaks Perfetto's PING/PONG protocol, served here, with the browser's pop-up
blocker left on (Playwright turns it off by default), so the tab must open inside the click.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import socket
import threading
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.conftest import DATA, ROOT
from tests.test_browser import CHROMIUM, FLAGS
from tests.timing_slack import slack

pytestmark = pytest.mark.browser

TABS = ("Profile", "Compare", "Diff", "Sweep", "Analyze a trace")
SHAPE_TABS = {"Profile", "Compare", "Sweep"}  # the tabs whose endpoints take the shape controls
LAPTOP, PHONE = {"width": 1400, "height": 1000}, {"width": 390, "height": 844}
GPU_TRACE = DATA / "a100_simple_add.json.gz"
SCREENSHOT = ROOT / "docs" / "screenshot.png"
SCREENSHOT_HEIGHT = 1400  # px of the Profile tab, from the top: the header, tabs, cards, insights and timeline
SCREENSHOT_BYTES = 300_000
RUN_S = slack(240)  # one tiny CPU profile on a loaded 2-core machine, with margin
PAGE_S = slack(60)

# Perfetto's side of the protocol, as perfetto.dev/docs/visualization/deep-linking-to-perfetto-ui describes
# it. The listener starts late on purpose: a page that posted once, without waiting for PONG, loses it.
STUB = """<!doctype html><meta charset="utf-8"><title>Perfetto stub</title><script>
window.pings = 0; window.received = [];
setTimeout(() => window.addEventListener("message", (event) => {
  if (event.data === "PING") { window.pings += 1; event.source.postMessage("PONG", "*"); return; }
  const posted = event.data && event.data.perfetto;
  if (!posted) return;
  window.received.push({bytes: posted.buffer.byteLength, isBuffer: posted.buffer instanceof ArrayBuffer,
                        title: posted.title, fileName: posted.fileName, origin: event.origin});
}), 500);
</script>"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    """The stand-in for ui.perfetto.dev, on its own origin (another port of 127.0.0.1)."""
    body = STUB.encode()

    class Stub(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # keep the test output quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def page_url(stub_url: str) -> Iterator[str]:
    """The real app, built while ATTENTION_PROFILER_PERFETTO_URL names the stub (the URL is read at build)."""
    import app
    from ui.perfetto import URL_ENV

    with pytest.MonkeyPatch.context() as env:
        env.setenv(URL_ENV, stub_url)
        env.setenv("ATTENTION_PROFILER_PENDING_PER_CLIENT", "64")
        demo = app.build_demo()
    port = _free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with sync_playwright() as p:
        # Playwright passes --disable-popup-blocking; a reader's browser blocks pop-ups, so this one does too.
        launched = p.chromium.launch(
            executable_path=CHROMIUM, args=FLAGS, ignore_default_args=["--disable-popup-blocking"]
        )
        yield launched
        launched.close()


COLLAPSED = """() => {
    const toggle = document.querySelector("#shape-panel .label-wrap");
    return toggle && !toggle.classList.contains("open");
}"""


def _open(browser: Any, url: str, viewport: dict[str, int]) -> Any:
    phone = viewport["width"] < 600
    context = browser.new_context(viewport=viewport, is_mobile=phone, has_touch=phone, device_scale_factor=1)
    page = context.new_page()
    page.goto(url, wait_until="domcontentloaded")
    page.get_by_role("button", name="Profile", exact=True).wait_for(timeout=PAGE_S * 1000)
    if phone:  # the page's load step closes the shape panel on a phone; it runs after the first paint
        with contextlib.suppress(PlaywrightTimeout):  # if it never does, the layout test says what it sees
            page.wait_for_function(COLLAPSED, timeout=PAGE_S * 1000)
    return page


@pytest.fixture(scope="module")
def laptop(browser: Any, page_url: str) -> Iterator[Any]:
    page = _open(browser, page_url, LAPTOP)
    yield page
    page.context.close()


@pytest.fixture(scope="module")
def profiled(laptop: Any) -> Any:
    """The laptop page after one tiny CPU run of the defaults (the CPU preset, naive attention)."""
    _open_tab(laptop, "Profile")
    laptop.get_by_role("button", name="Profile", exact=True).click()
    laptop.locator("#trace-file a[download]").first.wait_for(timeout=RUN_S * 1000)
    laptop.locator("#timeline .js-plotly-plot").first.wait_for(timeout=PAGE_S * 1000)
    return laptop


def _open_tab(page: Any, name: str) -> None:
    """Select a tab, through the "More tabs" menu when a narrow page folds it away."""
    tab = page.get_by_role("tab", name=name, exact=True)
    if tab.count() and tab.first.is_visible():
        tab.first.click()
    else:
        page.get_by_role("button", name="More tabs").click()
        page.locator(".overflow-dropdown button", has_text=name).first.click()
    page.get_by_role("tab", name=name, exact=True, selected=True).wait_for(timeout=10_000)
    page.wait_for_timeout(300)  # the select event's visibility updates


def _overflow(page: Any) -> int:
    """Pixels the page is wider than the window (the reader would scroll sideways), 0 when it fits."""
    return page.evaluate("() => Math.max(0, document.scrollingElement.scrollWidth - window.innerWidth)")


def _figure(page: Any, elem_id: str) -> dict[str, Any]:
    """The plotly figure drawn in `#elem_id`, as plotly resolved it (every trace's final colours)."""
    plot = page.locator(f"#{elem_id} .js-plotly-plot").first
    plot.wait_for(timeout=PAGE_S * 1000)
    return plot.evaluate(
        """(el) => ({
        layout: {yaxis: {ticktext: (el._fullLayout.yaxis || {}).ticktext || null}},
        legend: [...el.querySelectorAll(".legend .legendtext")].map((t) => t.textContent),
        data: el._fullData.map((t) => ({
            name: t.name, legendgroup: t.legendgroup, showlegend: t.showlegend, visible: t.visible,
            colors: [t.line && t.line.color, t.marker && t.marker.color].flat().filter((c) => typeof c === "string"),
        })),
    })"""
    )


def _shown_text(locator: Any) -> str:
    """A component's own text, without the "Error" or progress that Gradio's status tracker lays over it."""
    return locator.evaluate(
        """(el) => { const copy = el.cloneNode(true);
        copy.querySelectorAll("[data-testid=status-tracker]").forEach((s) => s.remove());
        return copy.textContent.trim(); }"""
    )


def _analyze(page: Any, path: Path) -> None:
    _open_tab(page, "Analyze a trace")
    clear = page.locator("#upload button[aria-label=Clear]")
    if clear.count():  # a file is there already: the drop zone returns once it is cleared
        clear.first.click()
    page.locator("#upload input[type=file]").set_input_files(str(path))
    page.get_by_role("button", name="Analyze", exact=True).click()


def _trace_events(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return data["traceEvents"] if isinstance(data, dict) else data


def _served_path(href: str) -> Path:
    """The server's own file behind a Gradio file link (`.../gradio_api/file=/tmp/...`): the server is local."""
    return Path(unquote(urlsplit(href).path.split("file=", 1)[1]))


# Layout, on a laptop and a phone


@pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["1400px", "390px"])
def test_every_tab_fits_and_shows_the_shape_only_where_it_is_used(browser, page_url, viewport):
    page, problems = _open(browser, page_url, viewport), []
    try:
        if viewport is PHONE:
            bottom = page.evaluate(
                "() => document.querySelector('[role=tablist]').getBoundingClientRect().bottom + window.scrollY"
            )
            if bottom > 300:
                problems.append(f"the tabs end {bottom:.0f} px down the page")
        panel = page.locator("#shape-panel")
        if panel.count() != 1:
            problems.append(f"{panel.count()} elements with elem_id shape-panel")
        for name in TABS:
            _open_tab(page, name)
            if _overflow(page):
                problems.append(f"{name}: {_overflow(page)} px too wide")
            if panel.count() == 1 and panel.is_visible() != (name in SHAPE_TABS):
                problems.append(f"{name}: the shape panel is {'shown' if panel.is_visible() else 'hidden'}")
        # Filled with results too: a GPU trace's card, charts and tables must not widen the page either.
        _analyze(page, GPU_TRACE)
        page.locator("#gpu-card").get_by_text("GPU").first.wait_for(timeout=PAGE_S * 1000)
        page.wait_for_timeout(1_000)
        if _overflow(page):
            problems.append(f"Analyze with results: {_overflow(page)} px too wide")
    finally:
        page.context.close()
    assert not problems, f"at {viewport['width']} px: {problems}"


def test_the_page_does_not_isolate_its_opener(browser, page_url):
    """Cross-Origin-Opener-Policy: same-origin would cut the Perfetto tab off from this page."""
    page = browser.new_page()
    try:
        response = page.goto(page_url, wait_until="domcontentloaded")
        assert response.headers.get("cross-origin-opener-policy", "unsafe-none") == "unsafe-none"
    finally:
        page.close()


# State


def test_a_failed_upload_clears_the_old_results(laptop, tmp_path):
    _analyze(laptop, GPU_TRACE)
    card, insights = laptop.locator("#gpu-card"), laptop.locator("#analyze-insights")
    card.get_by_text("GPU").first.wait_for(timeout=PAGE_S * 1000)
    for elem_id in ("idle-chart", "breakdown-chart"):
        laptop.locator(f"#{elem_id} .js-plotly-plot").first.wait_for(timeout=PAGE_S * 1000)
    assert _shown_text(insights) and _shown_text(card)  # the good trace's results are on screen

    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [', encoding="utf-8")
    _analyze(laptop, broken)
    error = laptop.locator("[data-testid=toast-body]", has_text="trace: not valid JSON")
    error.first.wait_for(timeout=PAGE_S * 1000)
    laptop.wait_for_timeout(500)
    left = {
        "GPU card": _shown_text(card),
        "insights": _shown_text(insights),
        **{name: laptop.locator(f"#{name} .js-plotly-plot").count() for name in ("idle-chart", "breakdown-chart")},
        "analyze-timeline": laptop.locator("#analyze-timeline .js-plotly-plot").count(),
    }
    assert not any(left.values()), f"the good trace's results stayed beside the error: {left}"


# Charts, against the trace's own JSON


def _metadata_labels(events: list[dict[str, Any]]) -> tuple[dict[tuple[Any, Any], set[str]], set[tuple[Any, Any]]]:
    """Per (pid, tid) lane, the labels its `ph: M` metadata allows (the thread's name, alone or after its
    process's name or label, as "GPU 0 · stream 7"); and the lanes with events but no thread name."""
    processes: dict[Any, set[str]] = defaultdict(set)
    threads: dict[tuple[Any, Any], str] = {}
    lanes: set[tuple[Any, Any]] = set()
    for event in events:
        args = event.get("args") or {}
        if event.get("ph") == "X":
            lanes.add((event.get("pid"), event.get("tid")))
        elif event.get("ph") == "M" and event.get("name") == "process_name":
            processes[event.get("pid")].add(str(args.get("name", "")).strip())
        elif event.get("ph") == "M" and event.get("name") == "process_labels":
            processes[event.get("pid")].add(str(args.get("labels", "")).strip())
        elif event.get("ph") == "M" and event.get("name") == "thread_name":
            threads[(event.get("pid"), event.get("tid"))] = str(args.get("name", "")).strip()
    allowed = {
        lane: {name, *(f"{process} · {name}" for process in processes[lane[0]] if process)}
        for lane, name in threads.items()
        if lane in lanes
    }
    return allowed, lanes - set(threads)


def _assert_lanes_named_from_metadata(ticks: list[str], events: list[dict[str, Any]]) -> None:
    allowed, unnamed = _metadata_labels(events)
    named = set().union(*allowed.values())
    lanes = [tick for tick in ticks if not tick.startswith("others")]
    assert lanes, "the timeline has no lane labels"
    strangers = [tick for tick in lanes if tick not in named]
    assert len(strangers) <= len(unnamed), f"lanes not named from the metadata: {strangers}; allowed: {allowed}"
    busy = {(e.get("pid"), e.get("tid")) for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "cpu_op")}
    for lane in busy & set(allowed):
        assert allowed[lane] & set(lanes), f"lane {lane} is not labelled {allowed[lane]}: {lanes}"


def test_the_timeline_lanes_are_named_from_the_gpu_trace_metadata(laptop):
    _analyze(laptop, GPU_TRACE)
    figure = _figure(laptop, "analyze-timeline")
    _assert_lanes_named_from_metadata(figure["layout"]["yaxis"]["ticktext"] or [], _trace_events(GPU_TRACE))
    assert any(re.fullmatch(r"GPU 0 · stream 7", tick) for tick in figure["layout"]["yaxis"]["ticktext"])


def test_the_timeline_lanes_of_a_cpu_run_are_named_from_its_metadata(profiled):
    _open_tab(profiled, "Profile")
    href = profiled.locator("#trace-file a[download]").first.get_attribute("href")
    figure = _figure(profiled, "timeline")
    _assert_lanes_named_from_metadata(figure["layout"]["yaxis"]["ticktext"] or [], _trace_events(_served_path(href)))


def test_the_sweep_legend_matches_its_traces(laptop):
    _open_tab(laptop, "Sweep")
    from attention import RUN_NAMES

    runs = ["naive", "sdpa-math"]
    for name in RUN_NAMES:  # the variants' boxes: only these two runs
        box = laptop.get_by_label(name, exact=True).and_(laptop.locator("input[type=checkbox]:visible"))
        if box.count():
            box.set_checked(name in runs)
    laptop.get_by_label("seq_len values").fill("64,128")
    laptop.get_by_role("button", name="Sweep", exact=True).click()
    laptop.locator("#sweep-chart .js-plotly-plot .legend").first.wait_for(timeout=RUN_S * 1000)
    figure = _figure(laptop, "sweep-chart")
    traces = [t for t in figure["data"] if t["visible"] is not False and t["colors"]]
    shown = [t for t in traces if t["showlegend"]]
    assert sorted(figure["legend"]) == sorted(t["name"] for t in shown)  # what plotly drew is what it was told
    for run in runs:
        own = [t for t in traces if run in (t["legendgroup"], t["name"])]
        assert len({c for t in own for c in t["colors"]}) == 1, f"{run}: one colour in every panel, got {own}"
        assert [t["showlegend"] for t in own if t["name"] == run].count(True) == 1, f"{run}: one legend entry: {own}"
    run_colours = [next(c for t in traces if run in (t["legendgroup"], t["name"]) for c in t["colors"]) for run in runs]
    assert len(set(run_colours)) == len(runs), f"two runs share a colour: {dict(zip(runs, run_colours, strict=True))}"
    for trace in traces:  # every colour on the chart is explained by a legend entry of its own group
        keys = {
            c
            for s in shown
            if s is trace or (trace["legendgroup"] and s["legendgroup"] == trace["legendgroup"])
            for c in s["colors"]
        }
        assert set(trace["colors"]) <= keys, f"colours {trace['colors']} of {trace['name']!r} are not in the legend"


# Open in Perfetto


def _open_in_perfetto(page: Any, button_id: str) -> tuple[dict[str, Any], str]:
    with page.expect_popup(timeout=PAGE_S * 1000) as popup:
        page.locator(f"#{button_id}").click()
    tab = popup.value
    status = page.locator(f"#{button_id}-status")
    status.get_by_text("Sent the trace").wait_for(timeout=slack(30) * 1000)
    tab.wait_for_function("() => window.received.length > 0", timeout=slack(10) * 1000)
    tab.wait_for_timeout(300)  # a second post, had there been one, would land here
    got = tab.evaluate("() => ({received: window.received, pings: window.pings})")
    tab.close()
    return got, status.inner_text()


def test_the_popup_blocker_is_on(browser):
    """Without a click, window.open is refused: so the Perfetto tests below prove the tab opens in the gesture.

    The probe runs in a page's own script: Playwright's evaluate() would count as a user gesture."""
    page = browser.new_page()
    try:
        probe = "<script>window.blocked = window.open('about:blank') === null</script>"
        page.route("http://probe.invalid/", lambda route: route.fulfill(content_type="text/html", body=probe))
        page.goto("http://probe.invalid/")
        assert page.evaluate("() => window.blocked") is True
    finally:
        page.close()


def test_open_in_perfetto_posts_the_profiled_trace(profiled, page_url):
    _open_tab(profiled, "Profile")
    href = profiled.locator("#trace-file a[download]").first.get_attribute("href")
    size = _served_path(href).stat().st_size
    got, status = _open_in_perfetto(profiled, "trace-file-perfetto")
    assert len(got["received"]) == 1 and got["pings"] >= 1
    posted = got["received"][0]
    assert posted["isBuffer"] and posted["bytes"] == size
    assert posted["fileName"].endswith(".json") and posted["title"] == posted["fileName"]
    assert posted["origin"] == page_url.rstrip("/")
    assert f"{size:,} bytes" in status
    note = profiled.get_by_text("Perfetto asks Open trace? when this page is not on localhost").first
    assert note.is_visible()


def test_open_in_perfetto_posts_an_uploaded_gzipped_trace_as_it_is(laptop):
    _analyze(laptop, GPU_TRACE)
    got, status = _open_in_perfetto(laptop, "upload-perfetto")
    assert len(got["received"]) == 1
    posted = got["received"][0]
    assert posted["bytes"] == GPU_TRACE.stat().st_size  # the .gz bytes, not the JSON inside
    assert posted["fileName"] == GPU_TRACE.name
    assert f"{GPU_TRACE.stat().st_size:,} bytes" in status


def test_the_perfetto_handler_without_a_trace_or_a_perfetto(browser):
    """The handler's other ends: no file yet (no tab opened), and a page that never answers PONG."""
    from ui.perfetto import GIVE_UP_MS, open_js

    context = browser.new_context()
    try:
        page = context.new_page()
        html = "<!doctype html><title>{}</title>"
        context.route("http://app.invalid/**", lambda r: r.fulfill(content_type="text/html", body=html.format("app")))
        context.route("http://silent.invalid/**", lambda r: r.fulfill(content_type="text/html", body=html.format("?")))
        page.goto("http://app.invalid/")
        handler = open_js("http://silent.invalid/", give_up_ms=1_000)
        assert page.evaluate(f"(trace) => ({handler})(trace)", None).startswith("No trace yet")
        assert len(context.pages) == 1
        trace = {"url": "http://app.invalid/t.json", "orig_name": "t.json", "path": "/tmp/t.json"}
        message = page.evaluate(f"(trace) => ({handler})(trace)", trace)
        assert message == "Could not open the trace in Perfetto: Perfetto did not answer within 1 s."
        assert len(context.pages) == 2  # the tab opened, and stays for the reader to see
        assert GIVE_UP_MS == 20_000 and "20000" in open_js("https://ui.perfetto.dev")
    finally:
        context.close()


# The README's screenshot


def test_the_profile_tab_screenshot(profiled):
    from PIL import Image

    _open_tab(profiled, "Profile")
    profiled.evaluate("() => window.scrollTo(0, 0)")
    profiled.wait_for_timeout(500)
    height = min(SCREENSHOT_HEIGHT, profiled.evaluate("() => document.scrollingElement.scrollHeight"))
    shot = profiled.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": LAPTOP["width"], "height": height})
    image = Image.open(io.BytesIO(shot))
    assert image.size == (LAPTOP["width"], height)
    # A page is mostly flat colour: 256 colours keep it sharp at a fraction of the bytes.
    out = io.BytesIO()
    image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, format="PNG", optimize=True)
    assert 20_000 < len(out.getvalue()) <= SCREENSHOT_BYTES, f"{len(out.getvalue()):,} bytes"
    SCREENSHOT.parent.mkdir(exist_ok=True)
    SCREENSHOT.write_bytes(out.getvalue())
    assert os.path.getsize(SCREENSHOT) == len(out.getvalue())
