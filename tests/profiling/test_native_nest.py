"""The compiled nesting walk (profiling/native_nest.py) against the plain walk of torch's rule, on random lanes with
every odd time, and against the whole-array steps on every real trace; and when `nest` takes it."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiling import structure as structure_module
from profiling.structure import END_SLACK_US, lane_codes, nest, nesting_order
from profiling.trace import load_trace
from tests.profiling.test_reader_typed import REAL
from tests.profiling.test_structure import _walked_plainly

native_nest = pytest.importorskip("profiling.native_nest", reason="numba is not installed: the numpy steps nest")

_TIMES = [0.0, 1.0, 2.0, 3.0, 5.0, math.nan, math.inf, -math.inf]
# Lengths within the 1 ns slack and past it, so children overhang their parents both ways.
_LENGTHS = [0.0, 0.0005, 0.002, 1.0, 2.0, 2.0005, 4.0, 10.0, math.nan]


def _in_nesting_order(lanes: np.ndarray, ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, ...]:
    with np.errstate(invalid="ignore"):  # an infinite start and end: inf - inf for the length
        order = nesting_order(lanes, ts, end)
    return lanes[order], ts[order], end[order]


@settings(max_examples=800, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(_TIMES), st.sampled_from(_LENGTHS)),
        max_size=60,
    )
)
def test_compiled_parents_and_depths_are_the_walks(events):
    # NaN and infinite times (every comparison false), overhangs within and past the slack, lanes changing.
    lanes = np.array([e[0] for e in events], dtype=np.int32)
    ts = np.array([e[1] for e in events], dtype=float)
    with np.errstate(invalid="ignore"):
        end = ts + np.array([e[2] for e in events], dtype=float)
    lane, start, stop = _in_nesting_order(lanes, ts, end)
    parents, depths = native_nest.walked(lane, start, stop, END_SLACK_US)
    assert (parents.tolist(), depths.tolist()) == _walked_plainly(lane.tolist(), start.tolist(), stop.tolist())


def test_compiled_walk_on_long_random_lanes_and_a_deep_chain():
    rng = np.random.default_rng(31)
    size = 50_000
    lanes = rng.integers(0, 5, size)
    ts = np.round(rng.uniform(0, size / 4, size), 1)
    end = ts + rng.choice([0.0, 0.0005, 0.1, 0.5, 2.0, 20.0, 200.0], size)
    lane, start, stop = _in_nesting_order(lanes, ts, end)
    parents, depths = native_nest.walked(lane, start, stop, END_SLACK_US)
    assert (parents.tolist(), depths.tolist()) == _walked_plainly(lane.tolist(), start.tolist(), stop.tolist())
    assert depths.max() > 3
    # A chain 100,000 deep: each the parent of the next, the stack as deep as the events.
    deep = 100_000
    starts, stops = np.arange(deep, dtype=float), 2.0 * deep - np.arange(deep)
    parents, depths = native_nest.walked(np.zeros(deep, np.int64), starts, stops, END_SLACK_US)
    assert parents.tolist() == list(range(-1, deep - 1)) and depths.tolist() == list(range(deep))


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_nest_by_the_compiled_walk_is_nest_by_the_numpy_steps_on_every_real_trace(path, monkeypatch):
    trace = load_trace(path)
    lanes = lane_codes(trace)
    monkeypatch.setattr(structure_module, "compiled_walk", lambda: native_nest.walked)
    compiled = nest(trace.events, lanes)
    monkeypatch.setattr(structure_module, "compiled_walk", lambda: None)
    stepped = nest(trace.events, lanes)
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(compiled, stepped, strict=True))


def test_the_compiled_walk_is_taken_where_the_reader_would_take_the_compiled_decoder(monkeypatch):
    monkeypatch.setenv("PROFILING_NATIVE", "0")
    assert structure_module.compiled_walk() is None
    monkeypatch.setenv("PROFILING_NATIVE", "1")
    assert structure_module.compiled_walk() is native_nest.walked
    monkeypatch.delenv("PROFILING_NATIVE")
    assert "numba" in sys.modules  # loaded by this module's import
    assert structure_module.compiled_walk() is native_nest.walked


def test_nesting_alone_never_loads_numba():
    # A small trace in a fresh process: the numpy steps nest it, and numba is not loaded for them.
    code = (
        "import sys; from profiling.trace import load_trace; from profiling.structure import structure; "
        "s = structure(load_trace('tests/data/a100_simple_add.json.gz')); "
        "print(int((s.parent >= 0).sum()), 'numba' in sys.modules)"
    )
    root = Path(__file__).parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    nested, loaded = out.stdout.split()
    assert int(nested) > 0 and loaded == "False", out.stderr
