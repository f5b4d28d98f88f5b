"""The GPU check: the blog's six variants at its shape, checked against CUDA-event timing, then the
practitioner's runs (training, GQA, decode, a sliding window) at the same shape.

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
from profiling.pipeline import RunResult, profile_attention
from profiling.runner import RunError

TIMED_CALLS = 20
# Beyond the blog: (file tag, variant, backend, spec fields). Decode keeps the blog's KV length.
PRACTICE_RUNS: tuple[tuple[str, str, str, dict[str, object]], ...] = (
    ("train-naive", "naive", "auto", {"mode": "training"}),
    ("train-sdpa-flash", "sdpa", "flash", {"mode": "training"}),
    ("gqa-naive", "naive", "auto", {"kv_heads": "heads/4"}),
    ("gqa-sdpa-auto", "sdpa", "auto", {"kv_heads": "heads/4"}),
    ("decode-sdpa-auto", "sdpa", "auto", {"q_len": 1}),
    ("decode-top-left-sdpa-auto", "sdpa", "auto", {"q_len": 1, "mask": "causal_top_left"}),
    ("window-sdpa-auto", "sdpa", "auto", {"mask": "sliding_window", "window": "seq_len/4"}),
)


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


def report(name: str, spec: AttentionSpec, result: RunResult, out: Path | None, tag: str) -> None:
    """Prints one run's figures, kernels and insights; copies its trace, gzipped, to `out`."""
    s = result.summary
    measured = s["forward_device_ms"] if s["forward_device_ms"] is not None else s["forward_unprofiled_ms"]
    events = event_ms(spec)
    print(
        f"\n== {name}: {s['kernels_per_forward']:g} kernels/forward · "
        f"device {s['forward_device_ms']} ms · cpu {s['forward_cpu_ms']} ms · "
        f"unprofiled {s['forward_unprofiled_ms']} ms · "
        f"events {events:.4f} ms · profiler/events {measured / events:.3f} · "
        f"peak {s['peak_memory_bytes'] / 2**20:.1f} MiB · err {s['max_abs_error']:.2e} · "
        f"backend used {s.get('backend_used')}"
    )
    if spec.mode == "training":
        print(
            f"   backward device {s.get('backward_device_ms')} ms · {s.get('kernels_per_backward')} kernels/backward · "
            f"saved for backward {s.get('saved_for_backward_bytes')} B · grad err {s.get('max_abs_grad_error')}"
        )
    for row in result.kernel_table.to_dict("records"):
        print(f"   {row['per forward']:5.2f}/fwd {row['total (us)']:10.1f} us  {str(row['name'])[:90]}")
        print(f"{'':22}{row['meaning']}")
    for text in s["insights"]:
        print(f"   - {text}")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        with result.trace_path.open("rb") as src, gzip.open(out / f"{tag}_{name}.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)


def runs(base: AttentionSpec) -> list[tuple[str, str, str, dict[str, object]]]:
    """(name, variant, backend, fields) for the blog's six, then the practitioner's runs."""
    blog = [(attention.run_label(v, b), v, b, {}) for v, b in attention.BLOG_RUNS]
    # Sizes that follow the shape: a quarter of the heads share K and V, a window of a quarter of the keys.
    scaled = {"seq_len/4": max(1, base.seq_len // 4), "heads/4": max(1, base.heads // 4)}
    practice = [(n, v, b, {k: scaled.get(x, x) for k, x in f.items()}) for n, v, b, f in PRACTICE_RUNS]
    return blog + practice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(parser, preset="blog", device="cuda")
    parser.add_argument("--out", type=Path, default=None, help="where the gzipped traces go")
    args = parser.parse_args()
    try:
        base = spec_from_args(args)
    except SpecError as exc:
        sys.exit(f"gpu_check: {exc}")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: device: cuda was asked for, but this machine has no CUDA GPU")
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    tag = gpu.split()[-1].lower().replace("-", "") if args.device == "cuda" else "cpu"
    print(f"{gpu} · torch {torch.__version__} · {base.batch}x{base.heads}x{base.seq_len}x{base.head_dim} {base.dtype}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, variant, backend, fields in runs(base):
            try:
                spec = base.replace(variant=variant, backend=backend, **fields)
                result = profile_attention(spec, tmp)
            except (SpecError, RunError) as exc:
                print(f"\n== {name}: unavailable: {exc}")
                continue
            report(name, spec, result, args.out, tag)


if __name__ == "__main__":
    main()
