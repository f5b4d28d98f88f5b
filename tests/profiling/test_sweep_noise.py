"""A sweep's points carry their spread: the median, p25 and p75 of the forward's samples and whether they
are noisy; the chart draws the IQR as error bars, rings noisy points, and fits its guide to the medians."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from attention import AttentionSpec
from profiling.charts import NOISY_MARK, sweep_chart
from profiling.sweep import SPREAD_KEYS, point_times, sweep


def samples(median_ms: float, cv: float, n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return (median_ms * np.exp(cv * rng.standard_normal(n))).round(6).tolist()


def test_a_point_is_the_median_of_its_samples_with_their_quartiles():
    values = samples(4.0, 0.2, 25, 1)
    point = point_times({"forward_ms_stats": {"samples": values}, "forward_cpu_ms": 9.0})
    assert point["forward_ms"] == pytest.approx(statistics.median(values), abs=1e-6)
    q = statistics.quantiles(values, n=4, method="inclusive")  # numpy's linear quartiles, by another route
    assert (point["forward_ms_p25"], point["forward_ms_p75"]) == (pytest.approx(q[0]), pytest.approx(q[2]))
    assert statistics.stdev(values) / statistics.mean(values) > 0.10 and point["noisy"] is True
    old = point_times({"forward_cpu_ms": 9.0, "forward_unprofiled_ms": 3.0})
    assert old == {"forward_ms": 3.0, **dict.fromkeys(SPREAD_KEYS)}


def points() -> list[dict]:
    """naive at 128, 256, 512, its medians on S² but the first one noisy and high."""
    rows = []
    for seq_len, median, cv, seed in ((128, 1.6, 0.4, 2), (256, 4.0, 0.02, 3), (512, 16.0, 0.02, 4)):
        values = samples(median, cv, 30, seed)
        rows.append({"run": "naive", "seq_len": seq_len, "status": "ok", "q_len": seq_len, "peak_memory_bytes": 1})
        rows[-1] |= point_times({"forward_ms_stats": {"samples": values}})
    return rows


def test_the_chart_draws_the_iqr_and_rings_noisy_points():
    rows = points()
    fig = sweep_chart(rows)
    line = next(t for t in fig.data if t.name == "naive" and t.xaxis == "x")
    assert list(line.error_y.array) == pytest.approx([r["forward_ms_p75"] - r["forward_ms"] for r in rows])
    assert list(line.error_y.arrayminus) == pytest.approx([r["forward_ms"] - r["forward_ms_p25"] for r in rows])
    assert not line.error_y.symmetric
    ring = next(t for t in fig.data if t.name == NOISY_MARK)
    assert list(ring.x) == [128] and ring.marker.symbol == "circle-open" and ring.showlegend is not False


def test_the_guide_is_fitted_to_the_medians_not_anchored_at_the_first_point():
    rows = points()
    guide = next(t for t in sweep_chart(rows).data if t.name == "O(S²)")
    # Least squares in log space with the slope fixed at 2: log c = mean(log t - 2 log S).
    log_c = statistics.mean(math.log(r["forward_ms"]) - 2 * math.log(r["seq_len"]) for r in rows)
    assert list(guide.y) == pytest.approx([math.exp(log_c) * s**2 for s in (128, 256, 512)])
    anchored = rows[0]["forward_ms"] * 4  # the old guide at 256: the noisy first point times (256/128)²
    assert abs(guide.y[1] - rows[1]["forward_ms"]) < abs(anchored - rows[1]["forward_ms"])


def test_points_without_samples_have_no_error_bars():
    rows = [
        {"run": "naive", "seq_len": s, "status": "ok", "forward_ms": t, "peak_memory_bytes": 1}
        for s, t in ((64, 1.0), (128, 4.0))
    ]
    fig = sweep_chart(rows)
    assert all(t.error_y.array is None for t in fig.data) and not any(t.name == NOISY_MARK for t in fig.data)


def test_a_real_sweep_carries_the_spread(tmp_path):
    rows = sweep(AttentionSpec(heads=2, head_dim=16, device="cpu"), [("naive", "auto")], [32, 64], tmp_path)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    for r in rows:
        assert r["forward_ms_p25"] <= r["forward_ms"] <= r["forward_ms_p75"] and isinstance(r["noisy"], bool)
