"""Reading and analysing pause the cyclic collector, and leave it as they found it, whatever happens inside."""

import gc

import pytest

from profiling.analysis import analyze, load_trace
from profiling.gc_pause import paused_gc
from tests.conftest import DATA


@pytest.fixture
def collector():
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


@pytest.mark.parametrize("was_on", [True, False])
def test_paused_gc_restores_the_collector_after_an_error(collector, was_on):
    (gc.enable if was_on else gc.disable)()
    with pytest.raises(ZeroDivisionError), paused_gc():
        assert not gc.isenabled()
        1 / 0  # noqa: B018
    assert gc.isenabled() is was_on


def test_an_inner_pause_does_not_turn_the_collector_on_inside_an_outer_one(collector):
    gc.enable()
    with paused_gc():
        with paused_gc():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_analysis_runs_without_collections_and_turns_the_collector_back_on(collector):
    gc.enable()
    heard: list[bool] = []
    trace = load_trace(DATA / "sampled_training_rank0.json.gz")
    assert gc.isenabled()  # the read turned it back on
    analyze(trace, progress=lambda fraction, message: heard.append(gc.isenabled()))
    assert heard and not any(heard)
    assert gc.isenabled()
