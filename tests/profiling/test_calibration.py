"""The device's calibration: measured for real once, injected, loaded from ATTENTION_PROFILER_CALIBRATION."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch.utils.benchmark as benchmark

from profiling import calibration, roofline
from profiling.calibration import ENV, Calibration, Rate
from tests.conftest import ROOT
from tests.timing_slack import slack

OTHER = Calibration("cpu", {"float32": Rate(0.2, 0.1, 0.3, 9)}, Rate(40.0, 30.0, 50.0, 11))


@pytest.fixture
def injected(fixed_calibration):
    """A test may inject its own calibration; the session's comes back after it."""
    yield
    calibration.use(fixed_calibration)


def test_the_real_measurement_runs_and_has_a_spread():
    """No speed is asserted: only that the matmul and the copy are measured over several blocks, each a
    finite positive rate, with p25 < median < p75 or equal where the blocks tied."""
    cal = calibration.measure("cpu", ("float32",), min_run_time=0.05)
    for rate in (cal.matmul("float32"), cal.copy_gbps):
        assert rate.n >= calibration.MIN_BLOCKS
        assert all(math.isfinite(v) and v > 0 for v in (rate.p25, rate.median, rate.p75))
        assert rate.p25 <= rate.median <= rate.p75 and rate.p75 - rate.p25 < math.inf
    assert (cal.device, cal.matmul_size, cal.copy_bytes) == ("cpu", 1024, 64 * 1024**2)


def test_a_rate_is_the_work_over_each_quantile_of_the_times():
    """Times of 1, 2, 3, 4 s (one call a block) for 12 units of work: linear quartiles 1.75 and 3.25 s."""
    spec = benchmark.Timer("pass").blocked_autorange(min_run_time=0.001).task_spec
    rate = Rate.of(benchmark.Measurement(1, [1.0, 2.0, 3.0, 4.0], spec), work=12.0)
    assert rate == Rate(median=12 / 2.5, p25=12 / 3.25, p75=12 / 1.75, n=4)  # a slow block is a low rate
    per_call = Rate.of(benchmark.Measurement(2, [2.0, 4.0, 6.0], spec), work=6.0)  # 2 calls a block: 1, 2, 3 s
    assert per_call == Rate(median=3.0, p25=6 / 2.5, p75=6 / 1.5, n=3)


@pytest.mark.parametrize(
    "fields",
    [
        dict(median=1.0, p25=2.0, p75=3.0, n=3),  # quartiles out of order
        dict(median=0.0, p25=0.0, p75=0.0, n=3),
        dict(median=math.nan, p25=1.0, p75=1.0, n=3),
        dict(median=1.0, p25=1.0, p75=math.inf, n=3),
        dict(median=1.0, p25=1.0, p75=1.0, n=0),
        dict(median=1.0, p25=1.0, p75=1.0, n=True),
        dict(median=True, p25=True, p75=True, n=1),
    ],
)
def test_a_bad_rate_is_refused(fields):
    with pytest.raises(ValueError, match="rate"):
        Rate(**fields)


def test_injected_calibration_is_what_the_roofline_reads(injected):
    calibration.use(OTHER)
    assert calibration.current("cpu") is OTHER
    assert roofline.matmul_tflops("cpu", "float32") == 0.2 and roofline.copy_gbps("cpu") == 40.0
    with pytest.raises(ValueError, match=r"^the calibration for cpu \(given in code\) has no bfloat16 matmul rate"):
        roofline.matmul_tflops("cpu", "bfloat16")
    with pytest.raises(TypeError):
        calibration.use({"device": "cpu"})


