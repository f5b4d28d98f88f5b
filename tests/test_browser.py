"""The page in a real headless Chromium (Debian's), driven by Playwright."""

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = ROOT / "artifacts"
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"CI must have Chromium at {CHROMIUM}: .ci/run installs Debian's chromium")
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page(app_url, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1800})
        page = context.new_page()
        page.goto(app_url, wait_until="domcontentloaded")
        page.get_by_role("button", name="Profile", exact=True).wait_for(timeout=60_000)
        yield page
        browser.close()


def test_profile_in_the_browser(page):
    variant = page.get_by_label("variant")
    variant.click()
    page.get_by_role("option", name="in-place").click()
    page.get_by_role("button", name="Profile", exact=True).click()

    table = page.locator("#op-table")
    table.get_by_text("aten::bmm").first.wait_for(timeout=120_000)
    page.locator("#timeline .js-plotly-plot").first.wait_for(timeout=60_000)
    assert page.locator("#timeline .js-plotly-plot .bars path").count() > 10  # real bars, drawn by plotly

    link = page.locator("#trace-file a[download]").first
    link.wait_for(timeout=30_000)
    assert link.get_attribute("href").endswith(".json")
    assert "masked_fill_" not in page.locator("#insights").inner_text()  # in-place: no hidden-copy insight

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "profile.png"), full_page=True)
    assert (ARTIFACTS / "profile.png").stat().st_size > 10_000


def test_backend_shows_only_for_sdpa(page):
    backend = page.get_by_label("SDPA backend")
    assert not backend.is_visible()
    page.get_by_label("variant").click()
    page.get_by_role("option", name="SDPA").click()
    backend.wait_for(state="visible", timeout=10_000)


def test_bad_input_shows_the_message(page):
    seq_len = page.get_by_label("seq_len")
    seq_len.fill("0")
    page.get_by_role("button", name="Profile", exact=True).click()
    page.get_by_text("seq_len: must be from 1 to 131072, got 0").first.wait_for(timeout=30_000)
    seq_len.fill("256")


def test_compare_tab(page):
    page.get_by_role("tab", name="Compare").click()
    page.get_by_role("button", name="Compare every variant").click()
    table = page.locator("#compare-table")
    table.get_by_text("sdpa-flash").first.wait_for(timeout=180_000)
    table.get_by_text("unavailable: backend: the cuDNN SDPA backend runs only on CUDA").first.wait_for(timeout=10_000)
    page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)


def test_analyze_an_uploaded_trace(page):
    from tests.conftest import DATA

    page.get_by_role("tab", name="Analyze a trace").click()
    page.locator("#upload input[type=file]").set_input_files(str(DATA / "a100_simple_add.json.gz"))
    page.get_by_role("button", name="Analyze", exact=True).click()
    # The page's kernel table is filled by a follow-up step after /analyze: wait for its row, not the timeline's.
    kernels = page.locator("#analyze-kernel-table [role=row].virtual-row", has_text="ampere_sgemm_32x32_sliced1x4_tn")
    kernels.first.wait_for(timeout=60_000)
    assert "FP32 math on CUDA cores" in kernels.first.inner_text()  # the decoder, next to the kernel
    page.screenshot(path=str(ARTIFACTS / "analyze.png"), full_page=True)


def test_diff_tab_compares_two_runs_of_this_session(page):
    # The earlier tests profiled in-place and compared every variant, so the session holds runs.
    page.get_by_role("tab", name="Diff").click()
    page.get_by_role("button", name="Diff", exact=True).click()
    table = page.locator("#diff-table")
    table.get_by_text("status").first.wait_for(timeout=30_000)
    table.get_by_text("added").first.wait_for(timeout=30_000)  # the last two runs differ in their ops
    page.screenshot(path=str(ARTIFACTS / "diff.png"), full_page=True)


PIXEL = "http://127.0.0.1:9/pixel.png"  # port 9 (discard): nothing answers, so a request would be the only trace
HOSTILE = {
    "img": f'<img src="{PIXEL}" onerror="alert(1)">',
    "svg": '<svg><a href="javascript:alert(document.domain)"><text y="20">Open in Perfetto</text></a></svg>',
    "link": "[Open in Perfetto](javascript:alert(1))",
}


def _hostile_trace(path):
    """A trace whose op and kernel names are markup, reaching the insights, tables, hover and titles."""
    import gzip
    import json

    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "dur": 2}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": HOSTILE["img"], "ts": 0, "dur": 50, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::clone", "ts": 1, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": HOSTILE["link"], "ts": 20, "dur": 20, "pid": 1, "tid": 1},
        {**launch, "ts": 21, "args": {"correlation": 1}},
        {**launch, "ts": 25, "args": {"correlation": 2}},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "flash_fwd_kernel" + HOSTILE["svg"],
            "ts": 30,
            "dur": 40,
            "pid": 0,
            "tid": 7,
            "args": {
                "correlation": 1,
                "device": 0,
                "stream": 7,
                "registers per thread": 255,
                "block": [128, 1, 1],
                "grid": [8, 1, 1],
                "shared memory": 0,
            },
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ampere_sgemm_" + HOSTILE["img"],
            "ts": 80,
            "dur": 10,
            "pid": 0,
            "tid": 7,
            "args": {"correlation": 2, "device": 0, "stream": 7},
        },
    ]
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path


def test_trace_names_are_never_markup(page, app_url, tmp_path):
    page.goto(app_url, wait_until="domcontentloaded")  # a fresh page: an earlier test left a file in the upload
    page.get_by_role("button", name="Profile", exact=True).wait_for(timeout=60_000)
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.get_by_role("tab", name="Analyze a trace").click()
    trace = _hostile_trace(tmp_path / "evil<b>name<img src=x>.json.gz")  # a file name cannot hold "/"
    page.locator("#upload input[type=file]").set_input_files(str(trace))
    page.get_by_role("button", name="Analyze", exact=True).click()
    insights = page.locator("#analyze-insights")
    insights.get_by_text("Hidden copy").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1_000)  # let the tables and the plot render too
    text = insights.inner_text()
    assert HOSTILE["img"] in text and "<svg><a href=" in text  # shown in the insights, as characters
    body = page.locator("body").inner_text()
    assert HOSTILE["link"] in body  # the op that launched a kernel, in the kernel table: text, not a link
    assert page.locator("img[src*='pixel.png']").count() == 0
    assert page.locator("a[href^='javascript']").count() == 0
    assert page.locator("svg a").count() == 0 or all(
        not (page.locator("svg a").nth(i).get_attribute("href") or "").startswith("javascript")
        for i in range(page.locator("svg a").count())
    )
    assert not any("pixel.png" in url for url in requests)
    page.screenshot(path=str(ARTIFACTS / "hostile.png"), full_page=True)
