"""FP32 work in a low-precision model: GEMM precision, and the FP32 kernels that float upcasts feed.

A bf16 model still runs some math in FP32 where its code upcasts: transformers' RMSNorm does
`hidden_states.to(torch.float32)`, then pow, mean, add, rsqrt and mul in FP32, then casts back.
Each step is its own elementwise or reduction kernel moving 4-byte floats. On the H100 Qwen prefill
of tests/data/gpu that chain holds about 19% of GPU time, more than attention.

The trace has no data flow (no tensor ids), so "fed by an upcast" is read from the op tree:
- an upcast is an `aten::copy_` whose `Input type` is [float, a low-precision float]: the copy
  under `to`/`_to_copy` that writes the float tensor (its inputs are [destination, source]);
- its scope is the event that encloses the conversion: the Python frame that called it (skipping
  `<built-in ...>` call frames), or the op or annotation around it;
- the chain is every op in that scope, from the upcast to the scope's end, with a float tensor
  input (a float entry in `Input type` whose `Input Dims` are not 0-dim), the cast back included;
- its kernels are those the chain's ops launched (correlation id -> launch -> the op around it,
  `launches.launch_owners`), GEMMs and convolutions left out (`cuda_core_gemm_rows` covers those).
Where a trace lost the launches of some kernels (a full host buffer), those kernels are counted by
name: each name's chain share among its kernels whose launch is known, times its time whose launch
is lost. The result says how much was estimated that way.

Every per-value step runs once per distinct value (the reader keeps one object per distinct
`Input type` and `Input Dims`), never once per event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiling.kernels import MAX_NAMES_DECODED, KernelInfo, decode
from profiling.launches import first_launches, launch_owners
from profiling.step_breakdown import where_value
from profiling.structure import END_SLACK_US, lane_codes, structure
from profiling.trace import Trace, codes_of
from profiling.windows import latest_start_on_lane

FP8_TYPES = ("c10::Float8_e4m3fn", "c10::Float8_e5m2", "c10::Float8_e4m3fnuz", "c10::Float8_e5m2fnuz")
# Element types a model computes in at low precision, as `Input type` spells them, and their precision.
TYPE_PRECISION = {"c10::BFloat16": "bf16", "c10::Half": "fp16", **dict.fromkeys(FP8_TYPES, "fp8")}
LOW_PRECISION_TYPES = frozenset(TYPE_PRECISION)
# Kernel precisions (the decoder's `precision`) that make a GEMM low precision.
LOW_PRECISION = ("bf16", "fp16", "fp8", "fp4")
FLOAT = "float"  # FP32, as `Input type` spells it
CONVERSIONS = ("aten::to", "aten::_to_copy")  # what wraps the upcast's copy_
MODULE_PREFIX = "nn.Module: "  # python_function events of torch.profiler(with_modules=True)
BUILTIN_PREFIX = "<built-in"  # a Python call frame around one op, not the code that called it
MATMUL_FAMILIES = ("gemm", "conv")
SPLIT_K = "split-K reduction"  # the decoder's meaning for cuBLAS's splitKreduce_kernel
LOST = -2  # a kernel whose launch the trace does not hold
# Levels climbed from an op to its nn.Module, and from a conversion to its scope: real traces nest
# 10-30 deep; a crafted one 100,000 deep must not cost a numpy pass per level.
MAX_CLIMB = 256
MAX_OPS_LISTED = 12  # ops of one chain named (RMSNorm's has 7)


@dataclass(frozen=True)
class UpcastChains:
    """The FP32 kernels that float upcasts fed, in one set of GPU events.

    Times are µs of kernel `dur`. `per_module` and `per_name` count the kernels whose launch is known.
    """

    upcasts: int  # upcast copies (copy_ from a low-precision type to float)
    source_types: list[str]  # the low-precision types upcast, most frequent first
    launched_us: float  # kernels the chain's ops launched (launch found)
    estimated_us: float  # kernels whose launch the trace lost, counted by name (module docstring)
    lost_kernels: int  # kernels whose launch the trace lost, among the chain's names
    per_module: pd.Series  # µs per nn.Module class (`Qwen2RMSNorm`), descending; empty without modules
    per_name: pd.Series  # µs per kernel name, descending
    ops: list[str]  # the ops that launched the costliest chain's kernels, in order of start
    worst_ts: float  # start of the costliest chain's first upcast (trace µs, not absolute)
    worst_module: str | None  # its innermost nn.Module instance (`nn.Module: Qwen2RMSNorm_12` -> that name)

    @property
    def total_us(self) -> float:
        return self.launched_us + self.estimated_us


def distinct_objects(column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes of each value of an object column by identity, and the position of each code's first value.

    The reader keeps one object per distinct `Input type` or `Input Dims` value, so a predicate on
    those runs once per distinct value this way, never once per event."""
    codes, _ = pd.factorize(np.fromiter(map(id, column), dtype=np.int64, count=len(column)))
    return codes, np.unique(codes, return_index=True)[1]


