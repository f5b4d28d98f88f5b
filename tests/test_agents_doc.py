"""docs/agents.md's examples run as written against the live app: each code block in its own process,
with the server's address in ATTENTION_PROFILER_URL, as the doc says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import DATA, ROOT
from tests.timing_slack import slack

DOC = ROOT / "docs" / "agents.md"
BLOCKS = re.findall(r"```(python|bash)\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
TRACE = DATA / "gpu" / "h100_nn-mha_fp32.json.gz"


def test_the_doc_has_an_mcp_session_a_gradio_client_and_plain_http():
    code = "\n".join(block for _, block in BLOCKS)
    assert [lang for lang, _ in BLOCKS].count("python") == 2 and [lang for lang, _ in BLOCKS].count("bash") == 2
    for needed in ("ClientSession", "list_tools", "profile_summary", "analyze_summary", "compare_summary"):
        assert needed in code, needed
    assert "gradio_api/upload" in code and "gradio.FileData" in code


@pytest.mark.parametrize(("lang", "code"), BLOCKS, ids=[f"{lang}-{i}" for i, (lang, _) in enumerate(BLOCKS)])
def test_each_example_runs_as_written(app_url, lang, code):
    command = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    env = {**os.environ, "ATTENTION_PROFILER_URL": app_url, "ATTENTION_PROFILER_TRACE": str(TRACE)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=slack(300))
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout
    if "profile_summary" in code and lang == "python":  # the MCP session: naive's count, then the trace's
        assert "kernels_per_forward" not in output and "Hidden copy" in output
        assert "\n48 " in output  # h100_nn-mha_fp32 has 48 kernel events (tests/test_agents.py counts them)
    if "compare_summary" in code:
        assert "sdpa cudnn" in output and "runs only on CUDA" in output
    if lang == "bash":  # the last line is the result's `data:`, a list holding the one JSON string
        last = output.strip().splitlines()[-1]
        assert last.startswith("data: ")
        (result,) = json.loads(last.removeprefix("data: "))
        assert json.loads(result)["cut"] is None
