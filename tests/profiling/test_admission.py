"""Memory admission for /analyze: exact JSON counts, and the two charges (before the read, from the JSON; once
read, from the events) checked against the peak RSS of real analyses measured in a fresh process, against a
plain loop over the JSON, and through an upload and a diff that grow their share (the budget itself:
test_budget.py)."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from attention.budget import BudgetError, MemoryBudget
from profiling.admission import (
    BYTES_PER_VALUE,
    FRAME_COPIES,
    PEAK_BASE_BYTES,
    PEAK_PER_INFLATED_BYTE,
    PEAK_PER_OBJECT,
    PEAK_PER_ROW,
    PEAK_PER_TEXT,
    VIEW_PEAK_PER_ROW,
    AdmissionError,
    AnalysisGate,
    TopUp,
    analysis_cost,
    analysis_need_bytes,
    charged_reads,
    elements_opened,
)
from profiling.reader import NUMERIC_ARGS, OBJECT_ARGS, Limits, TraceError
from profiling.trace import load_trace
from profiling.trace_diff import diff_uploads
from profiling.uploads import AnalysisWorker, analyze_upload
from profiling.worker import Worker
from tests.timing_slack import slack

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
REAL = DATA / "sampled_training_rank0.json.gz"  # a real CUDA training trace, 4,855 events
MiB, GiB = 1024**2, 1024**3

# Run in a fresh process: the peak RSS growth (VmHWM, reset after the imports) of what /analyze
# does with one upload: read the trace, then analyse it, round the tables, draw the timeline and steps
# chart; or, given a view's name, what /trace_views does. Printed: the growth once read (what the first
# charge must hold), in all, and the second charge computed from the events read.
PEAK_CHILD = """
import json, sys
from profiling.admission import PEAK_PER_ROW, VIEW_PEAK_PER_ROW, analysis_need_bytes
from profiling.analysis import analyze
from profiling.charts import timeline, window_chart
from profiling.tables import rounded
from profiling.trace import load_trace
from profiling.views import view

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

before = rss("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # the high-water mark restarts from here
trace = load_trace(sys.argv[1])
read = rss("VmHWM") - before
if len(sys.argv) > 2:
    need = analysis_need_bytes(trace, VIEW_PEAK_PER_ROW)
    rounded(view(trace, sys.argv[2]).table)
else:
    need = analysis_need_bytes(trace, PEAK_PER_ROW)
    result = analyze(trace)
    rounded(result.op_table), rounded(result.kernel_table), timeline(result), window_chart(result.steps)
print(json.dumps({"read": read, "growth": rss("VmHWM") - before, "need": need, "events": len(trace.events)}))
"""


def scaled_trace(copies: int, out: Path) -> int:
    """`REAL` repeated `copies` times, each copy shifted past the last in time, ids and step numbers,
    so it reads as one longer real trace. Returns the JSON's size in bytes."""
    document = json.loads(gzip.decompress(REAL.read_bytes()))
    events = document.pop("traceEvents")
    times = [e["ts"] for e in events if e.get("ph") == "X"]
    span = max(times) - min(times) + 1000
    parts = []
    for k in range(copies):
        for event in events:
            if event.get("ph") == "M" and k:
                continue  # process and thread names once
            copy = {**event, "ts": event["ts"] + k * span} if "ts" in event else dict(event)
            if isinstance(copy.get("args"), dict):
                copy["args"] = {
                    key: value + k * 10**7 if key in ("correlation", "External id", "Ev Idx") else value
                    for key, value in copy["args"].items()
                }
            if copy.get("name", "").startswith("ProfilerStep#"):
                copy["name"] = f"ProfilerStep#{int(copy['name'][13:]) + 10 * k}"
            parts.append(json.dumps(copy))
    head = json.dumps(document)[:-1]
    out.write_text(f'{head}, "traceEvents": [{",".join(parts)}]}}')
    return out.stat().st_size


# ---------------------------------------------------------------- the cost of a trace


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.json.gz")))
def test_cost_counts_the_inflated_json_exactly(name):
    path = DATA / name
    text = gzip.decompress(path.read_bytes())
    size, events = len(text), len(json.loads(text)["traceEvents"])
    cost = analysis_cost(path)
    assert cost.inflated_bytes == size
    # Every event is an object that is an element of an array; a real trace holds few others (lists of
    # objects), so the count is close above the events, where all `{` were 2-3 times as many.
    assert events <= cost.objects <= 1.1 * events + 20
    assert cost.peak_bytes == PEAK_BASE_BYTES + int(max(PEAK_PER_INFLATED_BYTE * size, PEAK_PER_OBJECT * cost.objects))
    load_trace(path, **cost.reader_limits())  # the read fits the limit the count set


@pytest.mark.parametrize(
    "text",
    [
        b'{"traceEvents":[{"ts":1},1,{"ts":2},"},{",{"args":{"a":{}}}]}',
        b'{"traceEvents": [ {"ts": 1} ,\n\t{"ts": 2},\r\n  {"args": [{}, {}]}]}',
        b'[{"ts":1},{"ts":2},{"ts":3}]',
    ],
    ids=["compact, mixed elements", "pretty-printed", "a bare list"],
)
def test_the_event_count_is_never_below_the_objects_in_arrays(text, tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(text)
    document = json.loads(text)
    events = document if isinstance(document, list) else document["traceEvents"]
    in_arrays = sum(isinstance(e, dict) for e in events) + text.count(b"{}, {}")  # the args' list of two
    assert analysis_cost(path).objects >= in_arrays


def test_plain_json_costs_its_size(tmp_path):
    path = tmp_path / "trace.json"
    path.write_bytes(gzip.decompress(REAL.read_bytes()))
    assert analysis_cost(path).inflated_bytes == path.stat().st_size


def test_a_gzip_trailer_that_lies_is_refused_not_believed(tmp_path):
    data = bytearray(REAL.read_bytes())
    data[-4:] = (1000).to_bytes(4, "little")  # ISIZE: "inflates to 1000 bytes"
    path = tmp_path / "liar.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="^trace: the gzip data is corrupt"):
        analysis_cost(path)


def test_a_gzip_bomb_is_refused_before_any_memory_is_admitted(tmp_path):
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b"[" + b"{}," * (4 * MiB)))
    with pytest.raises(TraceError, match="^trace: inflates to more than 1 MiB"):
        analysis_cost(path, Limits(inflated_bytes=MiB))


