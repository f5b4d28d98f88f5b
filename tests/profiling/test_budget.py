"""The one memory budget that runs and analyses draw from: a job waits for room (first come, first served),
a share grows ahead of newcomers, two shares that wait on each other to grow do not wait forever, and the
budget is sized from this machine."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from attention import AttentionSpec, SpecError
from attention.budget import BudgetError, MemoryBudget, budget_bytes, machine_budget, machine_memory_bytes
from attention.support import admit_run, memory_budget, preflight
from profiling.admission import (
    PEAK_BASE_BYTES,
    PEAK_PER_INFLATED_BYTE,
    PEAK_PER_OBJECT,
    AdmissionError,
    AnalysisGate,
    analysis_gate,
    analysis_peak_bytes,
)
from profiling.reader import MAX_INFLATED_BYTES, TraceError
from tests.timing_slack import slack

MiB = 1024**2

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


def hold_and_grow(
    budget: MemoryBudget,
    held: int,
    to: int,
    log: list[str],
    name: str,
    leave: threading.Event,
    before_growing: threading.Barrier | None = None,
) -> threading.Thread:
    """A job in a thread: admitted with `held`, grows to `to`, logs each step, stays until `leave`."""

    def job() -> None:
        try:
            with budget.admit(held, field=name, kind="analysis", wait_s=slack(10)) as share:
                log.append(f"{name} in")
                if before_growing is not None:
                    before_growing.wait(slack(10))
                share.grow_to(to, wait_s=slack(10))
                log.append(f"{name} grown to {share.bytes}")
                leave.wait(10)
        except BudgetError as exc:
            log.append(str(exc))

    thread = threading.Thread(target=job)
    thread.start()
    return thread


def test_a_share_grows_where_there_is_room_and_gives_all_of_it_back():
    budget = MemoryBudget(100)
    with budget.admit(30, field="trace", kind="analysis", wait_s=0) as share:
        share.grow_to(20, wait_s=0)  # less than held: nothing changes
        assert share.bytes == 30 and budget.in_use_bytes == 30
        share.grow_to(80, wait_s=0)
        assert share.bytes == 80 and budget.in_use_bytes == 80
        with pytest.raises(BudgetError, match=r"^trace: this analysis needs about .* this server allows"):
            share.grow_to(101, wait_s=10)  # never: refused at once
        assert share.bytes == 80
    assert budget.in_use_bytes == 0


def test_a_growing_share_waits_for_a_release_and_goes_before_a_newcomer():
    budget, log, leave = MemoryBudget(100), [], [threading.Event() for _ in range(3)]
    first = hold_and_grow(budget, 60, 60, log, "first", leave[0])
    wait_for(lambda: "first grown to 60" in log)
    grower = hold_and_grow(budget, 30, 70, log, "grower", leave[1])
    wait_for(lambda: "grower in" in log)
    newcomer = hold_and_grow(budget, 40, 40, log, "newcomer", leave[2])
    time.sleep(0.3)
    assert "grower grown to 70" not in log and "newcomer in" not in log and budget.in_use_bytes == 90
    leave[0].set()  # 30 held after this: the newcomer's 40 would fit, but the grower's 40 more comes first
    wait_for(lambda: "grower grown to 70" in log)
    time.sleep(0.2)
    assert "newcomer in" not in log and budget.in_use_bytes == 70
    leave[1].set()
    wait_for(lambda: "newcomer grown to 40" in log)
    leave[2].set()
    for thread in (first, grower, newcomer):
        thread.join()
    assert budget.in_use_bytes == 0


def test_of_two_shares_that_wait_on_each_other_to_grow_one_is_refused_and_the_other_grows():
    budget, log, leave, both_in = MemoryBudget(100), [], threading.Event(), threading.Barrier(2)
    jobs = [hold_and_grow(budget, 50, 70, log, name, leave, before_growing=both_in) for name in ("a", "b")]
    # Each waits for 20 that only the other's release can give: the second to ask gives up at once.
    wait_for(lambda: len(log) == 4)  # both in, one refused, the other grown once the refused one left
    refused = [line for line in log if "every other holder waits to grow too" in line]
    grown = [line for line in log if line.endswith("grown to 70")]
    assert len(refused) == 1 and refused[0].startswith(("a: the server is busy", "b: the server is busy"))
    assert len(grown) == 1 and budget.in_use_bytes == 70
    leave.set()
    for job in jobs:
        job.join()
    assert budget.in_use_bytes == 0


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


def test_a_share_that_waits_behind_one_that_fits_now_is_not_refused():
    """Right after a release, every holder may be waiting to grow while the first of them fits: no deadlock, so
    nobody gives up (the first grows, then the next)."""
    budget, grown, entered = MemoryBudget(100), {}, threading.Event()
    run = budget.admit(50, field="seq_len", kind="run", wait_s=0)
    run.__enter__()
    with budget.admit(20, field="b", kind="analysis", wait_s=0) as b:

        def a() -> None:
            with budget.admit(20, field="a", kind="analysis", wait_s=0) as share:
                entered.set()
                share.grow_to(50, wait_s=slack(5))  # 90 + 30 > 100: waits for the run
                grown["a"] = share.bytes

        thread = threading.Thread(target=a)
        thread.start()
        entered.wait(slack(5))
        wait_for(lambda: budget._growing)
        with budget._changed:  # b asks between the run's release and a's wake-up: a fits then, b after it
            run.__exit__(None, None, None)
            b.grow_to(25, wait_s=slack(5))
        thread.join()
        assert grown == {"a": 50} and b.bytes == 25 and budget.in_use_bytes == 25  # a has left


def test_a_share_given_back_cannot_grow():
    budget = MemoryBudget(100)
    with budget.admit(10, field="trace", kind="analysis", wait_s=0) as share:
        pass
    with pytest.raises(RuntimeError, match="given back"):
        share.grow_to(20, wait_s=0)
    assert budget.in_use_bytes == 0


def test_where_every_holder_waits_to_grow_one_that_fits_goes_first():
    """A waits for 30 more that only B's release can give; B then asks for 10 that fit now: B grows at once (no
    one is refused), and A grows once B has left."""
    budget, log, leave_a, leave_b = MemoryBudget(100), [], threading.Event(), threading.Event()
    a_asks, b_asks = threading.Barrier(2), threading.Barrier(2)
    a = hold_and_grow(budget, 40, 70, log, "a", leave_a, before_growing=a_asks)
    b = hold_and_grow(budget, 40, 50, log, "b", leave_b, before_growing=b_asks)
    wait_for(lambda: {"a in", "b in"} <= set(log))
    a_asks.wait(slack(5))
    wait_for(lambda: budget._growing)  # a waits: 80 + 30 > 100
    b_asks.wait(slack(5))
    wait_for(lambda: "b grown to 50" in log)
    assert not any("busy" in line for line in log) and budget.in_use_bytes == 90
    leave_b.set()
    wait_for(lambda: "a grown to 70" in log)
    leave_a.set()
    a.join(), b.join()
    assert budget.in_use_bytes == 0


def test_the_room_available_leaves_out_the_growth_admitted_jobs_wait_for():
    budget, log, leave = MemoryBudget(100), [], threading.Event()
    with budget.admit(60, field="seq_len", kind="run", wait_s=0):
        grower = hold_and_grow(budget, 10, 45, log, "trace", leave)  # 35 more: waits for the run
        wait_for(lambda: budget._growing)
        assert budget.available_bytes() == 0  # 30 free, all of it promised to the grower's 35
    wait_for(lambda: "trace grown to 45" in log)
    leave.set()
    grower.join()
