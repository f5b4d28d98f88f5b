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
from profiling.runner import RunError, profile_attention

RUNS = (
    ("naive", "auto"),
    ("inplace", "auto"),
    ("sdpa", "math"),
    ("sdpa", "flash"),
    ("sdpa", "efficient"),
    ("sdpa", "cudnn"),
)
TIMED_CALLS = 20


def event_ms(spec: AttentionSpec) -> float:
    """Mean time of one forward between CUDA events (wall clock with a sync on CPU)."""
    q, k, v = attention.make_inputs(spec)
    mask = attention.causal_mask(spec.seq_len, spec.device)
    fn = attention.build(spec)
    times = []
    with torch.no_grad():
        for _ in range(3):
            fn(q, k, v, mask=mask, backend=spec.backend)
        for _ in range(TIMED_CALLS):
            if spec.device == "cuda":
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(q, k, v, mask=mask, backend=spec.backend)
                stop.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(stop))
            else:
                t0 = time.perf_counter()
                fn(q, k, v, mask=mask, backend=spec.backend)
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, default=None, help="where the gzipped traces go")
    args = parser.parse_args()
    base = AttentionSpec(
        batch=args.batch,
        heads=args.heads,
        seq_len=args.seq_len,
        head_dim=args.head_dim,
        dtype=args.dtype,
        device=args.device,
    )
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
