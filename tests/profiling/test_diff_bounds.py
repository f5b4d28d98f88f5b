"""/diff is bounded: a summary whose op or kernel maps hold too many names, or too long a name, is refused
by field (`before` or `after`) before anything is diffed; one at the bounds is diffed in full."""

from __future__ import annotations

import pytest

from attention import AttentionSpec
from profiling.diff import MAX_NAME_CHARS, MAX_NAMES, DiffError, diff_summaries
from profiling.pipeline import profile_attention
from profiling.worker import Worker


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A real run's summary, as /profile returns it."""
    spec = AttentionSpec(variant="naive", seq_len=32, device="cpu")
    out = tmp_path_factory.mktemp("diff-bounds")
    return dict(profile_attention(spec, out, worker=Worker(enabled=False)).summary)


def with_names(summary: dict, key: str, names: dict) -> dict:
    """`summary` with `names` added to its `key` map."""
    return {**summary, key: {**(summary.get(key) or {}), **names}}


@pytest.mark.parametrize("key", ["per_forward_ops", "per_forward_kernels"])
@pytest.mark.parametrize("side", ["before", "after"])
def test_too_many_names_are_refused_naming_the_side(summary, key, side):
    crafted = with_names(summary, key, {f"op{i}": 1.0 for i in range(300_000)})
    pair = {"before": summary, "after": summary, side: crafted}
    total = len(crafted[key])
    with pytest.raises(DiffError) as caught:
        diff_summaries(pair["before"], pair["after"])
    assert str(caught.value) == f"{side}: {key} holds {total:,} names; a run's summary holds at most 10,000"


def test_the_size_is_checked_before_anything_is_read(summary):
    # `before` has a wrong value that reading it would report; `after` is too big: the size comes first,
    # and a huge map of wrong values is refused for its size, not read value by value.
    bad_value = with_names(summary, "per_forward_ops", {"aten::mm": "many"})
    huge = with_names(summary, "per_forward_ops", {f"op{i}": None for i in range(MAX_NAMES + 1)})
    with pytest.raises(DiffError, match="^after: per_forward_ops holds 10,0"):
        diff_summaries(bad_value, huge)
    with pytest.raises(DiffError, match="^before: per_forward_ops must map names to finite numbers"):
        diff_summaries(bad_value, summary)


def test_a_name_past_4_kb_is_refused(summary):
    long = with_names(summary, "per_forward_kernels", {"k" * (MAX_NAME_CHARS + 1): 1.0})
    with pytest.raises(DiffError) as caught:
        diff_summaries(summary, long)
    assert str(caught.value) == "after: per_forward_kernels must map names of at most 4,096 characters to numbers"
    assert len(str(caught.value)) < 200


def test_summaries_at_the_bounds_are_diffed_in_full(summary):
    room = MAX_NAMES - len(summary["per_forward_ops"])
    names = {f"op{i}": float(i % 3) for i in range(room - 1)} | {"x" * MAX_NAME_CHARS: 2.0}
    after = with_names(summary, "per_forward_ops", names)
    assert len(after["per_forward_ops"]) == MAX_NAMES
    table = diff_summaries(summary, after)
    # Every added name with a nonzero count is a row; op{i} with i % 3 == 0 counts 0 and is no change.
    added = sum(1 for i in range(room - 1) if i % 3) + 1
    ops = table[table["kind"] == "op"]
    assert len(ops) == added and set(ops["status"]) == {"added"}
