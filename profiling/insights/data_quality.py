"""Data quality: values a trace gives that cannot be true, and what the analysis did instead."""

from __future__ import annotations

import numpy as np

from profiling.gpu_metrics import valid_blocks_per_sm, valid_occupancy
from profiling.insights.base import Evidence, Finding, Rule
from profiling.tables import shared_correlation_launches


def impossible_values(ev: Evidence) -> Finding | None:
    """Values the trace gives that cannot be true, and what every table and metric did instead."""
    trace = ev.trace
    shared = shared_correlation_launches(trace)
    occupancy = trace.kernels["occupancy"].to_numpy()
    bad_occupancy = ~np.isnan(occupancy) & np.isnan(valid_occupancy(occupancy))
    blocks = trace.kernels["blocks_per_sm"].to_numpy()
    bad_blocks = ~np.isnan(blocks) & np.isnan(valid_blocks_per_sm(blocks))
    found = []
    if shared:
        found.append(
            f"{shared} launch event(s) reuse the correlation id of an earlier launch, which CUPTI never does: the "
            "GPU work with that id is counted once, for the first launch, not once per launch"
        )
    if bad_occupancy.any():
        found.append(
            f"{bad_occupancy.sum()} kernel event(s) give an est. achieved occupancy outside 0..100% (from "
            f"{occupancy[bad_occupancy].min():.4g} to {occupancy[bad_occupancy].max():.4g}): left out of every "
            "occupancy figure, as a missing value is"
        )
    if bad_blocks.any():
        found.append(
            f"{bad_blocks.sum()} kernel event(s) give a negative or larger-than-any-grid blocks per SM: left out, "
            "as a missing value is"
        )
    if not found:
        return None
    return Finding(
        "Impossible values left out",
        "; ".join(found) + ".",
        {
            "launches_sharing_correlation": shared,
            "occupancy_out_of_range": int(bad_occupancy.sum()),
            "blocks_per_sm_out_of_range": int(bad_blocks.sum()),
        },
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "impossible_values",
        "shared correlation ids, occupancy outside 0..100%, impossible blocks per SM",
        impossible_values,
    ),
)
