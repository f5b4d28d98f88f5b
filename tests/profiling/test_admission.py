"""Memory admission for /analyze: exact JSON counts, a gate that makes the second job wait, and an
estimate checked against the peak RSS of a real analysis measured in a fresh process."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from attention import AttentionSpec, SpecError
from attention.budget import MemoryBudget, budget_bytes, machine_budget, machine_memory_bytes
from attention.support import admit_run, memory_budget, preflight
from profiling.admission import (
    PEAK_BASE_BYTES,
    PEAK_PER_INFLATED_BYTE,
    PEAK_PER_OBJECT,
    AdmissionError,
    AnalysisGate,
    analysis_cost,
    analysis_gate,
    analysis_peak_bytes,
    elements_opened,
)
from profiling.reader import MAX_INFLATED_BYTES, NUMERIC_ARGS, OBJECT_ARGS, Limits, TraceError
from profiling.trace import load_trace
from tests.timing_slack import slack

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
REAL = DATA / "sampled_training_rank0.json.gz"  # a real CUDA training trace, 4,855 events
MiB = 1024**2

# Run in a fresh process: the peak RSS growth (VmHWM, reset after the imports) of what /analyze
# does with one upload: read and analyse it, round the tables, draw the timeline and steps chart.
PEAK_CHILD = """
import json, sys
from profiling.analysis import analyze_file
from profiling.charts import timeline, window_chart
from profiling.tables import rounded

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

