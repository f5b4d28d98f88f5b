"""The memory view's curve, thinned for drawing: each device's allocated and reserved bytes over time, at
most MAX_CURVE_POINTS a series, with every peak and trough that a pixel could show (profiling/views.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MAX_CURVE_POINTS = 2000  # points per drawn series (a device's allocated or reserved bytes)
CURVE_COLUMNS = ["device", "series", "time (ms)", "bytes"]


def thinned_curves(curves: pd.DataFrame, devices: list[str], origin: float) -> pd.DataFrame:
    """Each device's allocated and reserved bytes over time, thinned; a reserved series that stays 0 (the
    CPU allocator reserves nothing) is left out."""
    parts = []
    for device in devices:
        mine = curves[curves["device"].to_numpy() == device]
        for series in ("allocated", "reserved"):
            values = mine[series].to_numpy(dtype=np.float64)
            known = np.isfinite(values)
            values, ts = values[known], mine["ts"].to_numpy(dtype=np.float64)[known]
            if not len(values) or (series == "reserved" and not values.any()):
                continue
            kept = thin(values)
            parts.append(
                pd.DataFrame(
                    {
                        "device": device,
                        "series": series,
                        "time (ms)": (ts[kept] - origin) / 1000.0,
                        "bytes": values[kept],
                    },
                    columns=CURVE_COLUMNS,
                )
            )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=CURVE_COLUMNS)


def thin(values: np.ndarray, max_points: int = MAX_CURVE_POINTS) -> np.ndarray:
    """Ascending positions of `values` to draw, at most `max_points` (from 4): the first and the last, and
    in each of (max_points - 2) // 2 runs of consecutive points its first lowest and first highest value.
    So the highest value at its first position, and the lowest, survive exactly, and a spike shows
    however narrow. `values` must hold no NaN."""
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    runs = (max(max_points, 4) - 2) // 2
    run = np.arange(n, dtype=np.int64) * runs // n  # nondecreasing, every run non-empty
    grouped = pd.Series(values).groupby(run, sort=True)
    kept = np.concatenate([[0, n - 1], grouped.idxmin().to_numpy(), grouped.idxmax().to_numpy()])
    return np.unique(kept)
