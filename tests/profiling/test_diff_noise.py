"""/diff calls a time "changed" only when the samples say so (Mann–Whitney p < 0.01 and at least 5%);
counts and bytes keep their exact diff. Injected samples from a fixed seed, then two real runs."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from attention import AttentionSpec
from profiling.diff import DIFF_COLUMNS, DiffError, diff_summaries
from profiling.pipeline import profile_attention
from profiling.worker import Worker

BASE = {
    "device": "cpu",
    "per_forward_ops": {"aten::mm": 2.0},
    "per_forward_kernels": {"aten::mm": 2.0},
    "kernels_per_forward": 2,
    "ops_per_forward": 2,
    "forward_cpu_ms": 3.0,
    "peak_memory_bytes": 1000,
    "copied_bytes_per_forward": 0,
}


def samples(median_ms: float, cv: float, n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return (median_ms * np.exp(cv * rng.standard_normal(n))).round(6).tolist()


def summary(forward: list[float] | None = None, backward: list[float] | None = None, **keys: object) -> dict:
    """A summary with the given forward (and backward) samples, as `*_ms_stats` carries them."""
    out = {**BASE, **keys}
    for key, values in (("forward_ms_stats", forward), ("backward_ms_stats", backward)):
        if values is not None:
            out[key] = {"n": len(values), "median": statistics.median(values), "samples": values}
    if forward is not None:
        out["forward_unprofiled_ms"] = statistics.median(forward)
    return out


def time_row(table, name: str = "forward time (ms)") -> dict:
    rows = table[table["name"] == name]
    assert len(rows) == 1
    return rows.iloc[0].to_dict()


def test_a_six_percent_change_with_tight_samples_is_changed():
    before, after = samples(10.0, 0.01, 30, 1), samples(10.6, 0.01, 30, 2)
    row = time_row(diff_summaries(summary(before), summary(after)))
    a, b = statistics.median(before), statistics.median(after)
    assert (row["before"], row["after"]) == (pytest.approx(a, abs=1e-4), pytest.approx(b, abs=1e-4))
    assert row["change %"] == pytest.approx((b - a) / a * 100, abs=0.01) and row["change %"] > 5
    expected_p = mannwhitneyu(before, after, method="asymptotic").pvalue
    assert row["p value"] == pytest.approx(expected_p, rel=1e-2) and row["p value"] < 0.01
    assert row["status"] == "changed"
    q = np.percentile(before, [25, 75])
    assert row["before p25–p75"] == f"{q[0]:.4g}–{q[1]:.4g}"


def test_a_real_but_small_change_is_within_noise():
    """p far below 0.01, but 3%: under the 5% a change must reach."""
    row = time_row(diff_summaries(summary(samples(10.0, 0.005, 40, 3)), summary(samples(10.3, 0.005, 40, 4))))
    assert row["p value"] < 1e-6 and abs(row["change %"]) < 5 and row["status"] == "within noise"


def test_a_hundredfold_change_between_single_samples_is_not_a_change():
    """The issue's "1.09 → 99.98 ms, changed": one call each tells nothing."""
    row = time_row(diff_summaries(summary([1.09]), summary([99.98])))
    assert (row["before"], row["after"], row["status"]) == (1.09, 99.98, "no samples")
    assert row["p value"] is None


def test_a_hundredfold_change_of_medians_between_noisy_overlapping_runs_is_within_noise():
    """A loaded machine: both runs flip between 1 ms and 100 ms; the medians land 100× apart."""
    before = [1.0, 1.05, 1.09, 1.1, 1.2, 98.0, 99.5, 101.0]
    after = [1.02, 1.1, 99.0, 99.98, 100.2, 100.5, 101.0, 102.0]
    row = time_row(diff_summaries(summary(before), summary(after)))
    assert row["after"] / row["before"] > 50
    assert row["p value"] == pytest.approx(mannwhitneyu(before, after, method="asymptotic").pvalue, rel=1e-2)
    assert row["p value"] > 0.01 and row["status"] == "within noise"


