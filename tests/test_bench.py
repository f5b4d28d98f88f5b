"""The benchmark scripts stay runnable (their numbers go in the README, not in assertions)."""

import subprocess
import sys

from bench.gpu_check import PRACTICE_RUNS
from profiling.trace import load_trace
from tests.conftest import ROOT


def test_gpu_check_runs_and_writes_gzipped_traces(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "bench/gpu_check.py",
            "--device",
            "cpu",
            "--batch",
            "1",
            "--heads",
            "2",
            "--seq-len",
            "32",
            "--dtype",
            "float32",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "== naive: 6 kernels/forward" in out.stdout and "sdpa-cudnn: unavailable" in out.stdout
    traces = {p.name for p in tmp_path.glob("*.json.gz")}
    blog = {"cpu_inplace.json.gz", "cpu_naive.json.gz", "cpu_sdpa-flash.json.gz", "cpu_sdpa-math.json.gz"}
    practice = {f"cpu_{name}.json.gz" for name, *_ in PRACTICE_RUNS}
    assert traces == blog | practice  # efficient and cuDNN refuse on CPU; every practitioner run works
    assert (load_trace(tmp_path / "cpu_naive.json.gz").complete["name"] == "attn_fwd").sum() == 3
    assert (load_trace(tmp_path / "cpu_train-naive.json.gz").complete["name"] == "attn_bwd").sum() == 3
    assert "== decode-sdpa-auto: " in out.stdout and "saved for backward" in out.stdout


def test_gpu_check_script_says_plainly_when_there_is_no_gpu(tmp_path):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run the real check")
    out = subprocess.run(
        ["bash", "bench/gpu_check.sh", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode != 0
    assert "gpu_check: device: cuda was asked for, but this machine has no CUDA GPU" in out.stderr + out.stdout
    assert "Traceback" not in out.stderr
