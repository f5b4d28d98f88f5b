"""Run one spec as the runner does, in a fresh process, and print its peak RSS growth as JSON.

Usage: python tests/attention/rss_child.py '{"variant": "naive", ...}' [REFERENCE_BLOCK_BYTES], or a JSON list
of specs, measured one after another in this process (one JSON line each: torch is imported once). A small
reference block lets the forward's own allocations decide the peak. The growth is VmHWM after
`prepare()`, three forwards (and backwards) and `reference()`, minus VmRSS just before, with the
high-water mark reset in between (`/proc/self/clear_refs`, value 5) so torch's import does not count.
A tiny run of the same spec first loads the kernels and libraries the real run would otherwise count.
"""

import contextlib
import ctypes
import json
import sys

import torch

import attention


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def run(spec: attention.AttentionSpec) -> None:
    prepared = attention.prepare(spec)
    with contextlib.nullcontext() if spec.training else torch.no_grad():
        for _ in range(3):
            out = prepared()
            if spec.training:
                prepared.backward(out)
    prepared.reference()


def measure(spec: attention.AttentionSpec) -> dict:
    """Peak RSS growth of one run of `spec`, after a tiny run of it, with the estimate beside it."""
    run(spec.replace(seq_len=16, q_len=min(spec.q_len, 16), window=min(spec.window, 16), valid_len=1))
    # Hand the heap's freed memory back first: a run would otherwise grow into what an earlier one left.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_kib("VmRSS")
    run(spec)
    growth = (status_kib("VmHWM") - before) * 1024
    return {"growth": growth, "estimate": spec.estimated_bytes(), **vars(attention.memory_estimate(spec))}


def main() -> None:
    given = json.loads(sys.argv[1])
    if len(sys.argv) > 2:
        attention.reference.REFERENCE_BLOCK_BYTES = int(sys.argv[2])
    for fields in given if isinstance(given, list) else [given]:
        print(json.dumps(measure(attention.AttentionSpec(**fields))), flush=True)


if __name__ == "__main__":
    main()
