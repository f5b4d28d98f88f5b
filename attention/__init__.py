"""Attention variants behind one registry, as transformers' `ALL_ATTENTION_FUNCTIONS`.

`registry` names every variant and run; `spec` is the pure run specification; `support` says why a
spec cannot run and holds the explicit `preflight`; `prepare` binds a spec to its inputs and mask.
"""

from attention.backends import backend_reasons
from attention.errors import SpecError
from attention.flex import block_sparsity
from attention.masks import MASKS
from attention.memory import MemoryEstimate, memory_estimate
from attention.prepared import Prepared, build, make_inputs, prepare, upstream_gradient
from attention.reference import REFERENCE_BLOCK_BYTES, Reference, reference_attention
from attention.registry import (
    BACKENDS,
    BLOG_RUNS,
    RUN_CHOICES,
    RUN_NAMES,
    RUNS,
    VARIANT_CHOICES,
    VARIANTS,
    AttentionFn,
    Variant,
    parse_run,
    parse_runs,
    parse_seq_lens,
    run_label,
)
from attention.sdpa import SDPA_BACKENDS
from attention.spec import DEVICES, DTYPES, LIMITS, MODES, PRESETS, AttentionSpec, format_bytes
from attention.support import admit_run, memory_budget, preflight, refusal, unsupported

__all__ = [
    "BACKENDS",
    "BLOG_RUNS",
    "DEVICES",
    "DTYPES",
    "LIMITS",
    "MASKS",
    "MODES",
    "PRESETS",
    "REFERENCE_BLOCK_BYTES",
    "RUNS",
    "RUN_CHOICES",
    "RUN_NAMES",
    "SDPA_BACKENDS",
    "VARIANTS",
    "VARIANT_CHOICES",
    "AttentionFn",
    "AttentionSpec",
    "MemoryEstimate",
    "Prepared",
    "Reference",
    "SpecError",
    "Variant",
    "admit_run",
    "backend_reasons",
    "block_sparsity",
    "build",
    "format_bytes",
    "make_inputs",
    "memory_budget",
    "memory_estimate",
    "parse_run",
    "parse_runs",
    "parse_seq_lens",
    "preflight",
    "prepare",
    "reference_attention",
    "refusal",
    "run_label",
    "unsupported",
    "upstream_gradient",
]