before = rss("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # the high-water mark restarts from here
result = analyze_file(sys.argv[1])
rounded(result.op_table), rounded(result.kernel_table), timeline(result), window_chart(result.steps)
print(json.dumps({"growth": rss("VmHWM") - before, "events": len(result.trace.events)}))
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


def test_the_estimate_covers_a_real_analysis_and_is_not_loose(tmp_path):
    path = tmp_path / "scaled.json"
    inflated = scaled_trace(12, path)  # ~20 MiB, ~58,000 events
    assert analysis_cost(path).inflated_bytes == inflated
    done = subprocess.run(
        [sys.executable, "-c", PEAK_CHILD, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=slack(300)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["events"] > 12 * 4800
    estimate = analysis_cost(path).peak_bytes
    assert measured["growth"] <= estimate
    # Loose by design: the fixed part dominates this small a trace, and the charge per `{` (which must
    # cover events without args) counts a real event's args object too.
    assert estimate <= 4 * measured["growth"]


SMALL_EVENTS = {  # the most events per byte the reader accepts, with and without args
    "kernels": b'{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1,"args":{"correlation":1}},',
    "kernels without args": b'{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1,"stream":7777},',
    "ops": b'{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":1,"dur":1,"x":12345},',
}


# One event with every args key the reader keeps: no column is left empty, so none costs nothing.
EVERY_ARG = json.dumps(
    {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1}
    | {"args": dict.fromkeys(NUMERIC_ARGS, 1) | {key: [1] for key in OBJECT_ARGS}}
).encode()
SMALL_EVENTS["kernels, every args column filled"] = SMALL_EVENTS["kernels"]


@pytest.mark.parametrize("kind", list(SMALL_EVENTS))
def test_the_estimate_covers_the_worst_case_of_small_events(kind, tmp_path):
    event = SMALL_EVENTS[kind]
    first = EVERY_ARG + b"," if "every args column" in kind else b""
    path = tmp_path / "small.json.gz"
    events = first + event * (16 * MiB // len(event))
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + events + b'{"ph": "M"}]}', 1))
    done = subprocess.run(
        [sys.executable, "-c", PEAK_CHILD, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=slack(300)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    growth = json.loads(done.stdout.strip().splitlines()[-1])["growth"]
    cost = analysis_cost(path)
    assert growth <= cost.peak_bytes, f"{growth / MiB:.0f} MiB measured, {cost.peak_bytes / MiB:.0f} MiB charged"
    assert growth > 4 * cost.inflated_bytes  # the bytes alone would not have covered it


# ---------------------------------------------------------------- the gate


def admit_in_thread(
    gate: AnalysisGate, need: int, log: list[str], name: str, hold: threading.Event, **kw
) -> threading.Thread:
    def job() -> None:
        try:
            with gate.admit(need, **kw):
                log.append(f"{name} in")
                hold.wait(10)
            log.append(f"{name} out")
        except AdmissionError as exc:
            log.append(f"{name}: {exc}")

    thread = threading.Thread(target=job)
    thread.start()
    return thread


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + slack(timeout)
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_second_job_waits_until_the_first_leaves():
    gate, log, first_done, second_done = AnalysisGate(MemoryBudget(100)), [], threading.Event(), threading.Event()
    first = admit_in_thread(gate, 60, log, "first", first_done)
    wait_for(lambda: log == ["first in"])
    second = admit_in_thread(gate, 60, log, "second", second_done)
    time.sleep(0.3)
    assert log == ["first in"] and gate.in_use_bytes == 60  # 60 + 60 > 100: the second waits
    first_done.set()
    wait_for(lambda: "second in" in log)
    assert log == ["first in", "first out", "second in"] and gate.in_use_bytes == 60
    second_done.set()
    first.join(), second.join()
    assert gate.in_use_bytes == 0


def test_jobs_that_fit_together_run_together():
    gate, log, done = AnalysisGate(MemoryBudget(100)), [], threading.Event()
    threads = [admit_in_thread(gate, 50, log, name, done) for name in ("a", "b")]
    wait_for(lambda: sorted(log) == ["a in", "b in"])
    assert gate.in_use_bytes == 100
    done.set()
    [t.join() for t in threads]


def test_first_come_first_served_a_big_job_is_not_overtaken():
    gate, log = AnalysisGate(MemoryBudget(100)), []
    holds = {name: threading.Event() for name in ("small", "big", "late")}
    threads = [admit_in_thread(gate, 40, log, "small", holds["small"])]
    wait_for(lambda: log == ["small in"])
    threads.append(admit_in_thread(gate, 90, log, "big", holds["big"]))
    time.sleep(slack(0.1))  # big queues first (a loaded machine may take longer to start its thread)
    threads.append(admit_in_thread(gate, 10, log, "late", holds["late"]))  # would fit now, but big came first
    time.sleep(0.3)
    assert log == ["small in"]
    holds["small"].set()
    wait_for(lambda: "big in" in log)
    holds["big"].set()
    wait_for(lambda: "late in" in log)
    holds["late"].set()
    [t.join() for t in threads]
    assert log.index("big in") < log.index("late in")


def test_a_job_that_can_never_fit_is_refused_at_once_with_the_numbers():
    gate = AnalysisGate(MemoryBudget(2 * 1024**3))
    start = time.monotonic()
    with pytest.raises(AdmissionError) as caught, gate.admit(3 * 1024**3, what="5.0 GiB of JSON"):
        pass
    assert time.monotonic() - start < slack(0.1)
    fits = (2 * 1024**3 - PEAK_BASE_BYTES) / PEAK_PER_INFLATED_BYTE
    fits_text = f"{fits / 1024**3:.1f} GiB" if fits >= 1024**3 else f"{fits / 1024**2:.0f} MiB"
    assert str(caught.value) == (
        "trace: analysing 5.0 GiB of JSON needs about 3.0 GiB of memory; this server allows 2.0 GiB for runs and "
        "analyses together, "
        f"which fits up to {fits_text} of JSON "
        f"or {(2 * 1024**3 - PEAK_BASE_BYTES) // PEAK_PER_OBJECT:,} objects"
    )
    assert isinstance(caught.value, TraceError)  # the app already shows TraceError as a clear message


def test_a_busy_server_refuses_after_the_wait_with_the_numbers():
    gate, log, done = AnalysisGate(MemoryBudget(100 * MiB)), [], threading.Event()
    holder = admit_in_thread(gate, 80 * MiB, log, "holder", done)
    wait_for(lambda: log == ["holder in"])
    start = time.monotonic()
    with pytest.raises(AdmissionError) as caught, gate.admit(30 * MiB, wait_s=0.3):
        pass
    assert 0.3 <= time.monotonic() - start < 0.3 + slack(0.7)
    assert str(caught.value) == (
        "trace: the server is busy: runs hold 0 MiB and analyses 80 MiB of 100 MiB and this analysis needs 30 MiB; "
        "waited 0.3 s, try again in a few minutes"
    )
    done.set()
    holder.join()
    assert gate.in_use_bytes == 0  # the refused job took nothing


def test_a_waiting_job_can_be_cancelled():
    gate, log, done = AnalysisGate(MemoryBudget(100)), [], threading.Event()
    holder = admit_in_thread(gate, 100, log, "holder", done)
    wait_for(lambda: log == ["holder in"])
    asked = time.monotonic() + 0.2
    with (
        pytest.raises(AdmissionError, match="^trace: cancelled while waiting for memory$"),
        gate.admit(1, cancelled=lambda: time.monotonic() > asked),
    ):
        pass
    done.set()
    holder.join()


def test_an_error_inside_the_block_gives_the_memory_back():
    gate = AnalysisGate(MemoryBudget(100))
    with pytest.raises(ValueError), gate.admit(70):
        raise ValueError("the analysis failed")
    assert gate.in_use_bytes == 0


# ---------------------------------------------------------------- the budget on this machine


def test_machine_memory_is_at_most_the_physical_memory():
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert 0 < machine_memory_bytes() <= total


def test_budget_from_the_environment(monkeypatch):
    monkeypatch.setenv("ATTENTION_PROFILER_MEMORY", str(3 * 1024**3))
    assert budget_bytes() == 3 * 1024**3
    monkeypatch.setenv("ATTENTION_PROFILER_MEMORY", "lots")
    with pytest.raises(ValueError, match="^ATTENTION_PROFILER_MEMORY: give a positive whole number"):
        budget_bytes()


def test_two_of_the_largest_accepted_traces_run_at_once_only_where_both_charges_fit(monkeypatch):
    """With this machine's real budget: one at a time, both where their measured charges fit together
    (issue 21 made the charge follow the measured peak), or refused with the numbers."""
    monkeypatch.delenv("ATTENTION_PROFILER_MEMORY", raising=False)
    gate, need = AnalysisGate(MemoryBudget(budget_bytes())), analysis_peak_bytes(MAX_INFLATED_BYTES)
    if need > gate.budget_bytes:
        with pytest.raises(AdmissionError, match="^trace: analysing it needs about"), gate.admit(need):
            pass
        return
    if 2 * need <= gate.budget_bytes:
        with gate.admit(need), gate.admit(need, wait_s=0.1):
            assert gate.in_use_bytes == 2 * need
        return
    with (
        gate.admit(need),
        pytest.raises(AdmissionError, match="^trace: the server is busy"),
        gate.admit(need, wait_s=0.1),
    ):
        pass


# ---------------------------------------------------------------- runs and analyses share one budget

CPU_RUN = AttentionSpec(variant="naive", batch=2, heads=8, seq_len=2048, head_dim=64, device="cpu")  # ~0.6 GiB


def test_analyses_and_runs_draw_from_the_one_machine_budget():
    assert analysis_gate().budget is machine_budget()


def test_a_run_is_refused_while_an_analysis_holds_most_of_the_budget():
    budget, need = machine_budget(), CPU_RUN.estimated_bytes()
    assert preflight(CPU_RUN) is CPU_RUN  # alone, it fits
    with analysis_gate().admit(budget.available_bytes() - need // 2, wait_s=0):
        with pytest.raises(SpecError) as caught:
            preflight(CPU_RUN)
        assert caught.value.field == "seq_len"
        assert str(caught.value).startswith("seq_len: this run needs about ")
        assert "more than is left now: runs hold 0 MiB and analyses " in str(caught.value)
        with pytest.raises(SpecError, match="^seq_len: "), admit_run(CPU_RUN):
            pass
        assert memory_budget("cpu") < need  # a sweep stops where the guard would refuse
    with admit_run(CPU_RUN):  # the analysis gave its share back
        pass
    assert budget.in_use_bytes == 0


def test_an_analysis_waits_while_a_run_holds_the_budget():
    budget, need = machine_budget(), CPU_RUN.estimated_bytes()
    with admit_run(CPU_RUN):
        assert budget.in_use_bytes == need
        too_much = budget.budget_bytes - need // 2  # fits alone, not beside the run
        start = time.monotonic()
        with pytest.raises(AdmissionError) as caught, analysis_gate().admit(too_much, wait_s=0.3):
            pass
        assert time.monotonic() - start >= 0.3
        assert str(caught.value).startswith("trace: the server is busy: runs hold ")
    with analysis_gate().admit(too_much, wait_s=0):  # the run ended: now it fits
        assert budget.in_use_bytes == too_much
    assert budget.in_use_bytes == 0


def test_a_run_does_not_count_against_itself_when_measured_in_this_process():
    """`runner.measure` calls preflight inside the run's own hold when the worker is off."""
    budget, need = machine_budget(), CPU_RUN.estimated_bytes()
    with analysis_gate().admit(budget.available_bytes() - need * 3 // 2, wait_s=0), admit_run(CPU_RUN):
        assert budget.available_bytes() < need  # what is left beside the run's own hold
        assert preflight(CPU_RUN) is CPU_RUN
        with pytest.raises(SpecError, match="^seq_len: "):  # a second run of it does not fit
            preflight(CPU_RUN.replace(batch=4))


def test_a_cuda_run_holds_no_host_budget():
    spec = CPU_RUN.replace(device="cuda")
    if not torch.cuda.is_available():
        with pytest.raises(SpecError, match="^device: "), admit_run(spec):
            pass
        return
    with admit_run(spec):
        assert machine_budget().in_use_bytes == 0


@pytest.fixture
def small_budget(monkeypatch):
    """The machine budget as `ATTENTION_PROFILER_MEMORY=256 MiB` makes it, read afresh, and restored after."""
    monkeypatch.setenv("ATTENTION_PROFILER_MEMORY", str(256 * MiB))
    machine_budget.cache_clear(), analysis_gate.cache_clear()
    yield machine_budget()
    monkeypatch.undo()
    machine_budget.cache_clear(), analysis_gate.cache_clear()


def test_a_run_or_analysis_larger_than_the_whole_budget_is_refused_at_once(small_budget):
    assert CPU_RUN.estimated_bytes() > 256 * MiB  # and well within what is free
    with pytest.raises(SpecError) as caught:
        preflight(CPU_RUN)
    assert str(caught.value).startswith("seq_len: this run needs about ")
    assert "but this server allows 256.0 MiB for runs and analyses together; lower seq_len" in str(caught.value)
    assert analysis_gate().budget is small_budget
    with (
        pytest.raises(AdmissionError, match="^trace: analysing it needs about 300 MiB of memory; this server allows"),
        analysis_gate().admit(300 * MiB, wait_s=0),
    ):
        pass


def test_the_event_count_is_exact_across_any_chunk_cut():
    text = b'{"traceEvents": [ {"ts": 1} ,\n\t{"ts": 2},\r\n  {"args": [{}, {"a": {}}]},{},1,{}]}'
    whole = elements_opened(text)
    assert whole == 7  # five events and the two objects of the args' list; the `args` objects are not
    for cut in range(len(text)):
        head, tail = text[:cut], text[cut:]
        assert elements_opened(head) + elements_opened(tail, head.rstrip(b" \t\n\r")[-1:]) == whole, cut
