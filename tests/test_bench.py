"""The benchmark scripts stay runnable (their numbers go in the README, not in assertions)."""

import json
import subprocess
import sys

import pytest

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


# --- bench/parse_scale.py and bench/readers.py: the pure parts, and the watcher's peak over several processes


def _figures(seconds: float, baseline_mib: float, peak_mib: float, **more: float) -> dict:
    return {"seconds": seconds, "cpu_s": seconds, "baseline_mib": baseline_mib, "peak_mib": peak_mib} | more


def test_parse_scale_sizes_keep_what_fits_and_max_fills_the_limit():
    import pytest

    from bench.parse_scale import sizes

    mib = 1024**2
    # 0.1 GiB is 102.4 MiB: 102 copies of 1 MiB fit.
    assert sizes("1,4,16,64,256,max", 0.1, mib) == [1, 4, 16, 64, 102]
    assert sizes("4, 1 ,4", 1.0, mib) == [1, 4]  # spaces and repeats
    assert sizes("max", 0.001, mib) == [1]  # a copy bigger than the limit still runs once
    assert sizes("8,max", 0.01, 4 * mib) == [2]  # 10.24 MiB holds 2 copies of 4 MiB, not 8
    with pytest.raises(ValueError, match="at least 1"):
        sizes("0,4", 1.0, mib)


def test_parse_scale_cells_rates_and_peaks():
    from bench.parse_scale import COLUMNS, format_line, route_cells

    # 100 MB of JSON in 2 s is 50 MB/s, its parse alone (0.5 s) 200 MB/s; 150 MiB of growth over
    # 10^8 bytes is 150 * 1,048,576 / 10^8 = 1.57x.
    figures = _figures(2.0, 100.0, 250.0, parse_s=0.5, events=1234, load=1.25)
    cells = route_cells("orjson", figures, 100_000_000)
    assert cells == ["orjson.loads into dicts", "2.00", "2.00", "50", "200", "150", "1.57", "1.2", "1,234 events"]
    header, row = format_line([name for name, _ in COLUMNS]), format_line(cells)
    assert row.startswith(header[:2] + "orjson") and len(row) == len(header) + len("  1,234 events")
    assert route_cells("reader", figures, 100_000_000, 1234)[-1] == "1,234 events"
    assert route_cells("reader", figures, 100_000_000, 1235)[-1] == "1,234 events; MISMATCH: the replica has 1,235"
    assert route_cells("hta", figures, 100_000_000, 1235)[-1] == "1,234 events kept"  # HTA drops some by design
    failed = format_line(route_cells("hta", "killed past 300 s", 100_000_000))
    assert "HTA" in failed and failed.endswith("  killed past 300 s")


def test_parse_scale_analysis_notes_say_the_split_and_the_peak_before_drawing():
    from bench.parse_scale import route_cells

    figures = _figures(3.0, 100.0, 300.0, analysis_s=2.5, draw_s=0.5, peak_before_drawing_mib=200.0)
    note = route_cells("analysis", figures | {"figure_bytes": 2048}, 2 * 1024**2)[-1]
    # 100 MiB of growth before drawing over 2 MiB of JSON is 50x.
    assert note == "analysis 2.50 s + drawing 0.50 s; peak before drawing 50.00x; figures 2 KiB"


def test_readers_growth_counts_every_process_of_a_parallel_child():
    from bench.readers import growth_mib

    assert growth_mib(_figures(1.0, 100.0, 150.0)) == 50.0
    assert growth_mib(_figures(1.0, 100.0, 150.0, processes=1, tree_mib=900.0)) == 50.0  # one process: VmHWM
    assert growth_mib(_figures(1.0, 100.0, 150.0, processes=3, tree_mib=500.0)) == 400.0  # workers' memory added