# ---------------------------------------------------------------- the estimate against a real peak


def peak_of(path: Path, *view: str) -> dict[str, int]:
    """PEAK_CHILD's figures for the trace at `path` (and the view named, if one is)."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK_CHILD, str(path), *view],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=slack(300),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_charges_cover_a_real_analysis_and_are_not_loose(tmp_path):
    path = tmp_path / "scaled.json"
    inflated = scaled_trace(48, path)  # ~81 MiB, ~230,000 events
    cost = analysis_cost(path)
    assert cost.inflated_bytes == inflated
    measured = peak_of(path)
    assert measured["events"] > 48 * 4800
    assert measured["read"] <= cost.peak_bytes  # the first charge holds the read
    charged = max(cost.peak_bytes, measured["need"])  # what the share grows to once the trace is read
    assert measured["growth"] <= charged
    # A real trace is charged 1.7x what it uses here (the fixed part is large at this size), where one charge
    # before the read, which had to hold the worst case's events, charged it 2.6x.
    assert charged <= 2 * measured["growth"]


SMALL_EVENTS = {  # the most events per byte the reader accepts, with and without args
    "kernels": b'{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1,"args":{"correlation":1}},',
    "kernels without args": b'{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1,"stream":7777},',
    "ops": b'{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":1,"dur":1,"x":12345},',
}


def every_arg(cat: str, name: str) -> bytes:
    """One event with every args key the reader keeps: no column is left empty, so none costs nothing."""
    event = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": 1, "dur": 1}
    return json.dumps(event | {"args": dict.fromkeys(NUMERIC_ARGS, 1) | {key: [1] for key in OBJECT_ARGS}}).encode()


FIRST = {  # kind -> the event that opens the trace, filling every args column in the frames of its category
    "kernels, every args column filled": every_arg("kernel", "k"),
    "annotations, every args column filled": every_arg("user_annotation", "ProfilerStep#1"),
}
SMALL_EVENTS["kernels, every args column filled"] = SMALL_EVENTS["kernels"]
SMALL_EVENTS["annotations, every args column filled"] = (
    b'{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":0,"tid":7,"ts":1,"dur":1,"args":{}},'
)


@pytest.mark.parametrize("kind", list(SMALL_EVENTS))
def test_the_charges_cover_the_worst_case_of_small_events(kind, tmp_path):
    event = SMALL_EVENTS[kind]
    first = FIRST[kind] + b"," if kind in FIRST else b""
    path = tmp_path / "small.json.gz"
    events = first + event * (16 * MiB // len(event))
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + events + b'{"ph": "M"}]}', 1))
    measured = peak_of(path)
    cost = analysis_cost(path)
    read, growth = measured["read"], measured["growth"]
    assert read <= cost.peak_bytes, f"{read / MiB:.0f} MiB read, {cost.peak_bytes / MiB:.0f} MiB charged first"
    charged = max(cost.peak_bytes, measured["need"])
    assert growth <= charged, f"{growth / MiB:.0f} MiB measured, {charged / MiB:.0f} MiB charged"
    assert growth > 4 * cost.inflated_bytes  # the bytes alone would not have covered it


@pytest.mark.parametrize("view", [None, "ops by call stack", "ops by input shape"])
def test_the_charges_cover_ops_of_distinct_names_analysed_or_viewed(view, tmp_path):
    """Each op of its own name: per distinct name the analysis holds ~100 B more, and grouping ops by call stack
    ~500 B more, an event (a view is charged VIEW_PEAK_PER_ROW an event). At this size the call-stack view
    outgrows what the analysis is charged, so the test fails where a view is charged as the analysis is."""
    EVENTS = 450_000
    path = tmp_path / "names.json.gz"
    ops = (
        b'{"ph":"X","cat":"cpu_op","name":"op%d","pid":1,"tid":1,"ts":%d,"dur":1,"args":{}}' % (i, 2 * i)
        for i in range(EVENTS)
    )
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b",".join(ops) + b"]}", 1))
    per_object = PEAK_PER_OBJECT if view is None else VIEW_PEAK_PER_ROW
    cost = analysis_cost(path, per_object=per_object)
    measured = peak_of(path, *([view] if view else []))
    assert measured["events"] == EVENTS and measured["read"] <= cost.peak_bytes
    charged = max(cost.peak_bytes, measured["need"])
    assert measured["growth"] <= charged, f"{measured['growth'] / MiB:.0f} MiB used, {charged / MiB:.0f} charged"


def test_the_call_stack_view_of_many_long_distinct_stacks_is_within_its_charge(tmp_path):
    """15 nested frames of 4,096-character names around 20,000 ops, each under a frame of its own: 20,000
    distinct stacks of ~61 kB of text each (1.2 GB had every group's text been made; the view makes the
    texts of the 1,000 groups it shows)."""
    ops = 20_000
    outer = [
        {"ph": "X", "cat": "python_function", "name": chr(65 + d) * 4096, "pid": 1, "tid": 1, "ts": d}
        | {"dur": 10 * ops + 1000 - 2 * d}
        for d in range(15)
    ]
    inner = [
        event
        for i in range(ops)
        for event in (
            {"ph": "X", "cat": "python_function", "name": f"f{i}", "pid": 1, "tid": 1, "ts": 100 + 10 * i, "dur": 5},
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 101 + 10 * i, "dur": 1},
        )
    ]
    path = tmp_path / "stacks.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": outer + inner}).encode(), 1))
    cost = analysis_cost(path, per_object=VIEW_PEAK_PER_ROW)
    measured = peak_of(path, "ops by call stack")
    charged = max(cost.peak_bytes, measured["need"])
    assert measured["growth"] <= charged, f"{measured['growth'] / MiB:.0f} MiB used, {charged / MiB:.0f} charged"


def plain_need(path: Path) -> int:
    """`analysis_need_bytes` by a plain loop over the JSON: per event; per distinct text (names, categories and
    phases, lanes as text, and the reader's two marks for a missing text and a missing lane); and per event of
    each category in which some event fills an args key (a number that is no bool, or any non-null object)
    that many values again."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    rows: Counter[str] = Counter()
    filling: dict[str, set[str]] = {}
    texts = {"", "?"}
    for event in events:
        category = event.get("cat") if isinstance(event.get("cat"), str) else ""
        rows[category] += 1
        texts |= {event[key] for key in ("name", "cat", "ph") if isinstance(event.get(key), str)}
        texts |= {str(event[key]) for key in ("pid", "tid") if type(event.get(key)) in (int, float, str)}
        for key, value in (event.get("args") or {}).items():
            number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            if (key in NUMERIC_ARGS and number) or (key in OBJECT_ARGS and value is not None):
                filling.setdefault(key, set()).add(category)
    values = sum(rows.total() + FRAME_COPIES * sum(rows[c] for c in categories) for categories in filling.values())
    return PEAK_BASE_BYTES + rows.total() * PEAK_PER_ROW + len(texts) * PEAK_PER_TEXT + values * BYTES_PER_VALUE


@pytest.mark.parametrize("name", ["h100_bert-small_sdpa-flash", "b200_vllm_gpt-oss_eager_rank0", "h100_nn-mha_fp32"])
def test_the_second_charge_counts_what_a_plain_loop_counts(name):
    path = DATA / "gpu" / f"{name}.json.gz"
    trace = load_trace(path)
    assert trace.skipped == 0  # every event is a row, as the loop counts them
    assert analysis_need_bytes(trace) == plain_need(path)


def test_a_read_asks_for_its_need_only_inside_charged_reads():
    asked = []
    load_trace(REAL)  # the CLI: nobody to ask
    trace = charged_reads(load_trace, PEAK_PER_ROW, REAL, ask=asked.append)
    view_trace = charged_reads(load_trace, VIEW_PEAK_PER_ROW, REAL, ask=asked.append)
    assert asked == [
        (str(REAL), analysis_need_bytes(trace)),
        (str(REAL), analysis_need_bytes(view_trace, VIEW_PEAK_PER_ROW)),
    ]
    assert asked[1][1] - asked[0][1] == (VIEW_PEAK_PER_ROW - PEAK_PER_ROW) * len(trace.events)


def test_a_top_up_holds_each_trace_at_the_larger_of_its_charges():
    budget = MemoryBudget(1000)
    with budget.admit(30, field="before", kind="analysis", wait_s=0) as share:
        top_up = TopUp(share, {"a.json": 10, "b.json": 20})
        assert top_up(("a.json", 15)) == 35  # a needs 5 more than it was charged
        assert top_up(("b.json", 5)) == 35  # b needs less than its charge: it keeps it
        assert top_up(("a.json", 12)) == 35  # a share never shrinks
        assert top_up(("b.json", 40)) == 55
        assert budget.in_use_bytes == 55
    assert budget.in_use_bytes == 0


def test_a_top_up_waits_no_longer_than_the_time_left(monkeypatch):
    monkeypatch.setenv("ATTENTION_PROFILER_ADMISSION_WAIT", "300")
    budget = MemoryBudget(100)
    with (
        budget.admit(60, field="other", kind="run", wait_s=0),
        budget.admit(40, field="trace", kind="analysis", wait_s=0) as share,
    ):
        top_up, started = TopUp(share, {"t.json": 40}, time_left_s=0.2), time.monotonic()
        with pytest.raises(BudgetError, match=r"^trace: the server is busy: .* waited 0\.\d+ s"):
            top_up(("t.json", 50))
        assert time.monotonic() - started < slack(30)  # not the admission's 300 s
        assert share.bytes == 40


class RecordingBudget(MemoryBudget):
    """A real budget that also records each growth of a share (its extra bytes)."""

    def __init__(self, budget_bytes: int) -> None:
        super().__init__(budget_bytes)
        self.grown: list[int] = []

    def _grow(self, share, extra, wait_s, cancelled):
        self.grown.append(extra)
        super()._grow(share, extra, wait_s, cancelled)


@pytest.mark.parametrize("in_process", [False, True], ids=["analysis process", "in process"])
def test_an_upload_grows_its_share_to_what_its_read_events_need(in_process, monkeypatch):
    need = analysis_need_bytes(load_trace(REAL))
    first = analysis_cost(REAL).peak_bytes
    assert need > first  # this real trace's events need more than its JSON was charged
    budget = RecordingBudget(10 * GiB)
    monkeypatch.setattr("profiling.uploads.analysis_gate", lambda: AnalysisGate(budget))
    worker = AnalysisWorker() if not in_process else Worker(enabled=False)
    heard: list[str] = []
    try:
        outputs = analyze_upload(REAL, progress=lambda fraction, message: heard.append(message), worker=worker)
    finally:
        worker.close()
    assert outputs.summary["events"] > 0
    assert "drawing the timeline" in heard  # the analysis's own progress still comes through
    assert budget.grown == [need - first]
    assert budget.in_use_bytes == 0  # all of it given back


def test_an_upload_whose_events_need_more_than_the_server_has_is_refused_naming_the_trace(monkeypatch):
    first = analysis_cost(REAL).peak_bytes
    monkeypatch.setattr("profiling.uploads.analysis_gate", lambda: AnalysisGate(first))  # the first charge only
    with pytest.raises(AdmissionError, match=r"^trace: this analysis needs about .* this server allows"):
        analyze_upload(REAL)


def test_a_diff_grows_its_share_for_each_trace_it_reads(tmp_path):
    after = tmp_path / "after.json.gz"
    after.write_bytes(REAL.read_bytes())
    budget = RecordingBudget(10 * GiB)
    first = analysis_cost(REAL).peak_bytes
    need = analysis_need_bytes(load_trace(REAL))
    diff_uploads(str(REAL), str(after), gate=AnalysisGate(budget))
    assert budget.grown == [need - first, need - first]
    assert budget.in_use_bytes == 0


def test_the_event_count_is_exact_across_any_chunk_cut():
    text = b'{"traceEvents": [ {"ts": 1} ,\n\t{"ts": 2},\r\n  {"args": [{}, {"a": {}}]},{},1,{}]}'
    whole = elements_opened(text)
    assert whole == 7  # five events and the two objects of the args' list; the `args` objects are not
    for cut in range(len(text)):
        head, tail = text[:cut], text[cut:]
        assert elements_opened(head) + elements_opened(tail, head.rstrip(b" \t\n\r")[-1:]) == whole, cut
