"""The blog's table on this device: every variant on one shape, side by side, in one process.

python bench/compare.py                 # blog shape 8x16x1024x64 bf16 on a GPU; 2x8x512x64 fp32 on CPU
python bench/compare.py --seq-len 1024  # any shape flag of `python -m profiling run`
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from attention import AttentionSpec
from profiling.compare import compare, compare_table

GPU_SHAPE = dict(batch=8, heads=16, seq_len=1024, head_dim=64, dtype="bfloat16")
CPU_SHAPE = dict(batch=2, heads=8, seq_len=512, head_dim=64, dtype="float32")


def main() -> None:
    cuda = torch.cuda.is_available()
    shape = dict(GPU_SHAPE if cuda else CPU_SHAPE)
    parser = argparse.ArgumentParser(description=__doc__)
    for key, value in shape.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    spec = AttentionSpec(**vars(args), device="cuda" if cuda else "cpu")
    device = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"{time.strftime('%Y-%m-%d')} · {device} · torch {torch.__version__} · "
        f"{spec.batch}x{spec.heads}x{spec.seq_len}x{spec.head_dim} {spec.dtype}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        rows = compare(spec, tmp)
    table = compare_table(rows)
    table["what the trace revealed"] = table["what the trace revealed"].str.slice(0, 60)
    with_device = "forward device (ms)" in table
    columns = [
        "run",
        "kernels/forward",
        "forward cpu (ms)",
        "unprofiled (ms)",
        "peak memory (MiB)",
        "max abs error",
        "speed-up vs naive",
    ]
    if with_device:
        columns.insert(3, "forward device (ms)")
    print(table[columns].to_string(index=False))
    for row in rows:
        if "error" in row:
            print(f"  {row['variant']}/{row['backend']}: {row['error']}")


if __name__ == "__main__":
    main()
