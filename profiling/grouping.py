"""The op and kernel tables grouped as the TensorBoard plugin groups them, and per-op tensor-core use.

- `ops_by_input_shape`: the plugin's operator view "Group By: Operator + Input Shape" (tb_plugin's
  op_agg.py keys ops by name and `input_shape`).
- `ops_by_call_stack`: ops keyed by name and the chain of `python_function` events around them
  (recorded with `with_stack=True`), innermost first.
- `kernels_by_properties`: the plugin's kernel view "Group By: Kernel Properties + Op Name".
- `tensor_core_ops`: per op name, whether the plugin's allow-list calls it tensor-core eligible, and the
  share of its self kernel time that ran on tensor cores (`kernels.decode`'s engine).

The per-op numbers are the op table's (`tables.op_table_from_trace`): self CPU time is duration less
children's, device time is the GPU work of the op's launches (self) summed upwards (total), and a
same-name only child is merged into its parent. Trace values (shapes, grids) are turned into text once
per distinct object: the reader shares one object per distinct value, so that is per shape, not per event.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from profiling.gpu_metrics import valid_blocks_per_sm, valid_occupancy
from profiling.kernels import decode_most
from profiling.launches import first_launches, launch_owners
from profiling.names import cut_name
from profiling.structure import propagate_up, structure
from profiling.tables import OP_COLUMNS, launched_device_time, merged_into_parent
from profiling.trace import Trace

# The plugin's TC_OP_Allowlist (tb_plugin/torch_tb_profiler/profiler/tensor_core.py): ops whose kernels
# can run on tensor cores; matched by whole name, as the plugin does.
TC_ELIGIBLE_OPS = frozenset(
    {
        *("aten::_convolution", "aten::_convolution_nogroup", "aten::conv1d", "aten::conv2d", "aten::conv3d"),
        *("aten::conv_tbc", "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d"),
        *("aten::convolution", "aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::prelu"),
        *("aten::addmm", "aten::addmv", "aten::addr", "aten::matmul", "aten::mm", "aten::mv", "aten::linear"),
        *("aten::addbmm", "aten::baddbmm", "aten::bmm", "aten::chain_matmul", "aten::linalg_multi_dot"),
        *("aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_gru_cell", "aten::lstm_cell", "aten::gru_cell"),
        *("aten::rnn_tanh_cell", "aten::rnn_relu_cell", "CudnnConvolutionBackward", "BmmBackward0"),
        *("aten::cudnn_convolution_transpose_backward", "CudnnConvolutionTransposeBackward", "MmBackward"),
        *("aten::cudnn_convolution_backward_weight", "aten::addmm_", "AddmvBackward", "MvBackward"),
        *("aten::cudnn_convolution_transpose_backward_weight", "aten::cudnn_convolution_transpose_backward_input"),
        *("AddmmBackward", "aten::cudnn_convolution_backward_input", "AddbmmBackward"),
        "aten::cudnn_convolution_backward",
    }
)
PYTHON = "python_function"
STACK_SEPARATOR = " <- "
MAX_STACK_FRAMES = 16  # innermost frames kept; the rest are dropped behind STACK_MORE
STACK_MORE = "…"

GROUP_VALUES = OP_COLUMNS[1:-1]  # the op table's figures, between its name and its kind
SHAPE_COLUMNS = ["name", "input dims", *GROUP_VALUES]
STACK_COLUMNS = ["name", "call stack", *GROUP_VALUES]
KERNEL_GROUP_COLUMNS = [
    "kernel",
    "op",  # the op that launched it ("" where no op is known)
    "grid",
    "block",
    "registers/thread",
    "shared mem (B)",
    "calls",
    "total (us)",
    "mean (us)",
    "max (us)",
    "min (us)",
    "mean blocks per SM",  # weighted by duration, a missing value counting as 0 (the plugin's weighted_avg)
    "mean occupancy (%)",
    "tensor cores",  # yes, no or unknown: the decoder's engine (tensor, simt, other), as the kernel table says
    "op tc eligible",
]
TENSOR_CORES = {"tensor": "yes", "simt": "no"}
TC_COLUMNS = ["name", "tc eligible", "self kernel (us)", "tc self kernel (us)", "tc self %"]


def ops_by_input_shape(trace: Trace) -> pd.DataFrame:
    """The op table per (name, Input Dims): calls, host and device time, self and total (µs).

    Input Dims are shown as Python writes the list (`[[16, 128], []]`), as the plugin shows them; an op
    recorded without shapes has "". Ordered by self device time, then self CPU time.
    """
    ops = _op_rows(trace)
    dims = trace.events["input_dims"].to_numpy()[ops["row"].to_numpy()]
    ops["input dims"] = _per_object(dims, _shape_text)
    return _group(ops, "input dims", SHAPE_COLUMNS)


def ops_by_call_stack(trace: Trace, top: int | None = None) -> pd.DataFrame:
    """The op table per (name, call stack): the enclosing `python_function` events on the op's thread,
    innermost first, joined by " <- " (at most MAX_STACK_FRAMES of them); "" where none encloses it.

    The first `top` groups (all where None), in the table's order; `attrs["groups"]` counts them all and
    `attrs["stacks"]` says whether any op has a stack. Ops are grouped by their stack's frames, and a stack's
    text (up to MAX_STACK_FRAMES names of up to 4,096 characters) is made only for the groups returned: a
    trace of many distinct long stacks costs no text for a group that is not shown."""
    ops = _op_rows(trace)
    ops["call stack"], chains, names = _call_stacks(trace, ops["row"].to_numpy())
    table = _group(ops, "call stack", STACK_COLUMNS)
    groups = len(table)
    if top is not None:
        table = table.head(top).copy()
    texts = {code: _stack_text(chains[code].tolist(), names) for code in pd.unique(table["call stack"])}
    table["call stack"] = table["call stack"].map(texts).astype(object)
    table.attrs.update(groups=groups, stacks=bool(len(chains)) and bool((chains[:, 0] >= 0).any()))
    return table


def kernels_by_properties(trace: Trace) -> pd.DataFrame:
    """Kernels per (name, launching op, grid, block, registers per thread, shared memory): calls, total,
    mean, max and min duration (µs), duration-weighted blocks per SM and occupancy, tensor cores."""
    k = trace.kernels
    if k.empty:
        return pd.DataFrame(columns=KERNEL_GROUP_COLUMNS)
    dur = k["dur"].to_numpy(dtype=np.float64)
    frame = pd.DataFrame(
        {
            "kernel": k["name"].to_numpy(),
            "op": _launching_op(trace, k["correlation"].to_numpy()),
            "grid": _per_object(k["grid"].to_numpy(), _dims_text),
            "block": _per_object(k["block"].to_numpy(), _dims_text),
            # -1 for a missing number: groupby drops NaN keys, and no real count is negative.
            "registers/thread": k["registers"].fillna(-1).to_numpy(),
            "shared mem (B)": k["shared_memory"].fillna(-1).to_numpy(),
            "dur": dur,
            "blocks_w": np.nan_to_num(valid_blocks_per_sm(k["blocks_per_sm"].to_numpy())) * dur,
            "occupancy_w": np.nan_to_num(valid_occupancy(k["occupancy"].to_numpy())) * dur,
        }
    )
    keys = KERNEL_GROUP_COLUMNS[:6]
    g = frame.groupby(keys, sort=False)
    out = g["dur"].agg(["size", "sum", "mean", "max", "min"]).reset_index()
    weights = g[["blocks_w", "occupancy_w"]].sum().to_numpy()
    total = out["sum"].to_numpy()
    safe = np.where(total > 0, total, np.nan)  # zero total weight: the plugin shows 0
    out = out.rename(columns={"size": "calls", "sum": "total (us)", "mean": "mean (us)"})
    out = out.rename(columns={"max": "max (us)", "min": "min (us)"})
    out["mean blocks per SM"] = np.nan_to_num(weights[:, 0] / safe)
    out["mean occupancy (%)"] = np.clip(np.nan_to_num(weights[:, 1] / safe), 0.0, 100.0)
    out["tensor cores"] = _engines(out["kernel"], out["total (us)"]).map(TENSOR_CORES).fillna("unknown").to_numpy()
    out["op tc eligible"] = out["op"].isin(TC_ELIGIBLE_OPS).to_numpy()
    for column in ("registers/thread", "shared mem (B)"):
        out[column] = out[column].where(out[column] >= 0)
    return out[KERNEL_GROUP_COLUMNS].sort_values("total (us)", ascending=False, ignore_index=True)


def tensor_core_ops(trace: Trace) -> pd.DataFrame:
    """Per op name: tensor-core eligible (TC_ELIGIBLE_OPS), its self kernel time (the kernels its own
    launches made, µs), the part on tensor cores, and that part as a % (None where it launched no kernel).

    Every op of the op table has a row; kernels whose engine the decoder cannot tell count as not on
    tensor cores, as the plugin counts kernels its name list does not match."""
    ev = trace.events
    op_names = pd.unique(ev["name"].to_numpy()[ev["cat"].to_numpy() == "cpu_op"])
    k = trace.kernels
    owner = _kernel_owner_rows(trace, k["correlation"].to_numpy())
    known = owner >= 0
    owner_is_op = np.zeros(len(owner), dtype=bool)
    owner_is_op[known] = ev["cat"].to_numpy()[owner[known]] == "cpu_op"
    mine = k[owner_is_op]
    names = ev["name"].to_numpy()[owner[owner_is_op]]
    tensor = _engines(mine["name"], mine["dur"]).eq("tensor").to_numpy()
    dur = mine["dur"].to_numpy(dtype=np.float64)
    sums = pd.DataFrame({"name": names, "all": dur, "tc": np.where(tensor, dur, 0.0)}).groupby("name").sum()
    sums = sums.reindex(op_names).fillna(0.0)
    percent = 100.0 * sums["tc"] / sums["all"].where(sums["all"] > 0)
    table = pd.DataFrame(
        {
            "name": op_names,
            "tc eligible": pd.Index(op_names).isin(TC_ELIGIBLE_OPS),
            "self kernel (us)": sums["all"].to_numpy(),
            "tc self kernel (us)": sums["tc"].to_numpy(),
            "tc self %": percent.astype(object).where(percent.notna(), None).to_numpy(),
        },
        columns=TC_COLUMNS,
    )
    return table.sort_values("self kernel (us)", ascending=False, ignore_index=True)


def _op_rows(trace: Trace) -> pd.DataFrame:
    """One row per `cpu_op` call as the op table counts them (same-name only children merged in): its
    event row, name, and host and device time, self and total."""
    ev = trace.events
    columns = ["row", "name", "self_cpu", "total_cpu", "self_dev", "total_dev"]
    if ev.empty:
        return pd.DataFrame(columns=columns)
    s = structure(trace)
    parent, has_parent = s.parent, s.parent >= 0
    dur = ev["dur"].to_numpy()
    child_dur = np.bincount(parent[has_parent], weights=dur[has_parent], minlength=len(ev))
    self_cpu = np.clip(dur - child_dur, 0, None)
    children = np.bincount(parent[has_parent], minlength=len(ev))
    self_dev = launched_device_time(trace)
    total_dev = propagate_up(self_dev, parent, s.depth)
    names = ev["name"].to_numpy()
    representative = merged_into_parent(names, parent, children)
    self_cpu = np.bincount(representative, weights=self_cpu, minlength=len(ev))
    self_dev = np.bincount(representative, weights=self_dev, minlength=len(ev))
    keep = np.flatnonzero((ev["cat"].to_numpy() == "cpu_op") & (representative == np.arange(len(ev))))
    return pd.DataFrame(
        {
            "row": keep,
            "name": names[keep],
            "self_cpu": self_cpu[keep],
            "total_cpu": dur[keep],
            "self_dev": self_dev[keep],
            "total_dev": total_dev[keep],
        },
        columns=columns,
    )


def _group(ops: pd.DataFrame, key: str, columns: list[str]) -> pd.DataFrame:
    if ops.empty:
        return pd.DataFrame(columns=columns)
    g = ops.groupby(["name", key], sort=False)
    out = g[["self_cpu", "total_cpu", "self_dev", "total_dev"]].sum()
    out.insert(0, "calls", g.size())
    out = out.reset_index()
    table = pd.DataFrame(
        {
            "name": out["name"],
            key: out[key],
            "calls": out["calls"],
            "self cpu (us)": out["self_cpu"],
            "total cpu (us)": out["total_cpu"],
            "avg cpu (us)": out["total_cpu"] / out["calls"],
            "self device (us)": out["self_dev"],
            "total device (us)": out["total_dev"],
            "avg device (us)": out["total_dev"] / out["calls"],
        },
        columns=columns,
    )
    return table.sort_values(["self device (us)", "self cpu (us)"], ascending=False, ignore_index=True)


def _per_object(values: np.ndarray, text: Callable[[object], str]) -> np.ndarray:
    """`text(v)` for each value, computed once per distinct object (the reader shares one per distinct
    value); equal values from distinct objects still give equal texts, so grouping by the text is exact."""
    if not len(values):
        return np.zeros(0, dtype=object)
    ids = np.fromiter(map(id, values), dtype=np.int64, count=len(values))  # in C: no Python step per event
    codes, _ = pd.factorize(ids)
    first = pd.Series(np.arange(len(values))).groupby(codes).first().to_numpy()
    texts = np.array([text(values[i]) for i in first.tolist()], dtype=object)
    return texts[codes]


def _shape_text(value: object) -> str:
    """A list as Python writes it (`[[16, 128], []]`); "" where not a list. Never cut: two shapes that
    differ only past a cut would merge into one group (display cuts it: `tables.rounded`)."""
    return str(value) if isinstance(value, list) else ""


def _dims_text(value: object) -> str:
    """A grid or block as `[x, y, z]`; "" where missing."""
    return _shape_text(value)


def _call_stacks(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, pd.Index]:
    """For each row, the code of its stack of enclosing `python_function` events; the distinct stacks as rows of
    name codes, innermost first (-1 past the outermost; the last column only says whether more frames were
    dropped); and the names the codes index."""
    ev = trace.events
    codes, names = pd.factorize(np.append(ev["name"].to_numpy(), ""))
    if not len(rows):
        return np.zeros(0, dtype=np.int64), np.full((0, MAX_STACK_FRAMES + 1), -1, dtype=np.int64), names
    parent = structure(trace).parent
    is_python = ev["cat"].to_numpy() == PYTHON
    # Nearest python event at or above each event, by pointer jumping: log(depth) passes, not one per level.
    nearest = np.where(is_python, np.arange(len(ev)), parent)
    nearest = np.append(nearest, -1)  # index -1 (no parent) reads this sentinel
    python_ext = np.append(is_python, True)  # the sentinel stops the climb
    while True:
        climbed = np.where(python_ext[nearest], nearest, nearest[nearest])
        if np.array_equal(climbed, nearest):
            break
        nearest = climbed
    parent_ext = np.append(parent, -1)
    frames = np.full((len(rows), MAX_STACK_FRAMES + 1), -1, dtype=np.int64)
    at = rows
    for i in range(MAX_STACK_FRAMES + 1):  # one more than kept: to know whether frames were dropped
        at = nearest[parent_ext[at]]
        frames[:, i] = at
    named = np.where(frames >= 0, codes[frames], -1)
    named[:, MAX_STACK_FRAMES] = np.where(frames[:, MAX_STACK_FRAMES] >= 0, 0, -1)  # dropped frames: one mark
    distinct, inverse = np.unique(named, axis=0, return_inverse=True)
    return inverse.ravel().astype(np.int64), distinct, names


def _stack_text(chain: list[int], names: pd.Index) -> str:
    kept = [cut_name(str(names[c])) for c in chain[:MAX_STACK_FRAMES] if c >= 0]
    if chain[MAX_STACK_FRAMES] >= 0:
        kept.append(STACK_MORE)
    return STACK_SEPARATOR.join(kept)


def _kernel_owner_rows(trace: Trace, correlation: np.ndarray) -> np.ndarray:
    """Per GPU event (by correlation id), the row of the op whose launch made it; -1 where none is known."""
    ev = trace.events
    owner = launch_owners(trace)
    launches = first_launches(trace)
    launches = launches[owner[launches] >= 0]
    by_id = pd.Series(owner[launches], index=ev["correlation"].to_numpy()[launches])
    return by_id.reindex(correlation).fillna(-1).to_numpy(dtype=np.int64)


def _launching_op(trace: Trace, correlation: np.ndarray) -> np.ndarray:
    owner = _kernel_owner_rows(trace, correlation)
    names = np.append(trace.events["name"].to_numpy(), "")
    return names[owner]  # -1 reads the "" appended


def _engines(kernel_names: pd.Series, dur: pd.Series) -> pd.Series:
    """Each kernel's engine ("tensor", "simt", ...), decoded once per distinct name (`decode_most`, by `dur`)."""
    engine = {name: info.engine for name, info in decode_most(kernel_names, dur).items()}
    return kernel_names.map(engine)
