"""The reader, field by field, against a plain-loop reference reader written here; and every trace vintage."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from profiling.trace import CATEGORY_SPELLINGS, NUMERIC_ARGS, OBJECT_ARGS, load_trace
from tests.conftest import DATA

VINTAGES = DATA / "vintages"
# The TensorBoard plugin's ResNet-50 sample (Kineto, June 2021): the old spellings at scale.
TB_PLUGIN = next(
    (p for p in (DATA / "tb_plugin", Path("/work/shared/traces/tb_plugin")) if p.is_dir()), DATA / "tb_plugin"
)
RESNET = TB_PLUGIN / "resnet50_num_workers_4.pt.trace.json.gz"
REAL_TRACES = [*sorted(DATA.glob("*.json.gz")), RESNET, TB_PLUGIN / "gpu_metrics_input.json"]

# Restated here, not imported: the old spellings and what they mean today (Kineto's ActivityType names).
TODAY = {
    "kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset", "runtime": "cuda_runtime",
    "driver": "cuda_driver", "operator": "cpu_op", "python": "python_function", "async": "ac2g",
    "hip_runtime": "cuda_runtime", "hip_driver": "cuda_driver",
}  # fmt: skip
OLD_ARG_KEYS = {"External id": "external id", "Input Dims": "Input dims"}


def _document(path: Path) -> Any:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _number(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else math.nan


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _lane(value: Any) -> str:
    return str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else "?"


def _arg(args: dict, key: str) -> Any:
    return args.get(key, args.get(OLD_ARG_KEYS.get(key, key)))


def reference_rows(document: Any) -> tuple[list[dict], int]:
    """What the event table must hold, by a plain loop over the JSON: the usable events, and the skipped count."""
    raw = document["traceEvents"] if isinstance(document, dict) else document
    rows, skipped = [], 0
    for event in raw:
        if not isinstance(event, dict):
            skipped += 1
            continue
        ph, name, ts, dur = _text(event.get("ph")), _text(event.get("name")), event.get("ts"), event.get("dur")
        ts, dur = _number(ts), _number(dur) if ph == "X" else 0.0
        usable = ph == "M" or (not math.isnan(ts) and (ph != "X" or (dur >= 0 and name != "")))
        if not usable:
            skipped += 1
            continue
        cat = TODAY.get(_text(event.get("cat")).lower(), _text(event.get("cat")))
        if cat == "cpu_op" and name.startswith("ProfilerStep#"):
            cat = "user_annotation"
        args = event["args"] if isinstance(event.get("args"), dict) else {}
        row = {"name": name, "cat": cat, "ph": ph, "ts": ts, "dur": 0.0 if math.isnan(dur) else dur}
        row |= {"end": ts + row["dur"], "pid": _lane(event.get("pid")), "tid": _lane(event.get("tid"))}
        row |= {column: _number(_arg(args, key)) for key, column in NUMERIC_ARGS.items()}
        row |= {column: _arg(args, key) for key, column in OBJECT_ARGS.items()}
        rows.append(row)
    return rows, skipped


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _same(have: Any, want: Any) -> bool:
    # A missing value may read as None or NaN; anything present must be equal, type included.
    if _missing(have) or _missing(want):
        return _missing(have) and _missing(want)
    return have == want and type(have) is type(want)


@pytest.mark.parametrize("path", REAL_TRACES + sorted(VINTAGES.glob("*.json")), ids=lambda p: p.name)
def test_every_field_matches_the_reference_reader(path):
    expected, skipped = reference_rows(_document(path))
    trace = load_trace(path)
    assert trace.skipped == skipped and len(trace.events) == len(expected)
    got = trace.events.to_dict(orient="records")
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        wrong = {k: (want[k], have[k]) for k in want if not _same(have[k], want[k])}
        assert not wrong, f"event {i}: {wrong}"


def test_resnet50_2021_spellings_count_as_today():
    raw = _document(RESNET)["traceEvents"]
    count = {old: sum(1 for e in raw if e.get("cat") == old) for old in ("Kernel", "Runtime", "Memcpy", "Memset")}
    steps = [e["name"] for e in raw if e.get("cat") == "Operator" and e["name"].startswith("ProfilerStep#")]
    trace = load_trace(RESNET)
    assert count["Kernel"] == len(trace.kernels) == 8868
    for old, new in (("Runtime", "cuda_runtime"), ("Memcpy", "gpu_memcpy"), ("Memset", "gpu_memset")):
        assert count[old] == len(trace.of_category(new)) > 0
    assert list(trace.of_category("user_annotation")["name"]) == steps and len(steps) == 6
    assert trace.kernels["external_id"].notna().all()  # spelled `external id` in 2021


def _comparable(path: Path) -> pd.DataFrame:
    events = load_trace(path).events
    # Metadata, memory instants and flow arrows differ in names or fields across vintages; the rest must not.
    flows = events[events["ph"].isin(("s", "f"))]
    assert flows["cat"].eq("ac2g").all()
    return events[~events["ph"].isin(("M", "i", "s", "f"))].reset_index(drop=True)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("kineto_2021.json", "kineto_2024.json"),
        ("rocm_hip_categories.json", "rocm_kineto.json"),
        ("driver_1x_style.json", "driver_and_sync.json"),
    ],
)
def test_old_and_new_spellings_give_the_same_table(old, new):
    pd.testing.assert_frame_equal(_comparable(VINTAGES / old), _comparable(VINTAGES / new))


def test_every_spelling_in_the_table_appears_in_a_test_trace():
    seen: set[str] = set()
    for path in [*VINTAGES.glob("*.json"), *REAL_TRACES]:
        document = _document(path)
        seen |= {e.get("cat") for e in (document["traceEvents"] if isinstance(document, dict) else document)}
    assert {spelling for spelling, _, _ in CATEGORY_SPELLINGS} <= seen


def test_nanosecond_traces_keep_microseconds():
    raw = _document(VINTAGES / "nanoseconds.json")
    trace = load_trace(VINTAGES / "nanoseconds.json")
    # displayTimeUnit only tells a viewer how to show times; ts and dur are microseconds, fractional here.
    assert list(trace.events["ts"]) == [e["ts"] for e in raw["traceEvents"]]
    assert list(trace.events["dur"]) == [e["dur"] for e in raw["traceEvents"]]
    assert trace.metadata["displayTimeUnit"] == "ns"
