"""Shared fixtures: real CPU profiles (made once per session) and a live app with a real client."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiling import calibration
from profiling.calibration import Calibration, Rate

# Before gradio is imported anywhere: its cache, our run store, no analytics, no Hub.
_SCRATCH = Path(tempfile.mkdtemp(prefix="attention-profiler-tests-"))
os.environ.setdefault("GRADIO_TEMP_DIR", str(_SCRATCH / "gradio"))
os.environ.setdefault("ATTENTION_PROFILER_DIR", str(_SCRATCH / "runs"))
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"
# Each run's unprofiled timing loop stops at this budget (default 0.5 s): the tests read its statistics,
# never its speed, and ~200 runs at 0.5 s would add minutes to the suite. Worker processes inherit it.
os.environ.setdefault("ATTENTION_PROFILER_TIMING_BUDGET_S", "0.1")

# Fixed yardsticks for the roofline and the run-time estimate, so no test measures this machine's peaks
# (a loaded machine once read a decode as compute-bound). The order of this 2-core CPU's own figures,
# measured unloaded (2026-12-03); the file reaches the run's worker processes and CLI subprocesses too.
CALIBRATION = Calibration(
    device="cpu",
    matmul_tflops={"float32": Rate.exact(0.05), "bfloat16": Rate.exact(0.1), "float16": Rate.exact(0.001)},
    copy_gbps=Rate.exact(10.0),
)


def _write_calibration() -> None:
    _SCRATCH.mkdir(exist_ok=True)
    (_SCRATCH / "calibration.json").write_text(CALIBRATION.to_json(), encoding="utf-8")
    os.environ[calibration.ENV] = str(_SCRATCH / "calibration.json")


_write_calibration()

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
GPU_TRACES = ("a100_simple_add", "sampled_training_rank0", "triton_driver_launch", "cupti_counters_no_kernels")


def pytest_sessionstart(session: pytest.Session) -> None:
    # A second session in this process (mutmut runs pytest.main again) finds this module imported and the
    # scratch removed by the first session's end: the calibration file its runs' workers read is written again.
    _write_calibration()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_SCRATCH, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def fixed_calibration() -> Iterator[Calibration]:
    """The session's injected calibration (CALIBRATION): every test reads these peaks, none measures."""
    calibration.use(CALIBRATION)
    yield CALIBRATION
    calibration.use(None)


@pytest.fixture(scope="session")
def cpu_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real profiled run per CPU variant, shared by the tests that read them."""
    from attention import AttentionSpec
    from profiling.pipeline import profile_attention

    out = tmp_path_factory.mktemp("runs")
    specs = {
        "naive": AttentionSpec(variant="naive", device="cpu"),
        "inplace": AttentionSpec(variant="inplace", device="cpu"),
        "math": AttentionSpec(variant="sdpa", backend="math", device="cpu"),
        "math-bf16": AttentionSpec(variant="sdpa", backend="math", dtype="bfloat16", device="cpu"),
        "flash": AttentionSpec(variant="sdpa", backend="flash", device="cpu"),
    }
    return {name: profile_attention(spec, out) for name, spec in specs.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def app_url() -> str:
    """The real app, served on a free local port for the whole session.

    Its tests play many users from one address, so the per-client cap on pending requests is lifted
    here; `tests/test_hostile_round2.py` tests the cap on an app of its own."""
    import app

    os.environ.setdefault("ATTENTION_PROFILER_PENDING_PER_CLIENT", "64")

    demo = app.build_demo()
    port = _free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="session")
def client(app_url: str):
    from gradio_client import Client

    return Client(app_url, verbose=False)
