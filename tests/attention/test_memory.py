"""The memory estimate counts every allocation: within 2x of a real run's peak RSS growth, per variant.

Each case runs `prepare()`, three forwards (and backwards) and `reference()` in a child process
(`rss_child.py`) and compares `estimated_bytes()` with VmHWM growth. Shapes are chosen so that every
large tensor is at least 64 MiB: glibc serves those with mmap and returns them on free, so the RSS peak
is the live peak (smaller blocks come from its heap, which keeps freed memory).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attention import AttentionSpec, memory_estimate
from tests.timing_slack import slack

CHILD = Path(__file__).with_name("rss_child.py")
ROOT = Path(__file__).parents[2]
SMALL_REFERENCE_BLOCK = 64 * 1024**2  # lets the forward, not the float64 reference, decide the peak
SHAPE = dict(batch=1, heads=16, seq_len=2048, head_dim=64, device="cpu")


def _measure(fields: dict, block_bytes: int | None) -> dict:
    args = [sys.executable, str(CHILD), json.dumps(fields)] + ([str(block_bytes)] if block_bytes else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=slack(120), check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CASES = [
    (dict(variant="naive"), SMALL_REFERENCE_BLOCK),
    (dict(variant="inplace"), SMALL_REFERENCE_BLOCK),
    (dict(variant="sdpa", backend="math"), SMALL_REFERENCE_BLOCK),
    (dict(variant="sdpa", backend="flash"), SMALL_REFERENCE_BLOCK),
    (dict(variant="sdpa", backend="math", dtype="bfloat16"), SMALL_REFERENCE_BLOCK),  # math upcasts to float32
    (dict(variant="flex"), SMALL_REFERENCE_BLOCK),
    (dict(variant="naive", mode="training"), SMALL_REFERENCE_BLOCK),
    (dict(variant="sdpa", backend="math", mode="training"), SMALL_REFERENCE_BLOCK),
    (dict(variant="sdpa", backend="flash", mode="training"), SMALL_REFERENCE_BLOCK),
    (dict(variant="inplace", kv_heads=2, mask="sliding_window", window=256), SMALL_REFERENCE_BLOCK),
    (dict(variant="sdpa", kv_heads=2, seq_len=4096, q_len=1024), SMALL_REFERENCE_BLOCK),
    (dict(variant="sdpa", backend="flash"), None),  # the float64 reference at its full block
]


@pytest.mark.parametrize(("changes", "block_bytes"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_estimate_is_within_2x_of_measured_peak(changes, block_bytes):
    fields = {**SHAPE, **changes}
    measured = _measure(fields, block_bytes)
    assert measured["growth"] > 100 * 1024**2  # large enough that the comparison means something
    ratio = measured["estimate"] / measured["growth"]
    assert 0.5 <= ratio <= 2, f"{AttentionSpec(**fields).name}: {measured}"


def test_variants_that_mask_by_themselves_build_no_dense_mask():
    shape = dict(seq_len=4096, device="cpu")
    assert memory_estimate(AttentionSpec(variant="naive", **shape)).mask == 4096**2
    for changes in (dict(variant="sdpa"), dict(variant="sdpa", backend="flash"), dict(variant="flex")):
        assert memory_estimate(AttentionSpec(**shape, **changes)).mask == 0
    assert (
        memory_estimate(AttentionSpec(variant="sdpa", mask="padding", valid_len=9, batch=2, **shape)).mask
        == 2 * 4096**2
    )


def test_estimate_ranks_variants_and_grows_with_seq_len():
    spec = AttentionSpec(batch=2, heads=4, seq_len=1024, head_dim=64, device="cpu")
    naive, flash = spec.estimated_bytes(), spec.replace(variant="sdpa", backend="flash").estimated_bytes()
    assert naive > flash
    assert spec.replace(seq_len=2048).estimated_bytes() > naive
    assert spec.replace(mode="training").estimated_bytes() > naive


if __name__ == "__main__":  # print the figures: python tests/attention/test_memory.py
    for changes, block_bytes in CASES:
        fields = {**SHAPE, **changes}
        got = _measure(fields, block_bytes)
        name = f"{AttentionSpec(**fields).name} {changes}"
        print(f"{name:80} measured {got['growth'] / 2**20:7.0f} MiB  estimate {got['estimate'] / 2**20:7.0f} MiB")
