"""Profiler steps and their time breakdown, by the TensorBoard plugin's rules.

Source of the definitions (pytorch/kineto, `tb_plugin/torch_tb_profiler/profiler/`, before the
plugin's removal):
- `event_parser.py`, `StepParser._parse_step`: which events are steps and which role each
  event plays (kernel, memcpy, memset, communication, runtime, dataloader, CPU exec);
- `event_parser.py`, `StepParser.parse_steps`: without a ProfilerStep, one step "0" over the
  host's ops (`profiling/fallback_step.py`), treated below as any other step;
- `event_parser.py`, `StepParser._find_device_steps` and `_update_steps_duration`: a step
  starts at the later of its CPU start and the previous step's end, and ends at the later of
  its CPU end and the end of the last GPU activity launched inside it; trailing steps that
  launched nothing, or fewer than 80% of the GPU activities of the step before, are dropped;
- `overall_parser.py`, `OverallParser.Statistics.create_from_range`: each instant of a step
  goes to the first role active then, in `ProfileRole` order, and the rest is `other`.

Where we differ from the plugin, on purpose: launches in the `cuda_driver`/`hip_*` categories
(cuLaunchKernel, used by Triton and cuDNN) count as launches and as runtime, since the plugin
predates them; `gpu_user_annotation` spans are not CPU work; NCCL kernels are communication by
name as well as through a `nccl:*` op's external id, since newer traces have no such ops.
Each deviation, with the plugin's number beside ours, is in docs/plugin-parity.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiling import intervals as iv
from profiling.fallback_step import fallback_step
from profiling.trace import LAUNCH_CATEGORIES, Trace, per_trace, rows_of

# torch numbers steps with a 64-bit counter: more digits (or non-ASCII ones) make an annotation, not a step.
# Matched whole (`fullmatch`): `$` would accept a trailing newline.
STEP_NAME = re.compile(r"ProfilerStep#[0-9]{1,18}")
# Steps are told apart by their place in time order, not by name: a trace may repeat a name (a
# hostile one, 2,000 times), and joining tables on the name multiplied their rows.
POSITION = "position"
# The plugin's OPERATOR and USER_ANNOTATION; its PYTHON is 2021's `Python`, which the reader spells
# `python_function` like today's events (the plugin's PYTHON_FUNCTION, no role): see `_cpu_work`.
CPU_CATEGORIES = ("cpu_op", "user_annotation")
# trace.py NcclOpNameSet and GlooOpNameSet
COMMUNICATION_OPS = frozenset(
    f"{lib}:{op}"
    for lib in ("nccl", "gloo")
    for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
)
# event_parser.py ProfileRole, in priority order; `other` is what is left of a step.
ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec")
TAIL_RATIO = 0.8  # _update_steps_duration: a last step with < 80% of the previous step's GPU work is partial


@dataclass
class StepBreakdown:
    """Average step time, average time per role, and one row per step (times in µs), keyed by `position`."""

    average_step_time_us: float | None
    breakdown_us: dict[str, float] = field(default_factory=dict)
    per_step: pd.DataFrame = field(default_factory=pd.DataFrame)


def where_value(trace: Trace, column: str, predicate: Callable[[str], bool]) -> np.ndarray:
    """Mask of complete events whose `column` (name or cat) satisfies `predicate`.

    The predicate runs once per distinct value, not once per event: a 10M-event trace has a
    few thousand distinct names, and per-event string matching would dominate the analysis.
    """
    codes, uniques = trace.complete_codes(column)
    flags = np.fromiter((bool(predicate(u)) for u in uniques), dtype=bool, count=len(uniques))
    return np.append(flags, False)[codes]  # code -1 (missing) reads the appended False


def in_categories(trace: Trace, *categories: str) -> np.ndarray:
    return where_value(trace, "cat", lambda c: c in categories)


def is_step_name(name: str) -> bool:
    return STEP_NAME.fullmatch(name) is not None


@per_trace  # the analysis, the plugin's steps and each finding's step (`step_names`) ask for them
def profiler_steps(trace: Trace) -> pd.DataFrame:
    """The host-side `ProfilerStep#N` spans in time order, each with its `position` (0, 1, ...) in that order;
    without any, the plugin's step "0" over the host's ops (`fallback_step`).

    A step recorded twice (same name, same span) counts once; the same name at another time is
    another step. Indexed by the events' rows in `trace.events` (the fallback step by its first op's).
    """
    steps = _step_annotations(trace)
    if steps.empty:
        steps = fallback_step(trace)
    steps = steps.drop_duplicates(["name", "ts", "end"]).sort_values("ts", kind="stable")
    return steps.assign(**{POSITION: np.arange(len(steps))})


@per_trace
def _step_annotations(trace: Trace) -> pd.DataFrame:
    mask = in_categories(trace, "user_annotation", "cpu_op") & where_value(trace, "name", is_step_name)
    return rows_of(trace.events, trace.complete_rows[mask])


def steps_source(trace: Trace) -> str | None:
    """Where `profiler_steps` came from: "profiler_steps" (the trace's ProfilerStep#N annotations),
    "fallback" (the plugin's step "0" over the host's ops), or None (no step: no host op either)."""
    if not _step_annotations(trace).empty:
        return "profiler_steps"
    return "fallback" if not fallback_step(trace).empty else None


def launch_spans(trace: Trace, correlation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of the host launch with each correlation id (the first one), NaN where none."""
    ids = trace.complete_column("correlation")
    mask = in_categories(trace, *LAUNCH_CATEGORIES) & ~np.isnan(ids)
    ids, first = np.unique(ids[mask], return_index=True)
    at = pd.Index(ids).get_indexer(correlation)
    # A sentinel NaN stands for "no launch found" (get_indexer's -1).
    starts = np.append(trace.complete_column("ts")[mask][first], np.nan)
    ends = np.append(trace.complete_column("end")[mask][first], np.nan)
    return starts[at], ends[at]


def _launched_activity(trace: Trace) -> pd.DataFrame:
    """GPU activity with the host span of the launch that caused it, from any host thread.

    Like the plugin (runtime_node_list), any launch in the file counts, whatever its thread:
    the backward pass launches from the autograd thread. A trace file holds one process, and
    Kineto sometimes gives the step another pid than the ops (tests/data/triton_driver_launch).
    """
    gpu = trace.gpu_activity
    launch_start, launch_end = launch_spans(trace, gpu["correlation"].to_numpy())
    return pd.DataFrame(
        {
            "start": gpu["ts"].to_numpy(),
            "end": gpu["end"].to_numpy(),
            "launch_start": launch_start,
            "launch_end": launch_end,
        }
    )


def _step_of_launch(
    starts: np.ndarray, ends: np.ndarray, launch_start: np.ndarray, launch_end: np.ndarray
) -> np.ndarray:
    """Index of the host step that wholly contains each launch, else -1 (_find_device_steps)."""
    k = np.searchsorted(starts, launch_start, side="right") - 1
    ok = (k >= 0) & (launch_end <= ends[np.clip(k, 0, None)])
    # A zero-length launch exactly at a boundary belongs to the earlier step, as in the plugin's merge.
    earlier = (
        (k >= 1) & (launch_start >= starts[np.clip(k - 1, 0, None)]) & (launch_end <= ends[np.clip(k - 1, 0, None)])
    )
    k = np.where(earlier, k - 1, k)
    return np.where(ok | earlier, k, -1)


def _device_extent(activity: pd.DataFrame, step: np.ndarray, n: int) -> pd.DataFrame:
    matched = step >= 0
    grouped = activity[matched].groupby(step[matched])
    extent = pd.DataFrame({"first": grouped["start"].min(), "last": grouped["end"].max(), "count": grouped.size()})
    return extent.reindex(range(n)).fillna({"count": 0})


def _previous_end(activity: pd.DataFrame, step: np.ndarray, first_step_start: float, first_device: float) -> float:
    """The plugin's `prev_step_end_time`: the first step's start, or the end of unmatched GPU work before it."""
    if np.isnan(first_device):
        return first_step_start
    ends = activity["end"].to_numpy()[(step < 0) & (activity["end"].to_numpy() < first_device)]
    return max(first_step_start, float(ends.max())) if len(ends) else first_step_start


def adjusted_steps(trace: Trace) -> pd.DataFrame:
    """The plugin's steps: `position`, `step`, `start`, `end`, `gpu_activities` (cached on the trace)."""
    if trace.derived.plugin_steps is None:
        trace.derived.plugin_steps = _adjust_steps(trace)
    return trace.derived.plugin_steps


def _adjust_steps(trace: Trace) -> pd.DataFrame:
    steps = profiler_steps(trace)
    if steps.empty:
        return pd.DataFrame({POSITION: [], "step": [], "start": [], "end": [], "gpu_activities": []})
    cpu_start, cpu_end = steps["ts"].to_numpy(), steps["end"].to_numpy()
    n = len(steps)
    activity = _launched_activity(trace)
    step = _step_of_launch(cpu_start, cpu_end, activity["launch_start"].to_numpy(), activity["launch_end"].to_numpy())
    extent = _device_extent(activity, step, n)
    count = extent["count"].to_numpy()
    start, end = cpu_start.copy(), cpu_end.copy()
    if count.sum() > 0:  # is_use_gpu
        prev = _previous_end(activity, step, cpu_start[0], extent["first"].iloc[0])
        reach = np.fmax(np.fmax(cpu_end, extent["last"].to_numpy()), cpu_start)
        end = np.maximum.accumulate(np.concatenate([[prev], reach]))[1:]
        start = np.maximum(cpu_start, np.concatenate([[prev], end[:-1]]))
        n = _steps_kept(count)
    return pd.DataFrame(
        {
            POSITION: steps[POSITION].to_numpy(),
            "step": steps["name"].to_numpy(),
            "start": start,
            "end": end,
            "gpu_activities": count.astype(np.int64),
        }
    ).iloc[:n]


def _steps_kept(count: np.ndarray) -> int:
    """_update_steps_duration: drop trailing steps whose GPU work the profiler may have cut short."""
    n = len(count)
    launched = np.flatnonzero(count > 0)
    if n <= 1 or not len(launched):
        return n
    last = int(launched[-1])
    keep = last + 1
    if last > 0 and count[last - 1] * TAIL_RATIO > count[last]:
        keep = last
    return keep


def steps_span(trace: Trace) -> tuple[float, float] | None:
    """First step start to last step end (the fallback step "0" where there is no ProfilerStep); the whole
    trace where it has no host op either (the plugin's step is then empty, from +inf to -inf); None for an
    empty trace."""
    steps = adjusted_steps(trace)
    if len(steps):
        return float(steps["start"].iloc[0]), float(steps["end"].iloc[-1])
    if not len(trace.complete_rows):
        return None
    return float(trace.complete_column("ts").min()), float(trace.complete_column("end").max())


def _is_dataloader(name: str) -> bool:
    return (name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__")) or name.startswith(
        "enumerate(DataPipe)#"
    )


def _cpu_work(trace: Trace) -> np.ndarray:
    """Events of the plugin's OPERATOR, USER_ANNOTATION and PYTHON types: `python_function` rows count
    only where the file spelled them 2021's `Python` (`Trace.python_spelled_2021`)."""
    categories = (*CPU_CATEGORIES, "python_function") if trace.python_spelled_2021 else CPU_CATEGORIES
    return in_categories(trace, *categories)


def _role_masks(trace: Trace) -> dict[str, np.ndarray]:
    """StepParser._parse_step: which complete events play which role."""
    cpu = _cpu_work(trace) & ~where_value(trace, "name", is_step_name)
    dataloader = in_categories(trace, "cpu_op", "user_annotation") & where_value(trace, "name", _is_dataloader)
    communication_ops = cpu & ~dataloader & where_value(trace, "name", COMMUNICATION_OPS.__contains__)
    external_id = trace.complete_column("external_id")
    op_ids = external_id[communication_ops]
    is_kernel = in_categories(trace, "kernel")
    by_name = where_value(trace, "name", lambda n: "nccl" in n.lower())
    nccl_kernel = is_kernel & (by_name | pd.Series(external_id).isin(op_ids[~np.isnan(op_ids)]).to_numpy())
    return {
        "kernel": is_kernel & ~nccl_kernel,
        "memcpy": in_categories(trace, "gpu_memcpy"),
        "memset": in_categories(trace, "gpu_memset"),
        "communication": nccl_kernel | communication_ops,
        "runtime": in_categories(trace, *LAUNCH_CATEGORIES),
        "dataloader": dataloader,
        "cpu_exec": cpu & ~dataloader & ~communication_ops,
    }


def exclusive_roles(trace: Trace) -> dict[str, iv.Intervals]:
    """Each role's busy time minus every higher-priority role's (create_from_range).

    One sort of every role's merged boundaries, then each stretch between two boundaries goes to the first
    role busy there: a subtraction and a union per role re-sorted the growing set of higher roles' time, most
    of the breakdown's cost on a large trace."""
    ts, end = trace.complete_column("ts"), trace.complete_column("end")
    roles = _role_masks(trace)
    busy = [iv.union(ts[mask], end[mask]) for mask in roles.values()]
    times = np.concatenate([bound for starts, ends in busy for bound in (starts, ends)])
    role = np.repeat(np.arange(len(busy), dtype=np.int8), [2 * len(starts) for starts, _ in busy])
    step = np.concatenate([np.repeat(np.int8(sign), len(starts)) for starts, _ in busy for sign in (1, -1)])
    order = np.argsort(times, kind="stable")
    times, role, step = times[order], role[order], step[order]
    first = np.full(len(times), len(busy), dtype=np.int8)  # the first role busy after each boundary
    for r in reversed(range(len(busy))):  # a role's merged intervals never overlap: its count is 0 or 1
        first[np.cumsum(np.where(role == r, step, 0), dtype=np.int32) > 0] = r
    starts, ends, first = times[:-1], times[1:], first[:-1]
    return {name: iv.union(starts[first == r], ends[first == r]) for r, name in enumerate(roles)}


@per_trace
def step_breakdown(trace: Trace) -> StepBreakdown:
    """Average step time and per-role averages over the plugin's steps; None/empty without steps."""
    steps = adjusted_steps(trace)
    if steps.empty:
        return StepBreakdown(None, {}, pd.DataFrame(columns=[POSITION, "step", "step time (us)"]))
    start, end = steps["start"].to_numpy(), steps["end"].to_numpy()
    roles = exclusive_roles(trace)
    shown = [r for r in ROLES if r != "communication" or len(roles["communication"][0])]
    costs = {role: iv.overlap_per_window(roles[role], start, end) for role in ROLES}
    per_step = pd.DataFrame(
        {POSITION: steps[POSITION].to_numpy(), "step": steps["step"].to_numpy(), "step time (us)": end - start}
    )
    for role in shown:
        per_step[f"{role} (us)"] = costs[role]
    per_step["other (us)"] = np.clip((end - start) - sum(costs.values()), 0.0, None)
    breakdown = {role: float(per_step[f"{role} (us)"].mean()) for role in [*shown, "other"]}
    return StepBreakdown(float(per_step["step time (us)"].mean()), breakdown, per_step)


def step_names(trace: Trace, ts: np.ndarray, device_side: bool = False) -> list[str | None]:
    """The step each time falls in, or None outside every step: a ProfilerStep's name, or the plugin's "0"
    where the trace has none (`step_breakdown.profiler_steps`). Host times are placed by the steps' host
    spans; GPU times (`device_side`) by the plugin's steps, which reach the end of the work they launched."""
    steps = adjusted_steps(trace)  # cached on the trace
    if steps.empty:
        return [None] * len(ts)
    if device_side:
        start, end, names = steps["start"].to_numpy(), steps["end"].to_numpy(), steps["step"].to_numpy()
    else:
        steps = profiler_steps(trace)
        start, end, names = steps["ts"].to_numpy(), steps["end"].to_numpy(), steps["name"].to_numpy()
    k = np.searchsorted(start, ts, side="right") - 1
    inside = (k >= 0) & (ts <= end[np.clip(k, 0, None)]) if len(start) else np.zeros(len(ts), dtype=bool)
    return [str(names[i]) if ok else None for i, ok in zip(k.tolist(), inside.tolist(), strict=True)]


def step_at(trace: Trace, ts: float, device_side: bool = False) -> str | None:
    """`step_names` of one time: where a finding's worst instance sits, to find it in Perfetto."""
    return step_names(trace, np.array([ts], dtype=np.float64), device_side)[0]
