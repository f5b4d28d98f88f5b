"""Findings as the summaries carry them: ranked by GPU time, JSON-native, and equal to the insights' text."""

import json
import math

import numpy as np
import pytest

from profiling.insights import ORDER, RULES, ranked
from profiling.insights.base import MAX_EVIDENCE_ITEMS, NAME_IN_PROSE, Insight


def insight(rule: str, share: float | None) -> Insight:
    return Insight(rule, rule.title(), f"about {share}", {}, share)


def test_findings_are_ranked_by_gpu_time_then_rule_order_and_small_ones_dropped():
    found = [insight("a", None), insight("b", 5.0), insight("c", 0.99), insight("d", 40.0), insight("e", None)]
    found += [insight("f", 5.0), insight("g", 1.0), insight("h", 0.0)]
    assert [i.rule for i in ranked(found)] == ["d", "b", "f", "g", "a", "e"]


def test_every_rule_in_order_is_registered_once():
    assert [r.name for r in RULES] == list(ORDER) and len(set(ORDER)) == len(ORDER)
    assert all(r.applies_to for r in RULES)


def test_a_record_holds_json_native_values_only():
    evidence = {
        "nan": math.nan,
        "inf": -math.inf,
        "numpy": np.float32(2.5),
        "count": np.int64(7),
        "flag": np.bool_(True),
        "names": ["x" * 500] * 30,
        "shape": (1, 2, 3),
        "nested": {"deep": [math.nan, {"k": np.nan}]},
        "array": np.arange(20),
        7: "key as text",
        "object": object,
    }
    record = Insight("rule", "Title", "detail", evidence, math.nan).record()
    text = json.dumps(record, allow_nan=False)  # raises on NaN or a value json cannot write
    back = json.loads(text)
    got = back["evidence"]
    assert back["gpu_time_percent"] is None and got["nan"] is None and got["inf"] is None
    assert got["numpy"] == 2.5 and got["count"] == 7 and got["flag"] is True
    assert len(got["names"]) == MAX_EVIDENCE_ITEMS and all(len(n) == NAME_IN_PROSE for n in got["names"])
    assert got["shape"] == [1, 2, 3] and got["nested"] == {"deep": [None, {"k": None}]}
    assert got["array"] == list(range(MAX_EVIDENCE_ITEMS)) and got["7"] == "key as text"
    assert got["object"].startswith("<class")


@pytest.mark.parametrize("share", [None, 12.5])
def test_the_insight_text_is_title_and_detail(share):
    i = insight("hidden_copy", share)
    assert i.text == f"{i.title}: {i.detail}" == f"{i.record()['title']}: {i.record()['detail']}"


def test_docs_list_every_rule_in_order_and_every_copy_cause():
    from profiling.copy_causes import CAUSES
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "rules.md").read_text()
    table = text.split("## The rules")[1].split("## ")[0]
    rows = [line.split("|")[1].strip().strip("`") for line in table.splitlines() if line.startswith("| `")]
    assert rows == list(ORDER)
    for cause in CAUSES:
        assert f"`{cause}`" in text