def per_distinct(column: np.ndarray, function: Callable[[object], object], dtype: type = bool) -> np.ndarray:
    """`function` of each value of an object column, run once per distinct object."""
    if not len(column):
        return np.zeros(0, dtype=dtype)
    codes, first = distinct_objects(column)
    values = np.empty(len(first), dtype=object)
    values[:] = [function(column[i]) for i in first]
    return values[codes].astype(dtype)


def upcast_rows(types: np.ndarray) -> np.ndarray:
    """Which `aten::copy_` ops, by their `Input type` column, are upcasts: [float, a low-precision type]."""
    return per_distinct(types, _is_upcast)


def _is_upcast(types: object) -> bool:
    return (
        isinstance(types, list)
        and len(types) >= 2
        and types[0] == FLOAT
        and isinstance(types[1], str)
        and types[1] in LOW_PRECISION_TYPES
    )


def _float_tensor_input(types: object, dims: object) -> bool:
    if not isinstance(types, list) or not isinstance(dims, list):
        return False
    return any(t == FLOAT and isinstance(d, list) and len(d) > 0 for t, d in zip(types, dims, strict=False))


def has_float_tensor_input(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Whether each op in `rows` has an FP32 tensor input (not a 0-dim scalar), once per distinct pair of
    `Input type` and `Input Dims` objects."""
    if not len(rows):
        return np.zeros(0, dtype=bool)
    types, dims = events["input_type"].to_numpy()[rows], events["input_dims"].to_numpy()[rows]
    type_codes, _ = distinct_objects(types)
    dim_codes, _ = distinct_objects(dims)
    codes, _ = pd.factorize(type_codes * (int(dim_codes.max()) + 1) + dim_codes)
    first = np.unique(codes, return_index=True)[1]
    flags = np.fromiter((_float_tensor_input(types[i], dims[i]) for i in first), dtype=bool, count=len(first))
    return flags[codes]


def _event_mask(trace: Trace, category: str, predicate: Callable[[str], bool]) -> np.ndarray:
    """Per event (all rows): a complete event of `category` whose name satisfies `predicate` (per distinct name)."""
    mask = np.zeros(len(trace.events), dtype=bool)
    complete = where_value(trace, "cat", lambda c: c == category) & where_value(trace, "name", predicate)
    mask[trace.complete_rows[complete]] = True
    return mask


def climb(parent: np.ndarray, start: np.ndarray, stop_at: np.ndarray) -> np.ndarray:
    """For each row in `start`, the first of itself and its ancestors where `stop_at` holds, or -1
    (none within MAX_CLIMB levels)."""
    found = np.full(len(start), -1, dtype=np.int64)
    cur, active = start.astype(np.int64).copy(), np.flatnonzero(start >= 0)
    for _ in range(MAX_CLIMB):
        if not len(active):
            break
        hit = stop_at[cur[active]]
        found[active[hit]] = cur[active[hit]]
        active = active[~hit]
        cur[active] = parent[cur[active]]
        active = active[cur[active] >= 0]
    return found


def kernel_owners(trace: Trace, gpu: pd.DataFrame) -> np.ndarray:
    """Per GPU event: the row of the op around its launch; -1 where the launch has none; LOST where the
    trace holds no launch with its correlation id."""
    launches = first_launches(trace)
    by_id = pd.Series(launch_owners(trace)[launches], index=trace.events["correlation"].to_numpy()[launches])
    return by_id.reindex(gpu["correlation"].to_numpy()).fillna(LOST).to_numpy(dtype=np.int64)


def decoded(kernels: pd.DataFrame) -> tuple[np.ndarray, list[KernelInfo | None]]:
    """Per kernel, the code of its name, and per code the decoded name: the MAX_NAMES_DECODED names with the
    most time only (None for the others), as a trace can hold 20,000 names."""
    codes, uniques = codes_of(kernels["name"])
    time = np.bincount(codes, weights=np.nan_to_num(kernels["dur"].to_numpy()), minlength=len(uniques))
    infos: list[KernelInfo | None] = [None] * len(uniques)
    for i in np.argsort(-time, kind="stable")[:MAX_NAMES_DECODED]:
        infos[i] = decode(str(uniques[i]))
    return codes, infos


def _per_code(infos: list[KernelInfo | None], field: Callable[[KernelInfo], object], codes: np.ndarray) -> np.ndarray:
    return np.array([field(i) if i is not None else None for i in infos], dtype=object)[codes]


def scopes(trace: Trace, upcasts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The conversion each upcast copy belongs to (its outermost to/_to_copy), and that conversion's scope:
    the first enclosing event that is neither a conversion nor a `<built-in ...>` call frame (-1: none)."""
    ev, parent = trace.events, structure(trace).parent
    names = ev["name"].to_numpy()
    top = upcasts.copy()
    for _ in range(len(CONVERSIONS)):  # copy_ under _to_copy under to: two levels at most
        up = parent[top]
        wraps = (up >= 0) & np.isin(names[np.clip(up, 0, None)], CONVERSIONS)
        top = np.where(wraps, up, top)
    builtin = _event_mask(trace, "python_function", lambda n: n.startswith(BUILTIN_PREFIX))
    not_builtin = ~builtin
    return top, climb(parent, parent[top], not_builtin)


def _chain_windows(trace: Trace, top: np.ndarray, scope: np.ndarray) -> pd.DataFrame:
    """Per lane, the merged spans from an upcast to the end of its scope (to the lane's end without one)."""
    ev = trace.events
    end = np.where(scope >= 0, ev["end"].to_numpy()[np.clip(scope, 0, None)], np.inf)
    spans = pd.DataFrame({"lane": lane_codes(trace)[top], "start": ev["ts"].to_numpy()[top], "end": end, "top": top})
    spans = spans.sort_values(["lane", "start"], kind="stable")
    reach = spans.groupby("lane")["end"].cummax()
    # A span that starts past everything before it on its lane opens a new window.
    new = (spans["lane"] != spans["lane"].shift()) | (spans["start"] > reach.shift())
    spans = spans.assign(window=np.cumsum(new.to_numpy()) - 1)
    return spans.groupby("window").agg(
        lane=("lane", "first"), start=("start", "min"), end=("end", "max"), top=("top", "first")
    )


def _in_windows(trace: Trace, windows: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """For each event in `rows`, the window (position in `windows`) it lies in on its lane, or -1."""
    ev = trace.events
    ts, stop = ev["ts"].to_numpy()[rows], ev["end"].to_numpy()[rows]
    k = latest_start_on_lane(windows["lane"].to_numpy(), windows["start"].to_numpy(), lane_codes(trace)[rows], ts)
    at = np.clip(k, 0, None)
    inside = (k >= 0) & (stop <= windows["end"].to_numpy()[at] + END_SLACK_US)
    return np.where(inside, k, -1)


def upcast_chains(trace: Trace, gpu: pd.DataFrame) -> UpcastChains | None:
    """The FP32 elementwise and reduction kernels among `gpu` (rows of `trace.gpu_activity`) that ops fed by
    float upcasts launched; None where the trace has no upcast or they launched none of them."""
    ev = trace.events
    copies = np.flatnonzero(_event_mask(trace, "cpu_op", lambda n: n == "aten::copy_"))
    upcasts = copies[upcast_rows(ev["input_type"].to_numpy()[copies])]
    if not len(upcasts):
        return None
    top, scope = scopes(trace, upcasts)
    windows = _chain_windows(trace, top, scope)
    ops = np.flatnonzero(_event_mask(trace, "cpu_op", lambda n: True))
    window = _in_windows(trace, windows, ops)
    ops, window = ops[window >= 0], window[window >= 0]
    fed = has_float_tensor_input(ev, ops)
    chain_ops, chain_window = ops[fed], window[fed]
    kernels = gpu[gpu["cat"].to_numpy() == "kernel"]
    codes, infos = decoded(kernels)
    kernels = kernels[~np.isin(_per_code(infos, lambda i: i.family, codes), MATMUL_FAMILIES)]
    owner = kernel_owners(trace, kernels)
    owner_window = pd.Series(chain_window, index=chain_ops).reindex(owner).to_numpy()  # NaN: no chain op's
    chained = ~np.isnan(owner_window)
    if not chained.any():
        return None
    names, dur = kernels["name"].to_numpy(), np.nan_to_num(kernels["dur"].to_numpy())
    estimated, lost = _estimate_lost(names, dur, chained, owner == LOST)
    per_window = pd.Series(dur[chained]).groupby(owner_window[chained].astype(np.int64)).sum()
    worst = int(per_window.idxmax())
    worst_top = int(windows["top"].iloc[worst])
    return UpcastChains(
        upcasts=len(upcasts),
        source_types=_source_types(ev["input_type"].to_numpy()[upcasts]),
        launched_us=float(dur[chained].sum()),
        estimated_us=estimated,
        lost_kernels=lost,
        per_module=_per_module(trace, owner[chained], dur[chained]),
        per_name=pd.Series(dur[chained]).groupby(names[chained]).sum().sort_values(ascending=False),
        ops=_op_sequence(ev, owner[chained][owner_window[chained] == worst]),
        worst_ts=float(ev["ts"].to_numpy()[worst_top]),
        worst_module=_module_names(trace, np.array([worst_top]))[0] or None,
    )


def _source_types(types: np.ndarray) -> list[str]:
    """The low-precision types the upcasts read (their copy_'s source), most frequent first."""
    codes, first = distinct_objects(types)
    counts = pd.Series(np.bincount(codes), index=[str(types[i][1]) for i in first]).groupby(level=0).sum()
    return counts.sort_values(ascending=False, kind="stable").index.tolist()


def _estimate_lost(names: np.ndarray, dur: np.ndarray, chained: np.ndarray, lost: np.ndarray) -> tuple[float, int]:
    """µs and count of the kernels whose launch is lost, counted by name: each name's share of chain time
    among its kernels whose launch is known, times its lost time (names with chain kernels only)."""
    if not lost.any():
        return 0.0, 0
    frame = pd.DataFrame(
        {
            "name": names,
            "chain": np.where(chained, dur, 0.0),
            "known": np.where(~lost, dur, 0.0),
            "lost": np.where(lost, dur, 0.0),
            "lost_n": lost.astype(np.int64),
        }
    )
    per_name = frame.groupby("name", sort=False).sum()
    per_name = per_name[(per_name["chain"] > 0) & (per_name["known"] > 0)]
    share = per_name["chain"] / per_name["known"]
    return float((share * per_name["lost"]).sum()), int(per_name["lost_n"].sum())


def _module_names(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The innermost `nn.Module: ...` event around each row, as the module's name without the prefix ('' none).
    One climb and one name per distinct row."""
    unique, inverse = np.unique(rows, return_inverse=True)
    is_module = _event_mask(trace, "python_function", lambda n: n.startswith(MODULE_PREFIX))
    found = climb(structure(trace).parent, unique, is_module)
    names = trace.events["name"].to_numpy()[np.clip(found, 0, None)]
    modules = [str(n).removeprefix(MODULE_PREFIX) if f >= 0 else "" for n, f in zip(names, found, strict=True)]
    return np.array(modules, dtype=object)[inverse]


def _per_module(trace: Trace, owners: np.ndarray, dur: np.ndarray) -> pd.Series:
    """µs per nn.Module class around the ops that launched the kernels (`Qwen2RMSNorm_12` counts for
    `Qwen2RMSNorm`: torch.profiler numbers each instance), descending; kernels with no module left out."""
    modules = pd.Series(_module_names(trace, owners), dtype=object)
    codes, uniques = pd.factorize(modules)
    classes = pd.Index(uniques).str.replace(r"_\d+$", "", regex=True).to_numpy()[codes]
    per = pd.Series(dur).groupby(classes).sum().sort_values(ascending=False, kind="stable")
    return per[per.index != ""]


def _op_sequence(events: pd.DataFrame, rows: np.ndarray) -> list[str]:
    """Names of the ops in `rows` (the ops that launched one chain's kernels), once each, in order of start:
    the upcast's copy_, the FP32 math, the cast back's copy_."""
    rows = np.unique(rows)
    order = rows[np.argsort(events["ts"].to_numpy()[rows], kind="stable")][:MAX_OPS_LISTED]
    return events["name"].to_numpy()[order].tolist()


def gemm_precision_us(trace: Trace, gpu: pd.DataFrame) -> pd.Series:
    """µs of GEMM kernels among `gpu` per precision (fp32, tf32, bf16, fp16, fp8, fp4, ...; "unknown").

    From the kernel's name (the decoder's `precision`); where the name does not say, from the element
    type of the op that launched it: bf16/fp16 inputs are that precision; float inputs are TF32 on a
    tensor-core kernel and FP32 on a CUDA-core one, and unknown where the engine is.
    """
    # Only the columns read here are taken: the whole frame's take was most of this function's time.
    kernels = gpu[["name", "dur", "correlation"]][gpu["cat"].to_numpy() == "kernel"]
    codes, infos = decoded(kernels)
    is_gemm = _per_code(infos, lambda i: i.family, codes) == "gemm"
    kernels, codes = kernels[is_gemm], codes[is_gemm]
    # `precision` is the decoder's field of issue 18; a decoder without it says nothing by name.
    by_name = _per_code(infos, lambda i: getattr(i, "precision", None), codes)
    engine = _per_code(infos, lambda i: i.tensor_cores, codes)
    owner = kernel_owners(trace, kernels)
    types = trace.events["input_type"].to_numpy()[np.clip(owner, 0, None)]
    element = per_distinct(types, _first_type, dtype=object)
    on_float = pd.Series(engine, dtype=object).map({True: "tf32", False: "fp32"}).to_numpy()  # NaN: engine unknown
    by_op = np.where(element == FLOAT, on_float, element)
    by_op[owner < 0] = None
    precision = np.where(pd.isna(by_name), by_op, by_name)
    labels = pd.Series(precision, dtype=object).fillna("unknown").to_numpy()
    dur = np.nan_to_num(kernels["dur"].to_numpy())
    return pd.Series(dur).groupby(labels).sum().sort_values(ascending=False, kind="stable")


def _first_type(types: object) -> str | None:
    """`float`, or a precision name (bf16, fp16, fp8) for an op's first input; None for anything else."""
    if not isinstance(types, list) or not types or not isinstance(types[0], str):
        return None
    return FLOAT if types[0] == FLOAT else TYPE_PRECISION.get(types[0])


def low_precision_gemm_percent(trace: Trace, gpu: pd.DataFrame) -> float | None:
    """Share of GEMM kernel time in bf16, fp16, fp8 or fp4 (`gemm_precision_us`); None without GEMM time."""
    per = gemm_precision_us(trace, gpu)
    total = float(per.sum())
    return 100.0 * float(per.reindex(LOW_PRECISION).fillna(0).sum()) / total if total > 0 else None


def cuda_core_gemms(gpu: pd.DataFrame) -> pd.DataFrame:
    """The GEMM and convolution kernels among `gpu` that run on CUDA cores (the decoder's engine)."""
    rows = np.flatnonzero(gpu["cat"].to_numpy() == "kernel")
    codes, infos = decoded(gpu[["name", "dur"]].iloc[rows])  # the two columns read, not the whole frame
    # The engine alone would take in elementwise kernels too: every one of them runs on CUDA cores. A split-K
    # GEMM's reduction runs there too whatever the GEMM ran on: it is no sign of FP32 math.
    simt = np.array(
        [
            i is not None and i.family in MATMUL_FAMILIES and i.tensor_cores is False and SPLIT_K not in i.meaning
            for i in infos
        ],
        dtype=bool,
    )
    return gpu.iloc[rows[simt[codes]]]
