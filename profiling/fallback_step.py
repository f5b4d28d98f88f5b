"""The TensorBoard plugin's step for a trace without `ProfilerStep`s: one step "0" over the host's ops.

Source (pytorch/kineto, `tb_plugin/torch_tb_profiler/profiler/`, torch-tb-profiler 0.4.3):
- `event_parser.py`, `StepParser.parse_steps`: with no ProfilerStep, one step named "0" from
  `cpu_min_ts` to `cpu_max_ts`, which `_parse_step` takes over the events of type PYTHON, OPERATOR
  and PROFILER_STEP only;
- `trace.py`, `EventTypeMap`: PYTHON is the 2021 category `Python`; today's `python_function` is
  another type (PYTHON_FUNCTION), as `user_annotation` is (USER_ANNOTATION). Neither counts, so on a
  torch >= 1.10 trace the step spans the `cpu_op`s alone;
- `update_device_steps` (`_find_device_steps`, `_update_steps_duration`) then treats this step as
  any other: it reaches the end of the GPU work launched inside it. That half is
  `step_breakdown.adjusted_steps`, unchanged: `step_breakdown.profiler_steps` returns this step
  where a trace has no ProfilerStep.

The reader spells every category today's way (`trace.CATEGORY_SPELLINGS`), so which rows were
`Python` or `Operator` in the file is read from the spellings the file uses (`Trace.spellings`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiling.trace import ANNOTATION_PREFIXES, STEP_PREFIX, Trace

STEP_NAME = "0"  # parse_steps: `self.steps_names.append('0')`


def fallback_step(trace: Trace) -> pd.DataFrame:
    """Step "0" over the host's ops, as one row of `trace.events`' columns: the rows
    `step_breakdown.profiler_steps` selects before it numbers their `position`. Empty without ops.

    Its index is the row of the op it starts with, so lane lookups land on that op's thread. The
    plugin makes this step only where a trace has no ProfilerStep, and so should the caller.
    """
    ev = trace.events
    rows = trace.complete_rows[_counts_as_host(trace)]
    if not len(rows):
        return ev.iloc[:0]
    ts, end = ev["ts"].to_numpy()[rows], ev["end"].to_numpy()[rows]
    first = int(rows[np.argmin(ts)])
    start, stop = float(ts.min()), float(end.max())
    step = ev.iloc[[first]].copy()
    for column in step.columns:  # nothing of the op it starts with is the step's but its thread
        if column not in ("pid", "tid"):
            step[column] = None if step[column].dtype == object else np.nan
    return step.assign(name=STEP_NAME, cat="user_annotation", ph="X", ts=start, dur=stop - start, end=stop)


def _counts_as_host(trace: Trace) -> np.ndarray:
    """Which complete events the plugin would have typed PYTHON, OPERATOR or PROFILER_STEP."""
    cat, name = trace.complete_column("cat"), trace.complete_column("name")
    spelled = {s.lower() for s in trace.spellings}
    host = cat == "cpu_op"
    if trace.python_spelled_2021:
        host |= cat == "python_function"
    # A step is a PROFILER_STEP however recorded. Torch's other ranges (Optimizer., DataLoader,
    # DataPipe) were read as annotations from ops, OPERATORs to the plugin, where the file never
    # spells `user_annotation`.
    prefixes = STEP_PREFIX if "user_annotation" in spelled else ANNOTATION_PREFIXES
    annotations = np.flatnonzero(cat == "user_annotation")
    host[annotations] = [str(n).startswith(prefixes) for n in name[annotations]]
    return host
