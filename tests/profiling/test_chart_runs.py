"""Compare's and Sweep's charts (issue 20, Charts): one metric per axis, every run shown, one colour per run in
every panel with a legend that names each colour, a stopped run's × on its own line, ticks at the swept values.

Expected values come from the rows by plain loops, never from the chart code's helpers.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from attention import AttentionSpec
from profiling.charts import compare_chart, sweep_chart
from profiling.compare import add_speedups
from profiling.sweep import point_times, sweep

MiB = 1024**2


def samples(median_ms: float, cv: float, n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return (median_ms * np.exp(cv * rng.standard_normal(n))).round(6).tolist()


def compare_rows() -> list[dict[str, Any]]:
    def row(variant: str, backend: str, median: float, kernels: int, mib: int, seed: int) -> dict[str, Any]:
        return {
            "variant": variant,
            "backend": backend,
            "forward_cpu_ms": median,
            "kernels_per_forward": kernels,
            "peak_memory_bytes": mib * MiB,
            "forward_ms_stats": {"samples": samples(median, 0.02, 30, seed)},
        }

    rows = [
        row("naive", "auto", 10.0, 6, 64, 1),
        row("inplace", "auto", 9.9, 5, 48, 2),
        row("sdpa", "math", 12.0, 20, 80, 3),
        row("sdpa", "flash", 2.5, 1, 8, 4),
        {"variant": "hub_flash", "backend": "auto", "error": "hub_flash needs a CUDA GPU (compute capability 8.0+)"},
    ]
    add_speedups(rows)
    return rows


def test_compare_draws_one_metric_per_axis_and_every_run():
    rows = compare_rows()
    fig = compare_chart(rows)
    axes = [(t.xaxis, t.yaxis) for t in fig.data]
    assert len(fig.data) == 3 and len(set(axes)) == 3  # three panels, one trace each, no shared value axis
    speedup, kernels, memory = fig.data
    labels = ["naive", "inplace", "sdpa-math", "sdpa-flash", "hub_flash"]
    assert all(list(t.y) == labels and t.orientation == "h" for t in fig.data)  # hub_flash keeps its row
    ok = [r for r in rows if "error" not in r]
    assert list(kernels.x) == [*(r["kernels_per_forward"] for r in ok), None]
    assert list(memory.x[:4]) == pytest.approx([r["peak_memory_bytes"] / MiB for r in ok]) and memory.x[4] is None
    # The speed-up by another route: the ratio of the medians of the samples.
    naive = np.median(rows[0]["forward_ms_stats"]["samples"])
    want = [naive / np.median(r["forward_ms_stats"]["samples"]) for r in ok]
    assert list(speedup.x[:4]) == pytest.approx(want, rel=1e-5) and speedup.x[4] is None
    for i, row in enumerate(ok):  # the error bars span the 95% interval
        lo, hi = row["speedup_ci"]
        assert speedup.x[i] + speedup.error_x.array[i] == pytest.approx(hi)
        assert speedup.x[i] - speedup.error_x.arrayminus[i] == pytest.approx(lo)
    layout = fig.layout.to_plotly_json()
    titles = {a["text"] for a in layout["annotations"] if a.get("xref") == "paper"}
    assert {"kernels per forward", "peak memory (MiB)"} <= titles and any("speed-up" in t for t in titles)
    not_run = [a for a in layout["annotations"] if a.get("text") == "not run here"]
    assert len(not_run) == 3 and all(a["y"] == "hub_flash" and "CUDA GPU" in a["hovertext"] for a in not_run)
    assert "CUDA GPU" in speedup.hovertext[4]
    assert fig.layout.title.text.startswith("sdpa-flash is ")


def test_compare_escapes_an_error_as_text():
    rows = [*compare_rows()[:1], {"variant": "flex", "backend": "auto", "error": "<script>x</script>"}]
    fig = compare_chart(rows)
    hovers = [fig.data[0].hovertext[1], *(a.hovertext for a in fig.layout.annotations if a.text == "not run here")]
    assert all("&lt;script&gt;" in h and "<script>" not in h for h in hovers)


def sweep_rows() -> list[dict[str, Any]]:
    """Three runs: one complete, one stopped after two points, one stopped before its first; a noisy point."""
    rows = []
    for run, scale, stop_at in (("naive", 1.0, 512), ("sdpa-flash", 0.3, None), ("sdpa-math", 1.5, 128)):
        for seq_len in (128, 256, 512, 1024):
            if stop_at is not None and seq_len >= stop_at:
                rows.append(
                    {
                        "run": run,
                        "seq_len": seq_len,
                        "status": "stopped",
                        "reason": "needs about 9 GiB, over the 4 GiB budget",
                        "q_len": None,
                        "forward_ms": None,
                        "peak_memory_bytes": None,
                    }
                )
                break
            ms = scale * (seq_len / 128) ** 2
            cv = 0.3 if seq_len == 256 else 0.02
            row = {"run": run, "seq_len": seq_len, "status": "ok", "reason": None, "q_len": seq_len}
            row |= {"peak_memory_bytes": int(scale * seq_len**2 * 64)}
            rows.append(row | point_times({"forward_ms_stats": {"samples": samples(ms, cv, 20, seq_len)}}))
    return rows


def colours(trace: Any) -> set[str]:
    found = {trace.line.color, trace.marker.color}
    return {c for c in found if isinstance(c, str)}


def test_sweep_has_one_colour_per_run_and_a_legend_for_every_colour():
    rows = sweep_rows()
    fig = sweep_chart(rows)
    runs = list(dict.fromkeys(r["run"] for r in rows))
    shown = [t for t in fig.data if t.showlegend is not False]
    legend_runs = [t.name for t in shown if t.name in runs]
    assert legend_runs == runs  # each run once, the stopped-before-any-point run included
    by_run: dict[str, set[str]] = defaultdict(set)
    for trace in fig.data:
        if trace.legendgroup:
            by_run[trace.legendgroup] |= colours(trace)
    assert set(by_run) == set(runs) and all(len(c) == 1 for c in by_run.values()), by_run
    assert len({next(iter(c)) for c in by_run.values()}) == len(runs)  # no two runs share a colour
    legend_colours = {c for t in shown for c in colours(t)}
    for trace in fig.data:  # every colour drawn names a legend entry
        assert colours(trace) <= legend_colours, (trace.name, colours(trace))
    memory = [t for t in fig.data if t.xaxis == "x2" and t.name in runs]
    assert {t.name for t in memory} == {"naive", "sdpa-flash"}  # sdpa-math has no point to draw


def test_a_stopped_run_is_marked_on_its_own_line_at_its_last_point():
    rows = sweep_rows()
    fig = sweep_chart(rows)
    last = {}
    for r in rows:  # a plain loop: each run's last point that ran
        if r["status"] == "ok":
            last[r["run"]] = r
    marks = [t for t in fig.data if t.name == "naive stopped"]
    assert len(marks) == 2  # one in each panel
    time_mark = next(t for t in marks if t.xaxis == "x")
    memory_mark = next(t for t in marks if t.xaxis == "x2")
    assert (time_mark.x[0], time_mark.y[0]) == (256, last["naive"]["forward_ms"])
    assert (memory_mark.x[0], memory_mark.y[0]) == (256, pytest.approx(last["naive"]["peak_memory_bytes"] / MiB))
    line = next(t for t in fig.data if t.name == "naive" and t.xaxis == "x")
    assert (line.x[-1], line.y[-1]) == (time_mark.x[0], time_mark.y[0])  # on the line, at its end
    assert time_mark.marker.symbol == "x" and time_mark.marker.color == line.line.color
    assert "stopped at seq_len 512" in time_mark.hovertext[0] and "4 GiB budget" in time_mark.hovertext[0]
    never = [t for t in fig.data if t.legendgroup == "sdpa-math"]
    assert len(never) == 1 and "stopped at seq_len 128" in never[0].hovertext[0]


def test_sweep_ticks_are_the_swept_values():
    rows = sweep_rows()
    fig = sweep_chart(rows)
    swept = sorted({r["seq_len"] for r in rows})
    for axis in (fig.layout.xaxis, fig.layout.xaxis2):
        assert axis.type == "log" and list(axis.tickvals) == swept and list(axis.ticktext) == [str(s) for s in swept]
    many = [
        {"run": "naive", "seq_len": 16 * k, "status": "ok", "forward_ms": float(k * k), "peak_memory_bytes": k}
        for k in range(1, 41)
    ]
    ticks = list(sweep_chart(many).layout.xaxis.tickvals)
    assert len(ticks) <= 13 and ticks[0] == 16 and ticks[-1] == 640 and set(ticks) <= {16 * k for k in range(1, 41)}


def test_a_real_sweep_draws_its_runs(tmp_path):
    spec = AttentionSpec(heads=2, head_dim=16, device="cpu")
    rows = sweep(spec, [("naive", "auto"), ("sdpa", "math")], [32, 64], tmp_path)
    fig = sweep_chart(rows)
    for run in {r["run"] for r in rows}:
        line = next(t for t in fig.data if t.name == run and t.xaxis == "x")
        want = [r["forward_ms"] for r in rows if r["run"] == run and r["status"] == "ok"]
        assert list(line.y) == want and list(line.x) == [32, 64]
    assert list(fig.layout.xaxis.tickvals) == [32, 64]
