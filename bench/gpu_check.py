"""The GPU check: the blog's six variants at its shape, checked against CUDA-event timing.

Runs with only torch and pandas (no gradio, no plotly), as on a bare GPU image:

    PYTHONPATH=. python3 bench/gpu_check.py --out DIR          # 8x16x1024x64 bf16 on CUDA
    PYTHONPATH=. python3 bench/gpu_check.py --device cpu --seq-len 64   # a smoke run anywhere

Prints per variant: kernels per forward, forward device and CPU time, the kernels with their
decoding, the insights, and the ratio of the profiler's device time to CUDA events (goal ±5%).
Writes each run's trace, gzipped, to DIR as <gpu>_<run>.json.gz for tests/data/.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import attention
from attention import AttentionSpec, SpecError
from profiling.__main__ import add_shape_args, spec_from_args
from profiling.compare import COMPARED
from profiling.pipeline import profile_attention
from profiling.runner import RunError

RUNS = COMPARED[:6]  # the blog's six: naive, in-place, SDPA math/flash/efficient/cuDNN
TIMED_CALLS = 20


def event_ms(spec: AttentionSpec) -> float:
    """Median time of one forward between CUDA events (wall clock on the CPU)."""
    forward = attention.prepare(spec)
    times = []
    with torch.no_grad():
        for _ in range(3):
            forward()
        for _ in range(TIMED_CALLS):
            if spec.device == "cuda":
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                forward()
                stop.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(stop))
            else:
                t0 = time.perf_counter()
                forward()
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(parser, preset="blog", device="cuda")
    parser.add_argument("--out", type=Path, default=None, help="where the gzipped traces go")
    args = parser.parse_args()
    try:
        base = spec_from_args(args)
    except SpecError as exc:
        sys.exit(f"gpu_check: {exc}")
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    tag = gpu.split()[-1].lower().replace("-", "") if args.device == "cuda" else "cpu"
    print(f"{gpu} · torch {torch.__version__} · {base.batch}x{base.heads}x{base.seq_len}x{base.head_dim} {base.dtype}")
    with tempfile.TemporaryDirectory() as tmp:
        for variant, backend in RUNS:
            spec = base.replace(variant=variant, backend=backend)
            try:
                result = profile_attention(spec, tmp)
            except (SpecError, RunError) as exc:
                print(f"\n== {spec.name}: unavailable: {exc}")
                continue
            s = result.summary
            measured = s["forward_device_ms"] if s["forward_device_ms"] is not None else s["forward_unprofiled_ms"]
            events = event_ms(spec)
            print(
                f"\n== {spec.name}: {s['kernels_per_forward']:g} kernels/forward · "
                f"device {s['forward_device_ms']} ms · cpu {s['forward_cpu_ms']} ms · "
                f"unprofiled {s['forward_unprofiled_ms']} ms · "
                f"events {events:.4f} ms · profiler/events {measured / events:.3f} · "
                f"peak {s['peak_memory_bytes'] / 2**20:.1f} MiB · err {s['max_abs_error']:.2e}"
            )
            table = result.kernel_table
            if len(table):
                for row in table.itertuples():
                    print(f"   {row._4:5.2f}/fwd {row._5:10.1f} us  {str(row.name)[:90]}\n{'':22}{row.meaning}")
            for text in s["insights"]:
                print(f"   - {text}")
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                with (
                    result.trace_path.open("rb") as src,
                    gzip.open(args.out / f"{tag}_{spec.name}.json.gz", "wb") as dst,
                ):
                    shutil.copyfileobj(src, dst)


if __name__ == "__main__":
    main()
