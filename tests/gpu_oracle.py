"""Plain readings of the raw Kineto traces in tests/data/gpu: the acceptance tests' own reference.

Every function here is a loop over `json.load(gzip.open(path))["traceEvents"]` and shares no code with
`profiling/`, so a number the analysis reports and a number read here agree only if both are right.
The name substrings follow tests/data/gpu/README.md ("fused attention = the kernels whose names are
FlashAttention, fmha, AOTriton attn_fwd or paged attention; tensor-core share = GEMM and attention
kernels that run on tensor or matrix cores, by their names").
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
# Fused attention kernels by name (README). `flash` alone would take vLLM's reshape_and_cache_flash_kernel
# (a KV-cache write) and SGLang's create_flashinfer_kv_indices_triton, which are not attention.
FUSED_ATTENTION = ("flash_fwd", "flash_bwd", "FlashAttn", "fmha", "attn_fwd", "attn_bwd", "paged_attention")
# Kernels on tensor (NVIDIA) or matrix (AMD) cores, by name: CUTLASS tensorop, cuBLAS xmma and nvjet,
# TRT-LLM's bmm_ (MXFP4/FP8), Tensile's MI<m>x<n>x<k> matrix instruction, MFMA, and the fused attention
# kernels that use them. The paged-attention reduce kernel is plain SIMT work and stays out.
TENSOR_CORE = ("tensorop", "xmma", "nvjet", "bmm_", "_MI16x16", "_MI32x32", "mfma", "flash_fwd", "fmha", "attn_fwd")
COLLECTIVES = ("nccl", "rccl", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "multimem")
GEMM_OPS = ("aten::bmm", "aten::matmul", "aten::baddbmm", "aten::einsum")
SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::_masked_softmax")
# Ops that may sit between the GEMMs and the softmax of an unfused attention: elementwise or metadata only.
BETWEEN_OPS = frozenset(
    f"aten::{name}"
    for name in (
        *("view", "_unsafe_view", "reshape", "transpose", "permute", "t", "expand", "expand_as", "as_strided"),
        *("unsqueeze", "squeeze", "contiguous", "clone", "copy_", "empty", "empty_like", "detach", "alias"),
        *("div", "div_", "mul", "mul_", "add", "add_", "sub", "sub_", "masked_fill", "masked_fill_", "where"),
        *("dropout", "native_dropout", "feature_dropout", "to", "_to_copy", "scalar_tensor", "lift_fresh"),
    )
)
SYNC_CALLS = (
    "cudaMemcpy",
    "hipMemcpy",
    "hipMemcpyWithStream",
    "cudaStreamSynchronize",
    "hipStreamSynchronize",
    "cudaDeviceSynchronize",
    "hipDeviceSynchronize",
)
_FLOAT = re.compile(r"(?<![A-Za-z0-9_])float(?![A-Za-z0-9_])")
_ELEMENTWISE = re.compile(r"elementwise|reduce_kernel|copy_kernel")
ITEMSIZE = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "bool": 1, "long int": 8, "int": 4}


def percent(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


def has_any(name: str, needles: Iterable[str]) -> bool:
    return any(n in name for n in needles)


def is_fused_attention(name: str) -> bool:
    return has_any(name, FUSED_ATTENTION)


def is_tensor_core(name: str) -> bool:
    return has_any(name, TENSOR_CORE)


def is_collective(name: str) -> bool:
    return has_any(name.lower(), COLLECTIVES)


def function_name(name: str) -> str:
    """A kernel's name without its parameter list (where library namespaces such as `fbgemm_gpu::` appear):
    up to the first `(` outside template brackets (`std::enable_if<!(false), void>::type f<...>(...)`)."""
    depth = 0
    for i, c in enumerate(name):
        depth += (c == "<") - (c == ">")
        if c == "(" and depth == 0:
            return name[:i]
    return name


def is_gemm_or_conv(name: str) -> bool:
    """A GEMM, GEMV or convolution kernel by its function name: `fbgemm` (a library) is none of them."""
    own = function_name(name).replace("fbgemm", "")
    return bool(re.search(r"gemm|gemv|conv|scudnn|xmma|nvjet|Cijk", own, re.I))


def is_fp32_elementwise(name: str) -> bool:
    """An elementwise or reduction kernel on FP32 data, by its name: `float` as a type of its own (a BF16
    kernel's name carries `c10::BFloat16`, with `float` only as its math type), and no GEMM."""
    return bool(_ELEMENTWISE.search(name) and _FLOAT.search(name)) and "BFloat16" not in name and "Half" not in name


def numel(shape: Any) -> int | None:
    if not isinstance(shape, list) or not shape or not all(isinstance(d, int) for d in shape):
        return None
    n = 1
    for d in shape:
        n *= d
    return n


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the overlap of two merged, sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def end(e: dict) -> float:
    return e["ts"] + e.get("dur", 0)


@dataclass
class Copy:
    """One copy and the ops around its launch, outermost first."""

    event: dict
    launch: dict | None
    ancestors: list[str]

    @property
    def bytes(self) -> int:
        return int(self.event.get("args", {}).get("bytes", 0))


@dataclass
class RawTrace:
    path: Path
    events: list[dict]
    device_properties: list[dict] = field(default_factory=list)

    # -- the event kinds ------------------------------------------------------------------------------
    def complete(self, *categories: str) -> list[dict]:
        return [e for e in self.events if e.get("ph") == "X" and e.get("cat") in categories]

    @cached_property
    def kernels(self) -> list[dict]:
        return self.complete("kernel")

    @cached_property
    def gpu(self) -> list[dict]:
        return self.complete(*GPU_CATEGORIES)

    @cached_property
    def ops(self) -> list[dict]:
        return self.complete("cpu_op")

    @cached_property
    def launches(self) -> list[dict]:
        return self.complete(*LAUNCH_CATEGORIES)

    @cached_property
    def kernel_us(self) -> float:
        return sum(e["dur"] for e in self.kernels)

    @cached_property
    def gpu_us(self) -> float:
        """Σ dur of kernel, memcpy and memset events: what a finding's gpu_time_percent divides by."""
        return sum(e["dur"] for e in self.gpu)

    def kernel_share(self, keep: Callable[[str], bool]) -> float:
        """Percent of kernel time in kernels whose name `keep` accepts."""
        return percent(sum(e["dur"] for e in self.kernels if keep(e["name"])), self.kernel_us)

    def gpu_share_of(self, events: Iterable[dict]) -> float:
        return percent(sum(e["dur"] for e in events), self.gpu_us)

    def per_name(self) -> dict[str, tuple[int, float]]:
        """(count, Σ dur) per GPU activity name: kernels, memcpys and memsets."""
        table: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for e in self.gpu:
            table[e["name"]][0] += 1
            table[e["name"]][1] += e["dur"]
        return {name: (c, d) for name, (c, d) in table.items()}

    def op_calls(self) -> dict[str, int]:
        """Calls per op name, an op that is the only child of a same-name op counted with it, as torch's
        `EventList._remove_dup_nodes` does for `key_averages`."""
        by_id = {id(e): e for e in self.ops}
        child_count: dict[int, int] = defaultdict(int)
        for e in self.ops:
            if (p := self.op_parent[id(e)]) is not None:
                child_count[p] += 1
        calls: dict[str, int] = defaultdict(int)
        for e in self.ops:
            p = self.op_parent[id(e)]
            if p is not None and by_id[p]["name"] == e["name"] and child_count[p] == 1:
                continue
            calls[e["name"]] += 1
        return dict(calls)

    # -- launches and the ops around them -------------------------------------------------------------
    @cached_property
    def launch_of(self) -> dict[Any, dict]:
        return {e.get("args", {}).get("correlation"): e for e in self.launches}

    @cached_property
    def gpu_of_correlation(self) -> dict[Any, list[dict]]:
        table: dict[Any, list[dict]] = defaultdict(list)
        for e in self.gpu:
            table[e.get("args", {}).get("correlation")].append(e)
        return table

    @cached_property
    def _lane(self) -> dict[Any, list[dict]]:
        """Ops and Python functions per thread, by start time, longest first."""
        lanes: dict[Any, list[dict]] = defaultdict(list)
        for e in self.complete("cpu_op", "python_function", "user_annotation"):
            lanes[e["tid"]].append(e)
        for lane in lanes.values():
            lane.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        return lanes

    def around(self, tid: Any, ts: float, categories: tuple[str, ...] = ("cpu_op",)) -> list[dict]:
        """The events of `categories` on thread `tid` whose span holds `ts`, outermost first."""
        return [e for e in self._lane.get(tid, []) if e["cat"] in categories and e["ts"] <= ts <= end(e)]

    @cached_property
    def launch_ancestors(self) -> dict[int, list[str]]:
        """id(launch) -> names of the ops, Python functions and annotations around it on its thread, outermost
        first: one sweep per thread with a stack of the spans still open."""
        found: dict[int, list[str]] = {}
        launches: dict[Any, list[dict]] = defaultdict(list)
        for e in self.launches:
            launches[e["tid"]].append(e)
        for tid, lane in launches.items():
            spans = self._lane.get(tid, [])
            stack: list[dict] = []
            i = 0
            for launch in sorted(lane, key=lambda e: e["ts"]):
                while i < len(spans) and spans[i]["ts"] <= launch["ts"]:
                    while stack and end(stack[-1]) < spans[i]["ts"]:
                        stack.pop()
                    stack.append(spans[i])
                    i += 1
                found[id(launch)] = [e["name"] for e in stack if end(e) >= launch["ts"]]
        return found

    def copies(self) -> list[Copy]:
        """Every Memcpy with the ops around the runtime call that launched it."""
        found = []
        for e in self.complete("gpu_memcpy"):
            launch = self.launch_of.get(e.get("args", {}).get("correlation"))
            names = [a["name"] for a in self.around(launch["tid"], launch["ts"])] if launch else []
            found.append(Copy(e, launch, names))
        return found

    @cached_property
    def _launches_by_tid(self) -> dict[Any, tuple[list[float], list[dict]]]:
        lanes: dict[Any, list[dict]] = defaultdict(list)
        for e in self.launches:
            lanes[e["tid"]].append(e)
        return {
            tid: ([e["ts"] for e in lane], lane)
            for tid, lane in ((t, sorted(v, key=lambda e: e["ts"])) for t, v in lanes.items())
        }

    def gpu_launched_within(self, op: dict) -> list[dict]:
        """The GPU activity whose runtime launch starts inside `op`'s span on its thread."""
        starts, lane = self._launches_by_tid.get(op["tid"], ([], []))
        lo, hi = bisect.bisect_left(starts, op["ts"]), bisect.bisect_right(starts, end(op))
        return [g for launch in lane[lo:hi] for g in self.gpu_of_correlation.get(launch["args"].get("correlation"), [])]

    # -- op trees -------------------------------------------------------------------------------------
    @cached_property
    def op_parent(self) -> dict[int, int | None]:
        """id(op) -> id of the innermost cpu_op around it on its thread (None at the top)."""
        parent: dict[int, int | None] = {}
        lanes: dict[Any, list[dict]] = defaultdict(list)
        for e in self.ops:
            lanes[e["tid"]].append(e)
        for lane in lanes.values():
            stack: list[dict] = []
            for e in sorted(lane, key=lambda e: (e["ts"], -e.get("dur", 0))):
                while stack and not (e["ts"] < end(stack[-1]) and end(e) <= end(stack[-1])):
                    stack.pop()
                parent[id(e)] = id(stack[-1]) if stack else None
                if e.get("dur", 0) > 0:
                    stack.append(e)
        return parent

    def children(self) -> dict[tuple[Any, int | None], list[dict]]:
        groups: dict[tuple[Any, int | None], list[dict]] = defaultdict(list)
        for e in self.ops:
            groups[(e["tid"], self.op_parent[id(e)])].append(e)
        for group in groups.values():
            group.sort(key=lambda e: e["ts"])
        return groups

    def unfused_matches(self) -> list[tuple[dict, dict, dict]]:
        """GEMM, softmax, GEMM under one parent on one thread, only elementwise or metadata ops between, the
        second GEMM's first input as big as the softmax's output (a view may reshape it: nn.MultiheadAttention
        runs the softmax on [b, h, q, k] and bmm on [b*h, q, k])."""
        matches = []
        for siblings in self.children().values():
            gemm: dict | None = None
            softmax: dict | None = None
            for op in siblings:
                name = op["name"]
                if name in SOFTMAX_OPS and gemm is not None:
                    softmax = op
                elif self._is_gemm(op):
                    if softmax is not None and gemm is not None and self._takes(op, softmax):
                        matches.append((gemm, softmax, op))
                        gemm, softmax = None, None
                    else:
                        gemm, softmax = op, None
                elif name not in BETWEEN_OPS:
                    gemm, softmax = None, None
        return matches

    @staticmethod
    def _is_gemm(op: dict) -> bool:
        if op["name"] == "aten::einsum":
            dims = op.get("args", {}).get("Input Dims") or []
            return any(isinstance(d, list) and len(d) >= 3 for d in dims[1:])
        return op["name"] in GEMM_OPS

    @staticmethod
    def _takes(gemm: dict, softmax: dict) -> bool:
        g, s = gemm.get("args", {}).get("Input Dims") or [], softmax.get("args", {}).get("Input Dims") or []
        return bool(g and s) and numel(g[0]) is not None and numel(g[0]) == numel(s[0])

    def unfused_attention_kernels(self) -> list[dict]:
        """Kernels launched by the three ops of every unfused match."""
        seen: dict[int, dict] = {}
        for match in self.unfused_matches():
            for op in match:
                for g in self.gpu_launched_within(op):
                    if g["cat"] == "kernel":
                        seen[id(g)] = g
        return list(seen.values())

    # -- time on the GPU and the host -----------------------------------------------------------------
    def gpu_busy(self) -> list[tuple[float, float]]:
        return union((e["ts"], end(e)) for e in self.gpu)

    def idle(self) -> list[tuple[float, float]]:
        """Gaps between merged GPU activity, from the first to the last."""
        busy = self.gpu_busy()
        return [(a[1], b[0]) for a, b in itertools.pairwise(busy) if b[0] > a[1]]

    def blocking_syncs(self) -> list[dict]:
        return [e for e in self.launches if e["name"] in SYNC_CALLS]

    def steps(self) -> list[dict]:
        return [e for e in self.complete("user_annotation", "cpu_op") if str(e["name"]).startswith("ProfilerStep")]

    def steps_span(self) -> float:
        """From the first ProfilerStep's start to the last one's end; without any, the TensorBoard plugin's
        fallback step: from the first CPU op's start to the last one's end."""
        spans = self.steps() or self.ops
        return max(end(e) for e in spans) - min(e["ts"] for e in spans)

    def communication(self) -> tuple[float, float]:
        """Collectives' share of kernel time (%), and HTA's overlap: |∪comm ∩ ∪comp| / |∪comm| (%)."""
        comm = [e for e in self.kernels if is_collective(e["name"])]
        comp = [e for e in self.kernels if not is_collective(e["name"])]
        comm_union, comp_union = union((e["ts"], end(e)) for e in comm), union((e["ts"], end(e)) for e in comp)
        return self.kernel_share(is_collective), percent(intersection(comm_union, comp_union), length(comm_union))

    def launch_stats(self) -> tuple[int, float, float]:
        """Kernels, their median duration (µs), and the median gap between consecutive kernels on the
        stream with the most kernel time (µs)."""
        streams: dict[Any, list[dict]] = defaultdict(list)
        for e in self.kernels:
            streams[e["args"].get("stream")].append(e)
        busiest = max(streams.values(), key=lambda lane: sum(e["dur"] for e in lane))
        busiest.sort(key=lambda e: e["ts"])
        gaps = [max(0.0, b["ts"] - end(a)) for a, b in itertools.pairwise(busiest)]
        return len(self.kernels), statistics.median(e["dur"] for e in self.kernels), statistics.median(gaps)


def op_bytes(op: dict) -> int:
    """Bytes of an op's first input, from its Input Dims and Input type."""
    args = op.get("args", {})
    dims, types = args.get("Input Dims") or [[]], args.get("Input type") or ["float"]
    return (numel(dims[0]) or 0) * ITEMSIZE.get(types[0], 4)


def load(path: str | Path) -> RawTrace:
    with gzip.open(path) as f:
        data = json.load(f)
    return RawTrace(Path(path), data["traceEvents"], data.get("deviceProperties") or [])
