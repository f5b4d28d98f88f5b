"""What every rule shares: the evidence it reads, the finding it returns, and how a finding is written.

A rule reads one `Evidence` (the ops and GPU activity inside the forwards, or inside the whole trace
for an upload) and returns a `Finding`, or None where its evidence is absent. `Insight` is a finding
with the rule's name, and `Insight.record()` is the JSON-native form the summaries carry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from profiling.kernels import MAX_NAMES_DECODED
from profiling.occupancy import whole_number
from profiling.trace import Trace
from profiling.windows import FORWARD, WHOLE_TRACE, WindowStats

NAME_IN_PROSE = 120  # characters of a trace's name quoted in a sentence (and in evidence)
NAME_IN_LIST = 60  # ... in a list of several
MAX_NAMES_IN_PROSE = 3
MAX_NOTES = 10  # notes on skipped values kept in a finding's evidence (their count is kept whole)
MAX_EVIDENCE_ITEMS = 10  # items of any list in a finding's evidence
MAX_EVIDENCE_KEYS = 50  # keys of any mapping in it (rules key them by op or kernel name)
# Bytes one tensor or copy can hold: sizes are int64 in torch, and no device has 2^63 bytes.
MAX_TENSOR_BYTES = 2**63 - 1
MAX_DIMS = 64  # dimensions of one tensor (torch's own limit is lower)
# Bytes per element of each `Input type` spelling torch writes (c10's type names; "long" in older traces).
ITEMSIZE = {
    **{"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "bool": 1, "long int": 8, "long": 8, "int": 4},
    **{"short": 2, "signed char": 1, "unsigned char": 1, "c10::complex<float>": 8, "c10::complex<double>": 16},
    **{f"c10::Float8_{kind}": 1 for kind in ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e8m0fnu")},
}


@dataclass(frozen=True)
class Finding:
    """What a rule found: a short title, the evidence in words, and the numbers behind it.

    `gpu_time_percent` is the share of all GPU time (kernels, memcpys and memsets) spent in the
    GPU events the finding is about (`gpu_share`), or None where it is about no GPU events.
    """

    title: str
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)
    gpu_time_percent: float | None = None


@dataclass(frozen=True)
class Insight:
    """A finding with the name of the rule (from `RULES`) that made it. Plain text, never markup."""

    rule: str
    title: str
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)
    gpu_time_percent: float | None = None

    @property
    def text(self) -> str:
        return f"{self.title}: {self.detail}"

    def record(self) -> dict[str, Any]:
        """The finding as the summaries carry it: JSON-native values only (`jsonable`), no NaN."""
        return {
            "rule": self.rule,
            "title": self.title,
            "detail": self.detail,
            "evidence": jsonable(self.evidence),
            "gpu_time_percent": jsonable(self.gpu_time_percent),
        }


def jsonable(value: Any) -> Any:
    """`value` as JSON-native data a client can read at a glance: lists (and tuples, sets, arrays) cut to
    MAX_EVIDENCE_ITEMS and mappings to MAX_EVIDENCE_KEYS, text cut to NAME_IN_PROSE characters, numpy
    scalars as Python numbers, NaN and infinities as None, keys as text; anything else as its cut text."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return short(value)
    if isinstance(value, Mapping):
        return {short(str(k)): jsonable(v) for k, v in list(value.items())[:MAX_EVIDENCE_KEYS]}
    if isinstance(value, (list, tuple, set, frozenset, np.ndarray, pd.Series)):
        items = list(value)[:MAX_EVIDENCE_ITEMS]
        return [jsonable(v) for v in items]
    return short(str(value))


def gpu_share(ev: Evidence, busy_us: float) -> float | None:
    """`busy_us` as a percentage of all GPU time in the trace: Σ dur of kernel, memcpy and memset events."""
    total = ev.gpu_time_us
    return 100.0 * busy_us / total if total > 0 else None


@dataclass
class Evidence:
    """Everything a rule may read."""

    trace: Trace
    scope: WindowStats
    kernels: pd.DataFrame
    spec: Any | None = None  # our run's AttentionSpec; None for uploads
    numbers: Mapping[str, Any] = field(default_factory=dict)  # our run's summary (its insights not yet in)
    backward: WindowStats | None = None  # training runs: the `attn_bwd` windows

    @property
    def dtype(self) -> str | None:
        return self.spec.dtype if self.spec else None

    @property
    def device(self) -> str | None:
        return self.spec.device if self.spec else None

    @property
    def unprofiled_ms(self) -> float | None:
        return self.numbers.get("forward_unprofiled_ms")

    @cached_property
    def gpu_time_us(self) -> float:
        """Σ dur of every kernel, memcpy and memset in the trace: what `gpu_time_percent` divides by."""
        return float(np.nansum(self.trace.gpu_activity["dur"].to_numpy()))

    @property
    def per(self) -> float:
        return max(self.scope.count, 1)

    @property
    def whole_trace(self) -> bool:
        return self.scope.name == WHOLE_TRACE

    @property
    def unit(self) -> str:
        """How counts are phrased: per forward for our runs, in the trace for an upload."""
        return (
            "in the trace"
            if self.whole_trace
            else f"per {self.scope.name}"
            if self.scope.name != FORWARD
            else "per forward"
        )

    def ops_named(self, *names: str) -> pd.DataFrame:
        return self.scope.ops[self.scope.ops["name"].isin(names)]

    def has_op(self, name: str) -> bool:
        return bool((self.scope.ops["name"] == name).any())


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def tensor_bytes(dims: Any, types: Any) -> int | None:
    """Bytes of an op's first input from its `Input Dims` and `Input type`: 0 where the trace gives no
    shape, None where what it gives is no tensor (dims that are not whole numbers, more than 2^63 bytes,
    a type that is not a name)."""
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list):
        return 0
    if isinstance(types, list) and types:
        if not isinstance(types[0], str):
            return None
        itemsize = ITEMSIZE.get(types[0], 4)
    else:
        itemsize = 4
    shape = dims[0]
    if len(shape) > MAX_DIMS or not all(whole_number(d, MAX_TENSOR_BYTES, smallest=0) for d in shape):
        return None
    size = itemsize
    for d in shape:  # exact integers, stopping as soon as the tensor could not exist
        size *= int(d)
        if size > MAX_TENSOR_BYTES:
            return None
    return size


def short(name: Any, limit: int = NAME_IN_PROSE) -> str:
    """A trace's name cut for prose: real CUTLASS names pass 1 kB, hostile ones 100 kB."""
    text = str(name)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def left_out(count: int, what: str, why: str = "their Input Dims or Input type describe no tensor") -> dict:
    """Evidence that says what was left out of a finding's numbers, and why; nothing when nothing was."""
    return {"note": f"{count} {what} left out: {why}"} if count else {}


def names_decoded(gpu: pd.DataFrame) -> tuple[list[str], bool]:
    """The distinct names a rule decodes, in order of first appearance: the MAX_NAMES_DECODED with the
    most time; and whether others were left out."""
    if not len(gpu):
        return [], False
    per_name = gpu.groupby("name", sort=False)["dur"].sum()
    if len(per_name) <= MAX_NAMES_DECODED:
        return per_name.index.tolist(), False
    keep = np.zeros(len(per_name), dtype=bool)
    keep[np.argsort(-per_name.to_numpy(), kind="stable")[:MAX_NAMES_DECODED]] = True
    return per_name.index[keep].tolist(), True


@dataclass(frozen=True)
class Rule:
    name: str
    applies_to: str  # what it looks for, shown in the README's rule list
    check: Callable[[Evidence], Finding | None]