def test_parse_scale_markdown_tables_and_verdict():
    from bench.parse_scale import Size, markdown_tables, verdict

    gib, mib = 1024**3, 1024**2
    # 1 GiB of JSON in 8 s is 1,073,741,824 / 8 / 10^6 = 134 MB/s; 1,400 MiB of growth is 1.37x it. In an app
    # worker, 6 s is 179 MB/s and 1,300 MiB 1.27x.
    routes = {"analysis": _figures(8.0, 100.0, 1500.0), "server": _figures(6.0, 200.0, 1500.0), "hta": "stopped"}
    big = Size(400, 3_000_000, gib, 100 * mib, routes)
    tables = markdown_tables([big])
    assert "| 400x | 3,000,000 | 1,024.0 | – | – | – | 134 | 179 | – |" in tables
    assert "| 400x | 3,000,000 | 1,024.0 | – | – | – | 1.37 | 1.27 | – |" in tables
    worker, cli = verdict(big).splitlines()
    assert worker.endswith(
        "in an app worker (/analyze): end to end 6.0 s (<= 10 s: PASS); peak 1,300 MiB = 1.27x the JSON (<= 1.5x: PASS)"
    )
    assert cli.endswith(
        "from the CLI: end to end 8.0 s (<= 10 s: PASS); peak 1,400 MiB = 1.37x the JSON (<= 1.5x: PASS)"
    )
    slow = Size(400, 3_000_000, gib, 100 * mib, {"analysis": _figures(12.0, 100.0, 1700.0)})
    worker, cli = verdict(slow).splitlines()
    assert "(<= 10 s: FAIL)" in cli and "1.56x the JSON (<= 1.5x: FAIL)" in cli
    assert worker.endswith("FAIL, the analysis has no figures (not run)")
    assert "FAIL, the analysis has no figures (killed past 300 s)" in verdict(
        Size(400, 3_000_000, gib, 100 * mib, {"analysis": "killed past 300 s"})
    )
    assert "not judged" in verdict(Size(4, 19_420, 6 * mib, mib, {"analysis": _figures(1.0, 10.0, 20.0)}))


def test_parse_scale_judges_the_median_run_and_the_largest_peak_and_shows_every_run():
    from bench.parse_scale import Size, route_cells, typical, verdict

    gib, mib = 1024**3, 1024**2
    runs = [_figures(10.4, 100.0, 1600.0), _figures(9.1, 100.0, 1660.0), _figures(9.6, 100.0, 1620.0)]
    median = typical(runs)
    assert median["seconds"] == 9.6 and median["runs_s"] == [10.4, 9.1, 9.6]
    assert median["runs_peak_mib"] == [1500.0, 1560.0, 1520.0]
    assert typical(runs[:2])["seconds"] == 9.1  # the lower of two
    assert typical([runs[0]]) == runs[0]  # one run: as it was measured
    assert typical([runs[0], "killed past 300 s", runs[1]]) == "killed past 300 s"
    worker, _ = verdict(Size(400, 3_000_000, gib, 100 * mib, {"server": median})).splitlines()
    # 9.6 s is the median of 9.1-10.4; the peak judged is the largest, 1,560 MiB = 1.52x of 1 GiB (1,024 MiB).
    assert worker.endswith(
        "end to end 9.6 s, the median of 3 runs (9.1-10.4 s) (<= 10 s: PASS); "
        "peak 1,560 MiB = 1.52x the JSON at most (<= 1.5x: FAIL)"
    )
    note = route_cells("server", median, gib)[-1]
    assert note == "median of 3 runs: 10.40, 9.10, 9.60 s, peaks 1.46-1.52x"


def test_parse_scale_refuses_repeats_below_one():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "bench/parse_scale.py", "--repeats", "0"], capture_output=True, text=True)
    assert run.returncode == 2 and "--repeats: at least 1, got 0" in run.stderr


_PARENT = """
import subprocess, sys, time, json
touch = "b = bytearray(%d); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(%s)"  # every page resident
child = subprocess.Popen([sys.executable, "-c", touch])
child.wait()
print(json.dumps({"seconds": 0.0, "cpu_s": 0.0, "baseline_mib": 0.0, "peak_mib": 0.0}))
"""


