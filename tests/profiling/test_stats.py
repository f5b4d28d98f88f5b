"""profiling.stats against independent routes: scipy's Mann–Whitney U (the oracle, in tests only) and a
plain-Python bootstrap loop with random.Random resampling."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from profiling.stats import (
    MAX_SAMPLES,
    mann_whitney_p,
    speedup_ci,
    stats_problem,
    timing_of,
    within_noise,
)

RNG = np.random.default_rng(19)


def untied(n: int, loc: float) -> list[float]:
    return (loc + RNG.standard_normal(n)).tolist()


def tied(n: int, loc: float) -> list[float]:
    """Timings as a coarse clock reads them: many equal values."""
    return np.round(loc + RNG.standard_normal(n), 0).tolist()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (untied(12, 0.0), untied(9, 0.5)),
        (untied(5, 0.0), untied(5, 3.0)),  # the fewest samples, far apart
        (untied(40, 0.0), untied(40, 0.0)),
        (tied(30, 0.0), tied(25, 1.0)),
        (tied(8, 0.0), tied(8, 0.0)),
        ([1.0] * 6 + [2.0], [1.0] * 3 + [2.0] * 4),  # heavy ties
        (untied(200, 0.0), untied(200, 0.2)),
    ],
)
def test_mann_whitney_matches_scipy_asymptotic(a, b):
    expected = mannwhitneyu(a, b, alternative="two-sided", method="asymptotic", use_continuity=True).pvalue
    assert mann_whitney_p(a, b) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert mann_whitney_p(b, a) == pytest.approx(expected, rel=1e-9, abs=1e-12)  # two-sided: symmetric


def test_mann_whitney_of_identical_values_is_one():
    assert mann_whitney_p([2.0] * 5, [2.0] * 6) == 1.0


@pytest.mark.parametrize(("a", "b"), [([1.0] * 4, [2.0] * 5), ([1.0] * 5, [2.0] * 4), ([1.0] * 5, [])])
def test_mann_whitney_needs_five_per_side(a, b):
    with pytest.raises(ValueError, match="give 5 to 200 samples"):
        mann_whitney_p(a, b)


def test_mann_whitney_refuses_non_finite():
    with pytest.raises(ValueError, match="finite"):
        mann_whitney_p([1.0, 2.0, 3.0, 4.0, float("nan")], [1.0] * 5)


def loop_bootstrap(base: list[float], other: list[float], resamples: int, seed: int) -> tuple[float, float]:
    """The percentile interval of median(base)/median(other), one resample at a time in plain Python."""
    rnd = random.Random(seed)
    ratios = sorted(
        statistics.median(rnd.choices(base, k=len(base))) / statistics.median(rnd.choices(other, k=len(other)))
        for _ in range(resamples)
    )
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


@pytest.mark.parametrize(("n_base", "n_other", "ratio"), [(30, 30, 4.0), (12, 50, 1.0), (7, 7, 1.5)])
def test_bootstrap_interval_agrees_with_a_plain_loop(n_base, n_other, ratio):
    base = (10.0 * np.exp(0.05 * RNG.standard_normal(n_base))).tolist()
    other = (10.0 / ratio * np.exp(0.05 * RNG.standard_normal(n_other))).tolist()
    point, lo, hi = speedup_ci(base, other)
    assert point == pytest.approx(statistics.median(base) / statistics.median(other), rel=1e-12)
    loop_lo, loop_hi = loop_bootstrap(base, other, 4000, seed=1)
    width = loop_hi - loop_lo
    # Two different random streams: the ends agree to a fraction of the interval's width.
    assert lo == pytest.approx(loop_lo, abs=0.15 * width) and hi == pytest.approx(loop_hi, abs=0.15 * width)
    assert lo <= point <= hi


def test_bootstrap_is_reproducible_and_seeded():
    base, other = untied(20, 10.0), untied(20, 9.0)
    assert speedup_ci(base, other) == speedup_ci(base, other)
    assert speedup_ci(base, other, seed=1) != speedup_ci(base, other)


def test_an_interval_that_contains_one_is_within_noise():
    same = (10.0 * np.exp(0.2 * RNG.standard_normal(40))).tolist()
    also = (10.0 * np.exp(0.2 * RNG.standard_normal(40))).tolist()
    _, lo, hi = speedup_ci(same, also)
    assert within_noise((lo, hi))
    _, lo, hi = speedup_ci([10.0, 10.1, 9.9, 10.05, 9.95], [5.0, 5.1, 4.9, 5.05, 4.95])
    assert not within_noise((lo, hi)) and lo > 1.8
    assert within_noise((1.0, 1.0)) and not within_noise((1.01, 2.0)) and not within_noise((0.5, 0.99))


@pytest.mark.parametrize(
    "bad",
    [
        ([1.0] * 4, [1.0] * 5),
        ([1.0] * (MAX_SAMPLES + 1), [1.0] * 5),
        ([1.0, 1.0, 1.0, 1.0, 0.0], [1.0] * 5),
        ([1.0] * 5, [1.0, 2.0, 3.0, 4.0, float("inf")]),
    ],
)
def test_bootstrap_refuses_too_few_or_bad_samples(bad):
    with pytest.raises(ValueError):
        speedup_ci(*bad)


def test_timing_reads_a_stats_dict_and_refuses_bad_ones():
    samples = [1.0, 1.2, 1.1, 5.0, 1.05]
    # The figures are the samples', whatever the dict claims beside them.
    timing = timing_of({"samples": samples, "p25": 9.0, "median": 9.0, "cv": 0.0, "noisy": False, "n": 5})
    assert timing is not None and timing.median == statistics.median(samples)
    assert timing.cv == pytest.approx(statistics.stdev(samples) / statistics.mean(samples))
    assert timing.noisy  # cv 0.8 > 0.10
    assert (timing.p25, timing.p75) == (1.05, 1.2)  # numpy's linear quartiles of 1.0, 1.05, 1.1, 1.2, 5.0
    for bad in (
        None,
        {},
        {"samples": []},
        {"samples": "1,2"},
        {"samples": [1.0, float("nan")]},
        {"samples": [1.0, 0.0]},  # no ratio of medians rests on a zero time
        {"samples": [1.0, True]},
        [1.0, 2.0],
    ):
        assert timing_of(bad) is None, bad
    assert stats_problem({"samples": [1.0] * (MAX_SAMPLES + 1)}).startswith("samples must be a list")
    assert stats_problem({"samples": [1.0, float("nan")]}) == "samples must be finite, non-negative numbers (ms)"
    assert stats_problem({"median": float("inf")}) == "median must be a finite number or null"
    assert stats_problem({"noisy": "yes"}) == "noisy must be true, false or null"
    assert stats_problem(None) is None and stats_problem({"samples": [0.0, 1.0]}) is None
