"""Run Holistic Trace Analysis (HTA) on one trace, in its own virtualenv, in a child process.

    python bench/hta.py TRACE            # prints HTA's breakdowns, wall times and peak RSS as JSON

HTA pins nothing and pulls jupyterlab, so it never enters the app's environment: it lives in
`.venv/hta` (gitignored), made on first use with `HolisticTraceAnalysis==0.5.0`. The child
times HTA's own work only (trace load, then each analysis), not the interpreter's start or
`import hta`, as `bench/hta_compare.py` times ours.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv" / "hta"
HTA_REQUIREMENT = "HolisticTraceAnalysis==0.5.0"
CHILD_TIMEOUT_S = 1800


def hta_python() -> Path:
    """The venv's interpreter, creating the venv and installing HTA on first use."""
    python = VENV / "bin" / "python"
    if not python.exists():
        venv.create(VENV, with_pip=True)
    probe = subprocess.run([str(python), "-c", "import hta"], capture_output=True)
    if probe.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", HTA_REQUIREMENT], check=True)
    return python


def run_hta(trace: Path) -> dict[str, Any]:
    """HTA's kernel, temporal and idle-time breakdowns of `trace`, its wall times (s) and peak RSS (MiB)."""
    done = subprocess.run(
        [str(hta_python()), str(Path(__file__).resolve()), "--child", str(Path(trace).resolve())],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise RuntimeError(f"HTA failed on {trace}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _peak_kib() -> int:
    # VmHWM, not ru_maxrss: it can be read before and after, so the interpreter's and HTA's
    # import footprint is taken off the analysis's peak.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1])
    return 0


def _child_timing(trace: str) -> None:  # runs inside .venv/hta: load + kernel + temporal breakdowns
    import logging
    import tempfile
    import time

    logging.disable(logging.WARNING)
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and str(Path(p).resolve()) != here]
    from hta.trace_analysis import TraceAnalysis

    baseline = _peak_kib()
    with tempfile.TemporaryDirectory() as folder:  # TraceAnalysis reads every trace in a folder
        copy = Path(folder) / Path(trace).name
        copy.symlink_to(trace)  # no second copy of a big file on disk
        start, cpu = time.perf_counter(), time.process_time()
        analyzer = TraceAnalysis(trace_dir=folder)
        loaded = time.perf_counter()
        analyzer.get_gpu_kernel_breakdown(visualize=False)
        kernels_done = time.perf_counter()
        analyzer.get_temporal_breakdown(visualize=False)
        done, cpu = time.perf_counter(), time.process_time() - cpu
    events = sum(len(t) for t in analyzer.t.get_all_traces().values())
    figures = {"load_s": loaded - start, "kernel_breakdown_s": kernels_done - loaded}
    figures |= {"temporal_breakdown_s": done - kernels_done, "seconds": done - start, "cpu_s": cpu, "events": events}
    print(json.dumps(figures | {"peak_mib": _peak_kib() / 1024, "baseline_mib": baseline / 1024}))


def hta_timing_command(trace: Path) -> list[str]:
    """The command that times HTA's load + kernel + temporal breakdowns of `trace` (see `_child_timing`)."""
    return [str(hta_python()), str(Path(__file__).resolve()), "--child-timing", str(Path(trace).resolve())]


def _child(trace: str) -> None:  # runs inside .venv/hta, so only the stdlib and HTA are importable
    import logging
    import resource
    import shutil
    import tempfile
    import time

    logging.disable(logging.WARNING)  # HTA logs every parse step; stdout must hold only our JSON
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and str(Path(p).resolve()) != here]  # else `import hta` finds this file
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as folder:  # TraceAnalysis reads every trace in a folder
        shutil.copy(trace, folder)
        start = time.perf_counter()
        analyzer = TraceAnalysis(trace_dir=folder)
        loaded = time.perf_counter()
        kernel_types, _ = analyzer.get_gpu_kernel_breakdown(visualize=False)
        kernels_done = time.perf_counter()
        temporal = analyzer.get_temporal_breakdown(visualize=False)
        temporal_done = time.perf_counter()
        idle, _ = analyzer.get_idle_time_breakdown(visualize=False)
        idle_done = time.perf_counter()
    result = {
        "kernel_types_us": dict(zip(kernel_types["kernel_type"], map(float, kernel_types["sum"]), strict=True)),
        "temporal_us": {k: float(v) for k, v in temporal.iloc[0].items() if k.endswith("(us)")},
        "idle_us": {str(int(s)): {} for s in idle["stream"].unique()},
        "load_s": loaded - start,
        "kernel_breakdown_s": kernels_done - loaded,
        "temporal_breakdown_s": temporal_done - kernels_done,
        "idle_breakdown_s": idle_done - temporal_done,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    for row in idle.itertuples():
        result["idle_us"][str(int(row.stream))][row.idle_category] = float(row.idle_time)
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--child-timing":
        _child_timing(sys.argv[2])
    elif len(sys.argv) == 2:
        print(json.dumps(run_hta(Path(sys.argv[1])), indent=2))
    else:
        sys.exit("usage: python bench/hta.py TRACE")
