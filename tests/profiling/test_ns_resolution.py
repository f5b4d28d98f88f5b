"""Real CPU profiles written as Kineto wrote them before `baseTimeNanoseconds` (epoch µs with ns digits,
~1.7e15): the op calls and the op tree agree with torch's own.

At 1.7e15 µs float64 steps by 0.25 µs, so a reader that parses these times as floats makes
back-to-back ns events collide and lets a child's end overhang its parent's: the tree then loses
and moves calls. The reader reads such times relative to a base before they become floats
(`profiling/timestamps.py`, `Rebase`). The expected values come from torch (`key_averages`, and each
FunctionEvent's `cpu_parent`) and from the file's text read with `Decimal`, never from the reader.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from profiling.structure import structure
from profiling.tables import merged_into_parent, op_table_from_trace
from profiling.trace import load_trace

EPOCH_NS = 1_700_000_000_123_456_789  # 2023-11-14, as a Kineto trace of then would start
RECORDINGS = 3


def _workload() -> None:
    """Small ops with small children, back to back: scalar wrapping, dtype promotion, `aten::mul`
    calling `aten::mul`, same-name siblings a fraction of a µs apart."""
    x, ints = torch.randn(8, 8), torch.arange(8)
    cond, q = x > 0, x[None, None]
    for _ in range(200):
        torch.where(cond, x, 0.5)
        torch.where(cond, 0.5, 1.5)
        torch.isclose(x, x)
        ints * 0.5
        ints + x[0]
        torch.std_mean(x)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)


@pytest.fixture(scope="module", params=range(RECORDINGS), ids=lambda i: f"recording{i}")
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[profile, Path]:
    """A real CPU profile, its events rewritten at 1.7e15 µs in Kineto's `%d.%03d` format."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _workload()
    directory = tmp_path_factory.mktemp(f"ns{request.param}")
    prof.export_chrome_trace(str(directory / "native.json"))
    return prof, kineto_2023(directory / "native.json", directory / "kineto_2023.json")


def _us(ns: int) -> str:
    """Kineto's format for a time in ns, before baseTimeNanoseconds: whole µs, a point, 3 digits."""
    whole, fraction = divmod(ns, 1000)
    return f"{whole}.{fraction:03d}"


def kineto_2023(path: Path, out: Path) -> Path:
    """The trace with every start moved to EPOCH_NS + (its ns - the first one's) and every duration
    kept, both written in Kineto's format. torch writes µs with 3 decimals: exact ns, read by Decimal."""
    document = json.loads(path.read_text(), parse_float=Decimal)
    events = document["traceEvents"]
    first = min(int(Decimal(e["ts"]) * 1000) for e in events if "ts" in e)
    numbers: dict[str, str] = {}
    for k, event in enumerate(events):
        if "ts" in event:
            numbers[f"@ts{k}@"] = _us(EPOCH_NS + int(Decimal(event["ts"]) * 1000) - first)
            event["ts"] = f"@ts{k}@"
        if "dur" in event:
            numbers[f"@dur{k}@"] = _us(int(Decimal(event["dur"]) * 1000))
            event["dur"] = f"@dur{k}@"
    text = re.sub(r'"(@\w+@)"', lambda m: numbers[m.group(1)], json.dumps(document, default=str))
    out.write_text(text)
    return out


def exact_starts(path: Path) -> list[Decimal]:
    events = json.loads(path.read_text(), parse_float=Decimal)["traceEvents"]
    return [Decimal(e["ts"]) for e in events if e.get("ph") == "X"]


def test_the_file_defeats_float64(recorded):
    """The input is the hard case: parsed as floats, the starts lose their ns digits (float64 steps by
    0.25 µs there), so events under 0.25 µs apart can collide."""
    _, path = recorded
    starts = exact_starts(path)
    assert min(starts) >= Decimal(2**53) / 1000 and np.spacing(float(min(starts))) == 0.25
    assert sum(Decimal(float(s)) != s for s in starts) > len(starts) / 2


def test_every_start_is_read_to_the_ns(recorded):
    _, path = recorded
    trace = load_trace(path)
    complete = trace.events[trace.events["ph"] == "X"]
    ours = [Decimal(trace.ts_base_us) + Decimal(t).quantize(Decimal("0.001")) for t in complete["ts"]]
    assert ours == exact_starts(path)


def test_op_calls_agree_with_key_averages(recorded):
    prof, path = recorded
    table = op_table_from_trace(load_trace(path))
    calls = dict(zip(table["name"], table["calls"], strict=True))
    assert calls == {e.key: e.count for e in prof.key_averages()}


def test_every_parent_agrees_with_torchs_tree(recorded):
    """torch's own tree (FunctionEvent.cpu_parent, after `_remove_dup_nodes`), event by event through the
    External id, which is the FunctionEvent's id."""
    prof, path = recorded
    torch_parent = {e.id: (e.cpu_parent.id if e.cpu_parent is not None else None) for e in prof.events()}
    trace = load_trace(path)
    s, ev = structure(trace), trace.events
    children = np.bincount(s.parent[s.parent >= 0], minlength=len(ev))
    kept = merged_into_parent(ev["name"].to_numpy(), s.parent, children)
    ids = ev["external_id"].to_numpy()
    ops = [row for row in np.flatnonzero(ev["cat"].to_numpy() == "cpu_op") if kept[row] == row]
    ours = {int(ids[row]): None if s.parent[row] < 0 else int(ids[kept[s.parent[row]]]) for row in ops}
    assert ours == torch_parent