def test_readers_watched_sees_a_grandchild_peak_and_kills_past_the_limit():
    from bench.readers import growth_mib, watched

    mib = 1024**2
    figures = watched([sys.executable, "-c", _PARENT % (200 * mib, "1.0")])
    assert isinstance(figures, dict) and figures["processes"] == 2
    assert growth_mib(figures) >= 190  # the grandchild's 200 MiB, touched page by page
    killed = watched([sys.executable, "-c", _PARENT % (200 * mib, "30")], limit_bytes=100 * mib, timeout_s=20)
    assert killed == "killed past 0.1 GiB RSS"


_FORKS = """
import json, os, time
b = bytearray(200 * 1024**2); b[::4096] = b"x" * len(b[::4096])  # resident, then shared with the fork
if os.fork() == 0:
    time.sleep(1.0)
    os._exit(0)
os.wait()
print(json.dumps({"seconds": 0.0, "cpu_s": 0.0, "baseline_mib": 0.0, "peak_mib": 0.0}))
"""


def test_readers_watched_counts_pages_a_fork_shares_with_its_parent_once():
    from bench.readers import growth_mib, watched

    figures = watched([sys.executable, "-c", _FORKS])
    assert isinstance(figures, dict) and figures["processes"] == 2
    assert 190 <= growth_mib(figures) < 300  # 200 MiB held once, not once per process


def test_job_scale_wait_stops_when_the_scheduler_exits_or_stays_silent(tmp_path):
    from bench.job_scale import _wait_for

    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    gone.wait()
    with pytest.raises(RuntimeError, match="exited with 3"):
        _wait_for(tmp_path / "scheduler.json", gone)
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(RuntimeError, match=r"wrote no scheduler.json within 0 s"):
            _wait_for(tmp_path / "scheduler.json", silent, timeout_s=0.3)
        (tmp_path / "scheduler.json").write_text("{}")
        _wait_for(tmp_path / "scheduler.json", silent, timeout_s=0.3)  # written: returns at once
    finally:
        silent.kill()
        silent.wait()


def test_a_replica_writes_each_copy_as_the_source_wrote_it(tmp_path):
    """Whole-µs times stay whole numbers (no `.0`, which would make the reader rebase every time), each copy
    starts past the previous one's end, and the reader keeps every event; checked on the JSON text."""
    import gzip
    import json

    from bench.synthetic import replicate
    from tests.conftest import DATA

    source = DATA / "sampled_training_rank0.json.gz"
    events, _ = replicate(source, 2, tmp_path / "r2.json.gz")
    original = [e for e in json.loads(gzip.decompress(source.read_bytes()))["traceEvents"] if isinstance(e, dict)]
    copies = json.loads(gzip.decompress((tmp_path / "r2.json.gz").read_bytes()))["traceEvents"]
    assert events == len(copies) == 2 * len(original)
    assert [type(e.get("ts")) for e in copies] == [type(e.get("ts")) for e in original] * 2
    first, second = copies[: len(original)], copies[len(original) :]
    timed = [e for e in first if e.get("ph") != "M" and "ts" in e]
    end = max(e["ts"] + e.get("dur", 0) for e in timed)
    assert min(e["ts"] for e in second if e.get("ph") != "M" and "ts" in e) > end
    assert load_trace(tmp_path / "r2.json.gz").ts_base_us == 0


def test_parse_scale_analysis_child_in_an_app_worker_first_imports_what_the_forkserver_preloads():
    # Both children analyse a real trace and draw it; the worker's imported numba and torch before its baseline.
    trace = ROOT / "tests" / "data" / "sampled_training_rank0.json.gz"
    figures = {}
    for route, flags in (("analysis", []), ("server", ["--preloaded"])):
        command = [sys.executable, "bench/parse_scale.py", "--child-analysis", str(trace), *flags]
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        figures[route] = json.loads(out.stdout)
    assert figures["server"]["events"] == figures["analysis"]["events"] == len(load_trace(trace).events)
    assert figures["server"]["figure_bytes"] == figures["analysis"]["figure_bytes"] > 0
    # numba (~140 MiB) and torch were resident in the worker before the clock: its baseline is far above the CLI's.
    assert figures["server"]["baseline_mib"] > figures["analysis"]["baseline_mib"] + 100
