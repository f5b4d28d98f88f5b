"""Hardening through the real client: odd input, failing compiles, time limits, a full queue, files."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import QueueError

import endpoints as app
from tests.conftest import ROOT, _free_port
from tests.timing_slack import slack

SMALL = ("inplace", "auto", 1, 2, 32, 16, "float32", "cpu")


@pytest.fixture(scope="module")
def served_without_compiler(tmp_path_factory):
    """`python app.py` as a Space runs it, on a machine whose C++ compiler is missing."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    port = _free_port()
    env = {
        **os.environ,
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(port),
        "CXX": "/nonexistent/g++",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path_factory.mktemp("inductor")),
    }
    server = subprocess.Popen(
        [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + slack(120)
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"python app.py did not serve: {server.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.5)
    yield url
    server.terminate()
    server.wait(timeout=slack(30))


def test_python_app_py_serves_the_page(served_without_compiler):
    import json
    import urllib.request

    config = json.loads(urllib.request.urlopen(served_without_compiler + "config", timeout=slack(10)).read())
    assert config["title"] == "Attention Profiler"
    assert {"profile", "compare", "sweep", "analyze", "diff", "share"} <= {
        d.get("api_name") for d in config["dependencies"]
    }


def test_failing_compile_is_a_clear_error_and_the_app_goes_on(served_without_compiler):
    client = Client(served_without_compiler, verbose=False)
    with pytest.raises(AppError, match=r"^compile: torch.compile failed .*untick compile"):
        client.predict(*SMALL, True, api_name="/profile")
    summary, *_ = client.predict(*SMALL, False, api_name="/profile")
    assert summary["kernels_per_forward"] == 5


def test_time_limit_is_reported(client, monkeypatch):
    monkeypatch.setattr(app.common, "RUN_TIME_LIMIT_S", 0.0)
    with pytest.raises(AppError, match=r"^time limit: this run would take about \d+ s .* over the 0 s left"):
        client.predict(*SMALL, False, api_name="/profile")


def raw_call(app_url, api_name, data):
    """One API call over plain HTTP, as a hostile caller would make it (no client-side upload)."""
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{app_url}gradio_api/call/{api_name}",
        data=json.dumps({"data": data}).encode(),
        headers={"Content-Type": "application/json"},
    )
    event = json.loads(urllib.request.urlopen(request, timeout=slack(30)).read())["event_id"]
    return urllib.request.urlopen(f"{app_url}gradio_api/call/{api_name}/{event}", timeout=slack(60)).read().decode()


def test_a_server_path_in_the_request_is_never_read(app_url, tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"traceEvents": [], "password": "hunter2"}')
    forged = {"path": str(secret), "meta": {"_type": "gradio.FileData"}}
    for api_name, data in (("analyze", [forged]), ("share", [forged, "alice/traces", "hf_x"])):
        reply = raw_call(app_url, api_name, data)
        assert reply.startswith("event: error") and "hunter2" not in reply


def test_app_file_accepts_only_uploads_and_runs(tmp_path):
    import gradio as gr

    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    with pytest.raises(gr.Error) as err:
        app.app_file(str(outside), "trace")
    assert err.value.message == "trace: only files uploaded to this app or produced by it can be used"
    with pytest.raises(gr.Error) as err:
        app.app_file(None, "trace")
    assert err.value.message.startswith("trace: upload a")
    run = app.store().new_dir() / "ours.json"
    run.write_text("{}")
    assert app.app_file(str(run), "trace") == str(run.resolve())
    sneaky = app.store().root / ".." / "outside.json"
    with pytest.raises(gr.Error):
        app.app_file(str(sneaky), "trace")


def test_a_full_queue_says_so_and_serves_the_rest():
    import app as layout

    demo = layout.build_demo(queue_size=1)
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    url = f"http://127.0.0.1:{port}/"

    def one(_):
        try:
            Client(url, verbose=False).predict(
                "naive", "auto", 2, 8, 1024, 64, "float32", "cpu", False, api_name="/profile"
            )
        except QueueError as exc:
            return str(exc)
        return "ok"

    try:
        with ThreadPoolExecutor(6) as pool:
            outcomes = list(pool.map(one, range(6)))
    finally:
        demo.close()
    assert "ok" in outcomes
    assert any("Queue is full" in o for o in outcomes)
