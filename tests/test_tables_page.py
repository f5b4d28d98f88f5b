"""The tables on the page (ui/tables.py) and the API tables behind them, through a live server.

The API's Dataframes keep today's headers and numbers (a client reads them); the page shows
display-only copies, sorted by device self time on a GPU trace, searchable, with a CSV download.
Truths come from a plain loop over the trace's JSON (tests/profiling/test_display.py's).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from pathlib import Path

import pytest
from gradio_client import handle_file

from profiling.tables import KERNEL_COLUMNS, OP_COLUMNS
from profiling.windows import STEP_COLUMNS, WINDOW_COLUMNS
from tests.profiling.test_display import BERT, launched_time_by_op, raw_events
from tests.timing_slack import slack

NUMERIC_OP_COLUMNS = OP_COLUMNS[1:-1]
PRIVATE_STEPS = ("profile_tables", "analyze_tables", "compare_view")


@pytest.fixture(scope="module")
def analyzed(client):
    return client.predict(handle_file(str(BERT)), api_name="/analyze")


def test_analyze_api_tables_keep_their_headers_and_numbers(analyzed):
    _summary, ops, kernels, _timeline, steps, annotations, _insights, _chart = analyzed
    assert ops["headers"] == OP_COLUMNS
    assert kernels["headers"] == KERNEL_COLUMNS
    # The steps' own columns, then the step breakdown's roles present in this trace (µs), "other" last.
    assert steps["headers"][: len(STEP_COLUMNS)] == STEP_COLUMNS and steps["headers"][-1] == "other (us)"
    assert annotations["headers"] == WINDOW_COLUMNS
    for row in ops["data"]:
        figures = dict(zip(ops["headers"], row, strict=True))
        assert all(isinstance(figures[c], (int, float)) for c in NUMERIC_OP_COLUMNS), row
    # The numbers are the plain loop's, not the page's text ("197.6", "63.9").
    truth = launched_time_by_op(BERT)
    by_name = {row[0]: dict(zip(ops["headers"], row, strict=True)) for row in ops["data"]}
    for name, us in truth.items():
        assert by_name[name]["self device (us)"] == pytest.approx(us, abs=1e-3)
    # Today's order stays on the API: self CPU time, the largest first.
    host = [row[ops["headers"].index("self cpu (us)")] for row in ops["data"]]
    assert host == sorted(host, reverse=True)
    assert all(isinstance(row[steps["headers"].index("cpu (ms)")], float) for row in steps["data"])


def test_profile_api_tables_keep_their_headers(client):
    outputs = client.predict(
        "naive", "auto", 1, 2, 64, 32, "float32", "cpu", False, api_name="/profile"
    )  # fmt: skip
    _summary, ops, _timeline, _trace, kernels, _table, _insights = outputs
    assert ops["headers"] == OP_COLUMNS
    assert kernels["headers"] == KERNEL_COLUMNS or not kernels["data"]  # CPU: no kernels, the schema kept
    assert all(isinstance(row[2], float) for row in ops["data"])


def test_the_follow_up_steps_are_private(client):
    named = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert not [name for name in named if name.strip("/") in PRIVATE_STEPS]
    assert {"/profile", "/analyze", "/compare"} <= set(named)


# The page, in Debian's Chromium (tests/test_browser.py's set-up).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]


@pytest.fixture(scope="module")
def page(app_url):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            raise RuntimeError(f"CI must have Chromium at {CHROMIUM}")
        pytest.skip(f"no Chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_context(viewport={"width": 1400, "height": 1800}, accept_downloads=True).new_page()
        page.goto(app_url, wait_until="domcontentloaded")
        page.get_by_role("button", name="Profile", exact=True).wait_for(timeout=slack(60_000))
        yield page
        browser.close()


ROWS_JS = """rows => rows
    .map(r => [Number(r.dataset.index), [...r.querySelectorAll('[role=gridcell]')].map(c => c.innerText.trim())])
    .sort((a, b) => a[0] - b[0]).map(pair => pair[1])"""


def _rows(table) -> list[dict[str, str]]:
    """The rows of a page table the browser has drawn (a virtual scroll draws a window of them), as shown."""
    headers = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    drawn = table.locator("[role=row].virtual-row").evaluate_all(ROWS_JS)
    return [dict(zip(headers, cells, strict=True)) for cells in drawn]


@pytest.mark.browser
def test_gpu_upload_shows_ops_by_device_self_time_with_search_and_csv(page, tmp_path):
    truth = launched_time_by_op(BERT)
    page.get_by_role("tab", name="Analyze a trace").click()
    page.locator("#upload input[type=file]").set_input_files(str(BERT))
    page.get_by_role("button", name="Analyze", exact=True).click()
    table = page.locator("#analyze-op-table")
    table.get_by_text("aten::addmm").first.wait_for(timeout=slack(120_000))
    page.locator("#analyze-op-table-csv").wait_for(state="visible", timeout=slack(30_000))
    assert "largest self device time first" in table.inner_text()
    rows = _rows(table)
    names = [row["name"] for row in rows]
    device = [float(row["self device (µs)"].replace(",", "")) for row in rows]
    assert names[0] == max(truth, key=truth.get) == "aten::addmm"
    assert device == sorted(device, reverse=True)
    assert "aten::empty" not in names[: len(truth)]  # below every op that launched GPU work
    # Read-only: no cell editor, no "+" row button.
    assert table.locator("[role=grid]").get_attribute("aria-readonly") == "true"
    assert page.locator("#steps-table [role=grid]").get_attribute("aria-readonly") == "true"
    assert page.locator("#steps-table button", has_text="+").count() == 0
    # Search narrows the rows to the matching names.
    table.locator("input.search-input").fill("flash")
    page.wait_for_timeout(500)
    ops = {e["name"] for e in raw_events(BERT) if e.get("cat") == "cpu_op" and e.get("ph") == "X"}
    assert sorted(row["name"] for row in _rows(table)) == sorted(n for n in ops if "flash" in n)
    table.locator("input.search-input").fill("")
    # The CSV holds every row, names whole, numbers plain, in the page's order.
    with page.expect_download() as download:
        page.locator("#analyze-op-table-csv").click()
    saved = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text(encoding="utf-8"))))
    assert len(saved) == len(ops) and saved[0]["name"] == "aten::addmm"  # the page shows a scrolled window of them
    assert float(saved[0]["self device (µs)"]) == pytest.approx(truth["aten::addmm"], abs=1e-3)


@pytest.mark.browser
def test_cpu_profile_kernel_table_lists_the_compute_ops(page):
    page.get_by_role("tab", name="Profile").click()  # naive attention, the default, on the CPU preset
    page.get_by_role("button", name="Profile", exact=True).click()
    table = page.locator("#kernel-table")
    # A drawn row: the grid also keeps hidden copies of its cells (for measuring), first in the DOM.
    table.locator("[role=row].virtual-row", has_text="aten::masked_fill_").first.wait_for(timeout=slack(180_000))
    assert "the leaf compute ops, which the cards count as kernels" in table.inner_text()
    per_forward = {row["name"]: row["per forward"] for row in _rows(table)}
    # Naive attention on CPU (the blog's six): two bmm, the scale, the clone's copy, the fill, the softmax.
    once = {"aten::mul", "aten::copy_", "aten::masked_fill_", "aten::_softmax"}
    assert per_forward == {"aten::bmm": "2", **dict.fromkeys(once, "1")}
    ops = page.locator("#op-table")
    assert "largest self CPU time first" in ops.inner_text()
    assert not [h for h in ops.locator("thead th").all_inner_texts() if "device" in h]  # all zero on CPU: hidden
