"""Which op made each launch: by nesting on today's traces, by `external id` on 2021 ones.

A launch (`cuda_runtime`/`cuda_driver`) belongs to an op; the op's device time is the GPU work the
launch caused, found through the launch's correlation id.
- torch >= 1.10 writes the launch's own correlation id as its `External id`, so the id names no op.
  The op is the innermost event around the launch on its thread (`structure.parent`), as torch's
  `key_averages` attributes kernels.
- torch 1.8-1.9 (Kineto 2021, `Trace.kineto_2021`) wrote the launching op's id there. The TensorBoard
  plugin (tb_plugin/torch_tb_profiler/profiler/event_parser.py, `NodeParserMixin.parse_nodes`) gives
  every runtime to the first host node with that id, on whatever thread; id 0 goes to no op. Its
  test_external_id says why: a 0 µs launch at the instant an op starts is child or sibling by
  time alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiling.structure import lane_codes, structure
from profiling.trace import LAUNCH_CATEGORIES, Trace, per_trace

# The host nodes a 2021 runtime can belong to (parse_nodes' OPERATOR, PROFILER_STEP, PYTHON and
# USER_ANNOTATION types, as the reader spells them today).
HOST_CATEGORIES = ("cpu_op", "user_annotation", "python_function")


@per_trace
def first_launches(trace: Trace) -> np.ndarray:
    """Rows of the launch events GPU work is attributed to: per correlation id, the first in the file.

    CUPTI gives every launch its own correlation id, and its GPU work carries that id; a trace whose
    launches share one (a merged or crafted file) cannot say which caused the work. Counting it once
    per launch multiplied device time (50 launches of one id made a 100 us kernel 5,000 us), so it
    goes to the first launch only, everywhere: the op table (`tables`), the steps and annotation
    tables (`windows`), and the step breakdown (`step_breakdown.launch_spans`, the same rule).

    Made once per trace (ten callers); read-only, since every caller shares it.
    """
    ev = trace.events
    launches = np.flatnonzero(trace.texts.isin("cat", LAUNCH_CATEGORIES))
    correlation = ev["correlation"].to_numpy()[launches]
    first = launches[~pd.Series(correlation).duplicated().to_numpy() & ~np.isnan(correlation)]
    first.setflags(write=False)
    return first


def launch_owners(trace: Trace) -> np.ndarray:
    """Per event: the row of the op that made it where the event is a launch, else -1 (cached)."""
    if trace.derived.launch_owners is None:
        ev = trace.events
        owner = np.full(len(ev), -1, dtype=np.int64)
        launches = np.flatnonzero(trace.texts.isin("cat", LAUNCH_CATEGORIES) & trace.texts.equals("ph", "X"))
        owner[launches] = _by_external_id(trace, launches) if trace.kineto_2021 else structure(trace).parent[launches]
        trace.derived.launch_owners = owner
    return trace.derived.launch_owners


def _by_external_id(trace: Trace, launches: np.ndarray) -> np.ndarray:
    """The plugin's rule: the first host event with the launch's external id; none for id 0 or no match.

    "First" as the plugin walks them: its threads in order of their first op, each thread's ops by
    start (it sorts events by `ts`, stably, before parsing).
    """
    ev = trace.events
    ids = ev["external_id"].to_numpy()
    hosts = np.flatnonzero(
        trace.texts.isin("cat", HOST_CATEGORIES) & trace.texts.equals("ph", "X") & ~np.isnan(ids) & (ids != 0)
    )
    lanes, ts = lane_codes(trace)[hosts], ev["ts"].to_numpy()[hosts]
    lane_start = pd.Series(ts).groupby(lanes).transform("min").to_numpy()
    hosts = hosts[np.lexsort((hosts, ts, lanes, lane_start))]
    first = pd.Series(hosts, index=ids[hosts])
    first = first[~first.index.duplicated()]
    return first.reindex(ids[launches]).fillna(-1).to_numpy(dtype=np.int64)
