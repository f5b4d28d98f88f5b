"""The README's lessons table, measured: every CPU example of the Profile tab, its figures and its insights.

    python bench/lessons.py            # ~1 minute on 2 cores

Prints, per example, the summary keys the lessons quote (kernels, memory, bytes, bandwidth, the
backend used, the first call) and the insights the run fired.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app import CPU_EXAMPLES, EXAMPLE_INPUTS
from attention import AttentionSpec
from profiling.pipeline import profile_attention

KEYS = (
    *("kernels_per_forward", "forward_unprofiled_ms", "backend_used", "peak_memory_bytes"),
    *("copied_bytes_per_forward", "saved_for_backward_bytes", "kernels_per_backward"),
    *("arithmetic_intensity", "ridge_point", "achieved_gbps", "peak_gbps", "first_call_ms", "first_call_cause"),
)


def spec_of(example: list) -> AttentionSpec:
    fields = dict(zip(EXAMPLE_INPUTS, example, strict=True))
    valid = str(fields.pop("valid_len") or "")
    fields["valid_len"] = tuple(int(v) for v in valid.split(",")) if valid else ()
    return AttentionSpec(**fields, device="cpu")


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        for example in CPU_EXAMPLES:
            spec = spec_of(example)
            summary = profile_attention(spec, out).summary
            print(f"\n== {spec.name} {spec.mode} {spec.dtype} {spec.batch}x{spec.heads}x{spec.seq_len}x{spec.head_dim} "
                  f"kv_heads={spec.kv_heads} q_len={spec.q_len} mask={spec.mask}")  # fmt: skip
            print("   " + " · ".join(f"{key} {summary.get(key)}" for key in KEYS))
            for text in summary["insights"]:
                print(f"   - {text}")


if __name__ == "__main__":
    main()
