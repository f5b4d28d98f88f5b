"""Nesting and subtree sums against plain loops, on random forests and on a hostile chain."""

import numpy as np
import pandas as pd

from profiling.structure import nest, propagate_up


def _subtree_sums(values, parent):
    """Each node plus all its descendants, by walking every node up to its root: the plain route."""
    total = [0.0] * len(values)
    for node, value in enumerate(values):
        at = node
        while at >= 0:
            total[at] += value
            at = parent[at]
    return total


def _depths(parent):
    depth = []
    for node in range(len(parent)):
        d, at = 0, parent[node]
        while at >= 0:
            d, at = d + 1, parent[at]
        depth.append(d)
    return np.array(depth)


def test_propagate_up_matches_walking_every_node_to_its_root():
    rng = np.random.default_rng(0)
    for size in (1, 2, 10, 500):
        parent = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, size)])  # parents come first
        values = rng.random(size)
        got = propagate_up(values, parent, _depths(parent))
        np.testing.assert_allclose(got, _subtree_sums(values, parent))


def test_identical_intervals_nest_into_a_chain_and_sum_along_it():
    # A hostile trace: n equal intervals on one lane nest n deep; every level must still be summed.
    n = 3000
    events = pd.DataFrame({"ph": ["X"] * n, "pid": ["1"] * n, "tid": ["1"] * n, "ts": [1.0] * n, "end": [2.0] * n})
    depth, parent = nest(events)
    assert sorted(depth.tolist()) == list(range(n))
    total = propagate_up(np.ones(n), parent, depth)
    assert sorted(total.tolist()) == [float(k) for k in range(1, n + 1)]