def test_an_injection_is_for_its_own_device(injected, monkeypatch, tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(OTHER.to_json())
    monkeypatch.setenv(ENV, str(path))
    calibration.use(Calibration("cuda", {"float32": Rate.exact(50.0)}, Rate.exact(900.0)))
    assert calibration.current("cpu") == OTHER  # from the file: the injection names another device
    calibration.use(None)
    assert calibration.current("cpu") == OTHER


def test_a_calibration_is_checked_and_read_only():
    with pytest.raises(ValueError, match="must be Rates"):
        Calibration("cpu", {"float32": 0.05}, Rate.exact(10.0))
    with pytest.raises(ValueError, match="positive integers"):
        Calibration("cpu", {}, Rate.exact(10.0), matmul_size=0)
    with pytest.raises(TypeError):
        OTHER.matmul_tflops["float32"] = Rate.exact(1e9)  # shared by the process: nobody changes it
    assert OTHER.matmul("float32") == Rate(0.2, 0.1, 0.3, 9)


def test_json_round_trip():
    again = Calibration.from_json(OTHER.to_json())
    assert again == OTHER
    assert json.loads(OTHER.to_json())["copy_gbps"] == {"median": 40.0, "p25": 30.0, "p75": 50.0, "n": 11}


def test_the_environment_file_is_loaded_for_each_device_it_names(injected, monkeypatch, tmp_path):
    calibration.use(None)
    gpu = Calibration("cuda", {"bfloat16": Rate.exact(300.0)}, Rate.exact(1500.0), 8192, 1024**3)
    path = tmp_path / "both.json"
    path.write_text(calibration.to_json_all([OTHER, gpu]))
    monkeypatch.setenv(ENV, str(path))
    monkeypatch.setattr(roofline, "sm_count", lambda device: None)  # no CUDA here to ask
    assert calibration.current("cpu") == OTHER and calibration.current("cuda") == gpu
    assert roofline.peak_tflops("cuda", "Some Unknown GPU", "bfloat16") == (300.0, "measured 8192² matmul")
    with pytest.raises(ValueError, match=rf"^the calibration for cuda \({ENV}=.*\) has no float32 matmul rate"):
        roofline.matmul_tflops("cuda", "float32")
    os.utime(path, ns=(1, 1))  # a changed file (another mtime) is read again
    path.write_text(gpu.to_json())
    os.utime(path, ns=(2, 2))
    assert calibration.current("cuda") == gpu


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", r"not JSON"),
        ("[]", r"expected one calibration per device"),
        ('{"device": "cpu"}', r"not a calibration: missing 'matmul_tflops'"),
        (
            '{"device": 3, "matmul_tflops": {}, "copy_gbps": {"median": 1, "p25": 1, "p75": 1, "n": 1}}',
            "device must be",
        ),
        ('{"device": "cpu", "matmul_tflops": {}, "copy_gbps": {"median": 1}}', r"a rate is \{median, p25, p75, n\}"),
        (
            '{"device": "cpu", "matmul_tflops": {}, "copy_gbps": {"median": -1, "p25": -1, "p75": -1, "n": 1}}',
            r"must be finite and > 0",
        ),
        (
            '{"device": "cpu", "matmul_tflops": {}, "copy_gbps": {"median": 1, "p25": 1, "p75": 1, "n": 1},'
            ' "matmul_size": 0}',
            r"matmul_size and copy_bytes must be positive integers",
        ),
        (
            calibration.to_json_all([OTHER, OTHER]),
            r"one calibration per device, got devices \['cpu', 'cpu'\]",
        ),
    ],
)
def test_a_bad_environment_file_is_an_error_naming_the_variable(injected, monkeypatch, tmp_path, text, message):
    calibration.use(None)
    path = tmp_path / "bad.json"
    path.write_text(text)
    monkeypatch.setenv(ENV, str(path))
    with pytest.raises(ValueError, match=rf"^{ENV}={path}: .*{message}"):
        calibration.current("cpu")


def test_a_missing_environment_file_is_an_error_naming_the_variable(injected, monkeypatch, tmp_path):
    calibration.use(None)
    monkeypatch.setenv(ENV, str(tmp_path / "absent.json"))
    with pytest.raises(ValueError, match=rf"^{ENV}=.*absent.json: cannot read it"):
        roofline.copy_gbps("cpu")


def test_measured_once_per_process_and_a_dtype_on_demand(injected, monkeypatch):
    """Without an injection or a file, the first use measures, and every later use reads the cache."""
    calls: list[tuple] = []

    def fake_measure(device, dtypes=("float32",), min_run_time=0.2):
        calls.append(("measure", device, tuple(dtypes)))
        return Calibration(device, {d: Rate.exact(1.0) for d in dtypes}, Rate.exact(2.0))

    def fake_matmul(device, dtype, min_run_time=0.2):
        calls.append(("matmul", device, dtype))
        return Rate.exact(3.0)

    calibration.use(None)
    monkeypatch.delenv(ENV)
    monkeypatch.setattr(calibration, "_measured", {})
    monkeypatch.setattr(calibration, "measure", fake_measure)
    monkeypatch.setattr(calibration, "measure_matmul", fake_matmul)
    assert [roofline.matmul_tflops("cpu", "float32") for _ in range(3)] == [1.0, 1.0, 1.0]
    assert roofline.copy_gbps("cpu") == 2.0
    assert [roofline.matmul_tflops("cpu", "bfloat16") for _ in range(2)] == [3.0, 3.0]
    assert roofline.matmul_tflops("cpu", "float32") == 1.0
    assert calls == [("measure", "cpu", ("float32",)), ("matmul", "cpu", "bfloat16")]
    assert set(calibration.current("cpu").matmul_tflops) == {"float32", "bfloat16"}


def test_the_session_calibration_reaches_other_processes(fixed_calibration):
    """The run's worker and the CLI are other processes: the session's calibration reaches them through
    ATTENTION_PROFILER_CALIBRATION, so they measure nothing either."""
    code = "from profiling import roofline; print(roofline.matmul_tflops('cpu', 'float32'), roofline.copy_gbps('cpu'))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=slack(120), check=True
    )
    expected = (fixed_calibration.matmul("float32").median, fixed_calibration.copy_gbps.median)
    assert done.stdout.split() == [str(v) for v in expected]