def test_old_summaries_have_no_samples_and_identical_ones_are_the_same():
    row = time_row(diff_summaries(summary(forward_cpu_ms=2.0), summary(forward_cpu_ms=4.0)))
    assert (row["before"], row["after"], row["status"], row["p value"]) == (2.0, 4.0, "no samples", None)
    assert row["change %"] == 100.0 and row["before p25–p75"] is None
    one_side = time_row(diff_summaries(summary(forward_cpu_ms=2.0), summary(samples(2.0, 0.01, 20, 5))))
    assert one_side["status"] == "no samples"
    same = samples(5.0, 0.02, 20, 6)
    assert time_row(diff_summaries(summary(same), summary(same)))["status"] == "same"


def test_the_backward_is_tested_too_and_counts_keep_their_plain_diff():
    before = summary(samples(5.0, 0.01, 20, 7), samples(10.0, 0.01, 20, 8), kernels_per_backward=4)
    after = summary(samples(5.0, 0.01, 20, 9), samples(20.0, 0.01, 20, 10), kernels_per_backward=3)
    after["peak_memory_bytes"] = 2000
    table = diff_summaries(before, after)
    assert list(table.columns) == DIFF_COLUMNS and DIFF_COLUMNS[:6] == [
        *("kind", "name", "before", "after", "change", "status")
    ]
    backward = time_row(table, "backward time (ms)")
    assert backward["status"] == "changed" and backward["change %"] > 90
    assert time_row(table)["status"] == "within noise"
    memory = time_row(table, "peak memory (bytes)")
    assert (memory["change"], memory["status"], memory["p value"], memory["change %"]) == (1000, "changed", None, None)
    json.dumps(table.to_dict(orient="records"))  # no NaN where a row has no p value: the endpoint returns JSON
    assert "NaN" not in json.dumps(table.to_dict(orient="records"))


@pytest.mark.parametrize(
    ("stats", "message"),
    [
        ({"samples": [1.0] * 201}, "after: forward_ms_stats.samples holds 201 samples; a summary keeps at most 200"),
        ({"samples": [1.0] * 10_000_000}, "after: forward_ms_stats.samples holds 10,000,000 samples"),
        ({"samples": [1.0, float("nan")]}, "after: forward_ms_stats: samples must be finite, non-negative numbers"),
        ({"samples": [1.0, -2.0]}, "after: forward_ms_stats: samples must be finite, non-negative numbers"),
        ({"samples": "1,2"}, "after: forward_ms_stats: samples must be a list of at most 200 numbers"),
        ({"median": float("inf")}, "after: forward_ms_stats: median must be a finite number or null"),
        ({"noisy": "yes"}, "after: forward_ms_stats: noisy must be true, false or null"),
        ([1.0], "after: forward_ms_stats: must be an object of timing statistics or null"),
    ],
)
def test_bad_stats_are_refused_by_field(stats, message):
    with pytest.raises(DiffError) as caught:
        diff_summaries(BASE, {**BASE, "forward_ms_stats": stats})
    assert str(caught.value).startswith(message)
    with pytest.raises(DiffError, match="^before: backward_ms_stats"):
        diff_summaries({**BASE, "backward_ms_stats": stats}, BASE)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Two real runs' summaries, as /profile returns them."""
    out, where = {}, tmp_path_factory.mktemp("diff-noise")
    for variant in ("naive", "inplace"):
        spec = AttentionSpec(variant=variant, seq_len=64, device="cpu")
        out[variant] = dict(profile_attention(spec, where, worker=Worker(enabled=False)).summary)
    return out


def test_real_runs_are_diffed_on_their_samples(real):
    naive, inplace = real["naive"], real["inplace"]
    a, b = naive["forward_ms_stats"]["samples"], inplace["forward_ms_stats"]["samples"]
    row = time_row(diff_summaries(naive, inplace))
    assert row["before"] == pytest.approx(statistics.median(a), abs=1e-4)
    assert row["after"] == pytest.approx(statistics.median(b), abs=1e-4)
    if min(len(a), len(b)) >= 5:
        assert row["p value"] == pytest.approx(mannwhitneyu(a, b, method="asymptotic").pvalue, rel=1e-2, abs=1e-12)
        changed = row["p value"] < 0.01 and abs(row["change %"]) >= 5
        assert row["status"] == ("changed" if changed else "within noise")
    else:
        assert row["status"] == "no samples"
    assert time_row(diff_summaries(naive, naive))["status"] == "same"
