"""The unprofiled timing loop and its statistics: figures checked by the standard library, stop rules by a
scripted clock (no test here depends on this machine's speed)."""

from __future__ import annotations

import html
import json
import math
import re
import statistics

import pytest

from profiling.markdown import TIMED_HOW, metric_cards
from profiling.timing import (
    BUDGET_ENV,
    DEFAULT_BUDGET_S,
    MAX_CALLS,
    MIN_CALLS,
    NOISY_CV,
    STABLE_CV,
    stats_from_dict,
    stats_of,
    time_calls,
    timing_budget_s,
)


def test_the_agreed_thresholds():
    assert (STABLE_CV, NOISY_CV, MIN_CALLS, MAX_CALLS, DEFAULT_BUDGET_S) == (0.05, 0.10, 7, 200, 0.5)


@pytest.mark.parametrize(
    "samples",
    [[3.0], [2.0, 4.0], [1.0, 2.0, 3.0, 4.0, 100.0], [5.5, 5.1, 5.3, 5.2, 5.9, 5.4, 5.0, 6.1], [0.0, 0.0]],
)
def test_stats_match_the_standard_library(samples):
    got = stats_of(samples)
    # Linear interpolation between order statistics: statistics' "inclusive" method is numpy's default.
    p25, median, p75 = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else samples * 3
    assert (got.p25, got.median, got.p75) == pytest.approx((p25, median, p75))
    assert got.median == pytest.approx(statistics.median(samples))
    mean = statistics.fmean(samples)
    cv = statistics.stdev(samples) / mean if len(samples) > 1 and mean > 0 else 0.0
    assert got.cv == pytest.approx(cv) and got.noisy == (cv > NOISY_CV)
    assert (got.n, got.min, got.max, got.samples) == (len(samples), min(samples), max(samples), tuple(samples))
    assert got.half_iqr == pytest.approx((p75 - p25) / 2)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [1.0, math.inf], [-1.0], [[1.0, 2.0]]])
def test_stats_refuse_what_is_no_time(bad):
    with pytest.raises(ValueError, match="^samples_ms"):
        stats_of(bad)


def test_as_dict_is_json_native_and_reads_back():
    stats = stats_of([1.0, 1.2, 0.9, 5.0, 1.1, 1.0, 1.05])
    d = stats.as_dict()
    assert set(d) == {"n", "median", "p25", "p75", "min", "max", "cv", "noisy", "samples"}
    assert json.loads(json.dumps(d)) == d
    assert d["noisy"] is True and d["n"] == 7 and d["samples"] == list(stats.samples)
    again = stats_from_dict(json.loads(json.dumps(d)))
    assert again == stats


@pytest.mark.parametrize(
    "bad",
    [
        *(None, {}, {"median": 1.0}, {"samples": []}, {"samples": "12"}, {"samples": [1.0, None]}),
        *({"samples": [True]}, {"samples": [1.0, -2.0]}, {"samples": [float("nan")]}, [1.0, 2.0], "samples"),
        {"samples": [10**400]},
    ],
)
def test_stats_from_dict_is_none_for_anything_but_samples(bad):
    assert stats_from_dict(bad) is None


def test_stats_from_dict_keeps_at_most_max_calls():
    got = stats_from_dict({"samples": [1.0] * (MAX_CALLS + 50) + [9.0]})
    assert got is not None and got.n == MAX_CALLS and got.max == 1.0


def test_the_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(BUDGET_ENV, raising=False)
    assert timing_budget_s() == DEFAULT_BUDGET_S
    monkeypatch.setenv(BUDGET_ENV, "0.05")
    assert timing_budget_s() == 0.05


@pytest.mark.parametrize("bad", ["fast", "0", "-1", "nan", "inf"])
def test_a_bad_budget_names_the_variable(monkeypatch, bad):
    monkeypatch.setenv(BUDGET_ENV, bad)
    with pytest.raises(ValueError, match=f"^{BUDGET_ENV}"):
        timing_budget_s()


class ScriptedClock:
    """A clock that only moves when a call, or the setup before it, says it took time."""

    def __init__(self, durations_s: list[float], setup_s: float = 0.0) -> None:
        self.now, self.durations, self.setup_s, self.calls = 0.0, iter(durations_s), setup_s, 0
        self.log: list[str] = []

    def __call__(self) -> float:
        return self.now

    def call(self) -> None:
        self.calls += 1
        self.log.append("call")
        self.now += next(self.durations)

    def before(self) -> None:
        self.log.append("before")
        self.now += self.setup_s


def test_a_steady_call_stops_at_min_calls():
    clock = ScriptedClock([0.001] * 1000)
    got = time_calls(clock.call, budget_s=100, clock=clock)
    assert clock.calls == got.n == MIN_CALLS and got.samples == (pytest.approx(1.0),) * MIN_CALLS and got.cv == 0


def test_a_call_that_settles_stops_once_its_cv_is_stable():
    # 1.2 ms then 1 ms: cv falls as 1 ms samples pile up; stop at the first n >= 7 with cv <= 5% (n = 16).
    durations = [0.0012] + [0.001] * 999
    clock = ScriptedClock(durations)
    got = time_calls(clock.call, budget_s=100, clock=clock)
    samples = [d * 1e3 for d in durations]
    first = next(
        n for n in range(MIN_CALLS, 1000) if statistics.stdev(samples[:n]) / statistics.fmean(samples[:n]) <= STABLE_CV
    )
    assert got.n == first > MIN_CALLS and got.cv <= STABLE_CV


