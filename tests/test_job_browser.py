"""Analyze's whole-job box in a real headless Chromium (tests/test_browser.py's set-up): a zip of four rank
traces gives the charts, the tables and the straggler.

(The page uploads several selected files in ONE request, which traffic.py's one-file-per-request rule
refuses with 400: in the browser a job is one zip; API and MCP callers upload each file on its own.)"""

import os
import zipfile
from pathlib import Path

import pytest

from bench import make_ranks
from tests.conftest import ROOT
from tests.test_browser import CHROMIUM, FLAGS

SOURCE = ROOT.parent / "shared" / "traces" / "hta_ranks" / "sampled_rank-0.json.gz"

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"CI must have Chromium at {CHROMIUM}: .ci/run installs Debian's chromium")
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

pytestmark = pytest.mark.browser


def test_a_whole_job_in_the_browser(app_url, tmp_path):
    from playwright.sync_api import sync_playwright

    if not SOURCE.exists():
        pytest.skip(f"{SOURCE} (the shared HTA rank) is absent")
    ranks = make_ranks.main([str(SOURCE), str(tmp_path), "--ranks", "4", "--straggler", "1", "--factor", "1.5"])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_context(viewport={"width": 1400, "height": 1800}).new_page()
        page.goto(app_url, wait_until="domcontentloaded")
        page.get_by_role("tab", name="Analyze").first.click(timeout=60_000)
        page.get_by_text("A whole job: every rank's trace").first.click()
        archive = tmp_path / "job.zip"
        with zipfile.ZipFile(archive, "w") as zipped:
            for rank in ranks:
                zipped.write(rank, rank.name)
        page.locator("#job-traces input[type=file]").set_input_files(str(archive))
        page.locator("#job-traces").get_by_text("job.zip").first.wait_for(timeout=60_000)  # uploaded
        page.get_by_role("button", name="Analyze the job").click()
        findings = page.locator("#job-findings")
        findings.get_by_text("Rank 1 is a straggler").first.wait_for(timeout=120_000)
        page.locator("#job-breakdown-chart .js-plotly-plot").first.wait_for(timeout=30_000)
        assert page.locator("#job-breakdown-chart .js-plotly-plot .bars path").count() >= 16  # 4 parts x 4 ranks
        assert page.locator("#job-steps-chart .js-plotly-plot .scatterlayer .trace").count() == 4
        page.locator("#job-per-rank").get_by_text("rank-entry-03.json.gz").first.wait_for(timeout=10_000)
        browser.close()
