"""bench/fidelity.py: its pure parts (shape, the app's figure, the paired bootstrap, the verdicts, the table),
and one quick run that checks the script works end to end (its figures are not asserted: they are timings)."""

from __future__ import annotations

import statistics

import pytest

from bench.fidelity import (
    ALL_RUNS,
    Fidelity,
    _parse_args,
    app_forward_ms,
    format_table,
    main,
    paired_ratio_ci,
    parse_shape,
    specs_for,
)


def test_shape_is_read_as_batch_heads_seq_len_head_dim():
    assert parse_shape("2x8x512x64") == (2, 8, 512, 64)
    assert parse_shape("1X2X64X16") == (1, 2, 64, 16)
    for bad in ("2x8x512", "2x8x512x64x1", "2x8xbigx64", "", "2x-8x512x64"):
        with pytest.raises(ValueError, match="BxHxSxD"):
            parse_shape(bad)


def test_the_app_figure_is_the_stats_median_else_the_old_key():
    stats = {"n": 9, "median": 12.5, "p25": 12.0, "p75": 13.0, "min": 11.0, "max": 20.0, "cv": 0.04, "noisy": False}
    assert app_forward_ms({"forward_ms_stats": stats, "forward_unprofiled_ms": 99.0}) == (
        12.5,
        0.04,
        "forward_ms_stats",
    )
    # Summaries made before the stats existed, or with them null, still give the app's one figure.
    assert app_forward_ms({"forward_unprofiled_ms": 7.25}) == (7.25, None, "forward_unprofiled_ms")
    assert app_forward_ms({"forward_ms_stats": None, "forward_unprofiled_ms": 7.25})[0] == 7.25


def test_ratio_is_median_over_median_and_reproducible():
    app = [10.0, 12.0, 11.0, 30.0, 10.5]
    timer = [9.0, 10.0, 11.0, 10.0, 9.5]
    ratio, lo, hi = paired_ratio_ci(app, timer)
    assert ratio == pytest.approx(statistics.median(app) / statistics.median(timer))
    assert lo <= ratio <= hi
    assert paired_ratio_ci(app, timer) == (ratio, lo, hi)  # fixed seed


def test_identical_figures_give_a_ratio_of_exactly_one():
    times = [5.0, 7.0, 6.0, 5.5]
    assert paired_ratio_ci(times, times) == (1.0, 1.0, 1.0)


def test_drift_shared_by_a_round_cancels_in_the_paired_interval():
    # The machine slows down 4x over the run; in every round the app reads 5% above the Timer.
    timer = [10.0, 15.0, 22.0, 31.0, 40.0, 12.0, 35.0, 18.0]
    app = [t * 1.05 for t in timer]
    ratio, lo, hi = paired_ratio_ci(app, timer)
    assert ratio == pytest.approx(1.05)
    # A resample that kept rounds apart could pair a slow app round with a fast Timer round; this one cannot.
    assert (lo, hi) == (pytest.approx(1.05), pytest.approx(1.05))


def test_a_single_round_gives_a_point_interval():
    assert paired_ratio_ci([12.0], [10.0]) == (pytest.approx(1.2), pytest.approx(1.2), pytest.approx(1.2))


@pytest.mark.parametrize(
    ("app", "timer"),
    [([], []), ([1.0, 2.0], [1.0]), ([1.0, 0.0], [1.0, 1.0]), ([1.0, float("nan")], [1.0, 1.0]), ([-1.0], [1.0])],
)
def test_bad_figures_are_refused(app, timer):
    with pytest.raises(ValueError):
        paired_ratio_ci(app, timer)


def test_verdicts_need_the_interval_inside_the_tolerance_and_around_one():
    steady = Fidelity("sdpa-flash", (10.0, 10.2, 9.9, 10.1), (10.0, 10.1, 10.0, 10.0))
    assert steady.contains_one and steady.within_tolerance and steady.goal_met
    biased = Fidelity("naive", (12.0, 12.1, 11.9, 12.0), (10.0, 10.0, 10.0, 10.0))  # 20% above, tightly
    assert not biased.contains_one and not biased.within_tolerance and not biased.goal_met
    wide = Fidelity("inplace", (7.0, 13.0, 10.0, 14.0, 6.0), (10.0, 10.0, 10.0, 10.0, 10.0))  # around 1, too noisy
    assert wide.contains_one and not wide.within_tolerance and not wide.goal_met
    tight_off = Fidelity("sdpa-math", (10.5, 10.5, 10.6, 10.5), (10.0, 10.0, 10.0, 10.0))  # within 10%, misses 1
    assert tight_off.within_tolerance and not tight_off.contains_one


def test_table_has_one_row_per_run_in_plain_and_markdown():
    runs = [
        Fidelity("naive", (11.0, 12.0, 11.5), (10.0, 11.0, 11.0), (0.02, 0.03, 0.04)),
        Fidelity("sdpa-flash", (6.0, 6.1, 6.2), (6.0, 6.0, 6.1)),
    ]
    markdown = format_table(runs, markdown=True).splitlines()
    assert len(markdown) == 4 and markdown[0].startswith("| run |") and set(markdown[1]) <= set("|:-")
    naive = [cell.strip() for cell in markdown[2].strip("|").split("|")]
    ratio, lo, hi = paired_ratio_ci(runs[0].app_ms, runs[0].timer_ms)
    within, contains = ("yes" if lo >= 0.9 and hi <= 1.1 else "NO"), ("yes" if lo <= 1 <= hi else "NO")
    assert naive == ["naive", "11.500", "11.000", f"{ratio:.3f} [{lo:.3f}, {hi:.3f}]", within, contains, "0.030"]
    assert markdown[3].endswith("| n/a |")  # no app stats: no cv shown, never a made-up one
    plain = format_table(runs).splitlines()
    assert len(plain) == 3 and len({len(line) for line in plain}) == 1  # aligned


def test_runs_the_cpu_cannot_take_are_named_with_their_reason():
    specs, refused = specs_for(ALL_RUNS, (1, 2, 64, 16))
    assert [s.name for s in specs] == ["naive", "inplace", "sdpa-auto", "sdpa-math", "sdpa-flash", "flex"]
    assert {name for name, _ in refused} == {"sdpa-efficient", "sdpa-cudnn", "hub_flash"}
    assert all("CUDA" in reason for _, reason in refused)
    assert {(s.batch, s.heads, s.seq_len, s.head_dim, s.device) for s in specs} == {(1, 2, 64, 16, "cpu")}


def test_options():
    quick = _parse_args(["--quick"])
    assert (quick.shape, quick.rounds, quick.timer_s, quick.runs) == ((1, 2, 64, 16), 3, 0.05, list(ALL_RUNS))
    full = _parse_args(["--variants", "naive,sdpa-math", "--rounds", "12", "--markdown"])
    assert (full.shape, full.rounds, full.runs, full.markdown) == (
        (2, 8, 512, 64),
        12,
        [("naive", "auto"), ("sdpa", "math")],
        True,
    )
    for bad in (["--shape", "2x8"], ["--variants", "fast"], ["--rounds", "0"], ["--timer-s", "0"]):
        with pytest.raises(SystemExit):
            _parse_args(bad)


def test_quick_run_prints_the_table(capsys):
    # In this process (torch and the profiler are already imported): the run costs about the worker's start.
    main(["--quick", "--variants", "sdpa-flash", "--rounds", "2", "--timer-s", "0.02", "--markdown"])
    out = capsys.readouterr().out
    assert "| sdpa-flash |" in out and "2 interleaved rounds" in out
    assert "goal (interval contains 1 and within 1 ± 0.10) met by" in out