def test_a_noisy_call_stops_at_max_calls_keeping_max_calls_samples():
    clock = ScriptedClock([0.001, 0.002] * 500)
    got = time_calls(clock.call, budget_s=100, clock=clock)
    assert clock.calls == got.n == len(got.samples) == MAX_CALLS and got.noisy


def test_the_budget_stops_the_loop_before_min_calls():
    clock = ScriptedClock([0.1, 0.3] * 50)  # noisy: only the budget stops it
    got = time_calls(clock.call, budget_s=0.45, clock=clock)
    assert got.n == 3 and clock.now == pytest.approx(0.5)  # 0.1 + 0.3 < 0.45 <= 0.5


def test_one_call_longer_than_the_budget_is_timed_once():
    clock = ScriptedClock([2.0] * 10)
    got = time_calls(clock.call, budget_s=0.5, clock=clock)
    assert got.n == 1 and got.median == pytest.approx(2000.0) and not got.noisy


def test_the_setup_is_untimed_but_spends_the_budget():
    clock = ScriptedClock([0.001, 0.003] * 50, setup_s=0.1)
    got = time_calls(clock.call, before=clock.before, budget_s=0.35, clock=clock)
    assert got.samples == (pytest.approx(1.0), pytest.approx(3.0), pytest.approx(1.0), pytest.approx(3.0))
    assert clock.log == ["before", "call"] * 4  # 4 x 0.1 s of setup crossed the 0.35 s budget


def test_each_call_is_synced_on_both_sides_with_the_hooks_outside():
    clock = ScriptedClock([0.001] * 100)
    time_calls(
        clock.call,
        before=clock.before,
        after=lambda: clock.log.append("after"),
        sync=lambda: clock.log.append("sync"),
        budget_s=100,
        clock=clock,
    )
    assert clock.log == ["before", "sync", "call", "sync", "after"] * MIN_CALLS


def test_the_default_budget_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv(BUDGET_ENV, "0.25")
    clock = ScriptedClock([0.1, 0.2] * 50)
    assert time_calls(clock.call, clock=clock).n == 2  # 0.1 + 0.2 >= 0.25
    monkeypatch.setenv(BUDGET_ENV, "no")
    with pytest.raises(ValueError, match=BUDGET_ENV):
        time_calls(clock.call, clock=clock)


def test_the_real_clock_times_a_real_call():
    got = time_calls(lambda: sum(range(1000)), budget_s=0.05)
    assert 1 <= got.n <= MAX_CALLS and 0 < got.min <= got.median <= got.max


# ---- the cards -------------------------------------------------------------------------------------------------------


def card_row(markdown: str) -> dict[str, str]:
    """The cards as the page shows them: each `<dt>` label with its `<dd>` value, unescaped."""
    pairs = re.findall(r"<dt[^>]*>(.*?)</dt>\s*<dd[^>]*>(.*?)</dd>", markdown)
    return {html.unescape(label): html.unescape(value) for label, value in pairs}


def plain_figure(samples: list[float]) -> str:
    p25, median, p75 = statistics.quantiles(samples, n=4, method="inclusive")
    return f"{median:.3f} ± {(p75 - p25) / 2:.3f} ms"


def test_the_cards_show_forward_and_backward_the_same_way():
    forward, backward = [12.0, 12.4, 12.2, 12.1, 12.3, 12.2, 12.25], [30.0, 31.0, 30.5, 30.2, 30.8, 30.4, 30.6]
    summary = {
        "mode": "training",
        "forward_ms_stats": stats_of(forward).as_dict(),
        "backward_ms_stats": stats_of(backward).as_dict(),
        "forward_unprofiled_ms": statistics.median(forward),
        "backward_unprofiled_ms": statistics.median(backward),
        "forward_device_ms": 9.876,  # profiled figures: never shown beside the unprofiled ones
        "backward_device_ms": 50.812,
        "backward_cpu_ms": 61.234,
    }
    text = metric_cards(summary)
    row = card_row(text)
    assert row["forward (unprofiled)"] == plain_figure(forward)
    assert row["backward (unprofiled)"] == plain_figure(backward)
    assert TIMED_HOW in text and "median ± half the IQR" in TIMED_HOW
    assert not any(profiled in text for profiled in ("9.876", "50.812", "61.234"))


def test_a_noisy_card_is_marked_with_its_cv():
    samples = [1.0, 1.1, 0.9, 3.0, 1.0, 2.5, 1.2, 0.95]
    row = card_row(metric_cards({"forward_ms_stats": stats_of(samples).as_dict()}))
    cv = statistics.stdev(samples) / statistics.fmean(samples)
    assert row["forward (unprofiled)"] == f"≈ {plain_figure(samples)} (noisy, cv {100 * cv:.0f}%)"
    assert "backward (unprofiled)" not in row  # inference


@pytest.mark.parametrize("stats", [None, {"samples": ["<b>1</b>"]}, {"median": 3.0}])
def test_a_summary_without_samples_shows_its_lone_median(stats):
    """Summaries made before the spread was kept (or a hand-made one) show the median they carry."""
    row = card_row(metric_cards({"mode": "training", "forward_ms_stats": stats, "forward_unprofiled_ms": 4.5}))
    assert row["forward (unprofiled)"] == "4.500 ms" and row["backward (unprofiled)"] == "n/a"
