"""The worker process, for real: real children, real signals, real torch runs; no mocks.

The functions the child runs are defined here, at module level, so the child imports them by name.
"""

from __future__ import annotations

import contextvars
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from multiprocessing import forkserver
from pathlib import Path

import pytest

from attention import AttentionSpec, SpecError
from profiling.closable import until_closed
from profiling.runner import RunError, measure
from profiling.trace import TraceError, load_trace
from profiling.worker import (
    TERM_GRACE_S,
    Cancelled,
    Worker,
    default_worker,
    first_call,
    worker_enabled,
)
from tests.timing_slack import slack

ROOT = Path(__file__).resolve().parents[2]
REQUEST = contextvars.ContextVar("REQUEST", default=None)  # stands for Gradio's per-request context
# How late past its limit a call may return: TERM_GRACE_S for a child that ignores SIGTERM, plus
# room for a 2-core machine shared with other jobs (measured: 0.26 s past the limit when idle), widened
# by TIMING_SLACK on a slower or busier machine.
KILL_MARGIN_S = slack(TERM_GRACE_S + 0.75)
TINY = dict(variant="sdpa", backend="flash", device="cpu", batch=1, heads=1, seq_len=32, head_dim=8)


# ---------------------------------------------------------------- run in the child


def pid() -> int:
    return os.getpid()


_kept: list[bytearray] = []


def hold_memory(n_bytes: int) -> int:
    """Allocates and keeps `n_bytes` (touched, so resident) until the process ends."""
    _kept.append(bytearray(b"x" * n_bytes))
    return os.getpid()


def stubborn_sleep(seconds: float, progress=None) -> None:
    """Ignores SIGTERM and SIGINT, as a thread stuck in a long native op effectively does."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if progress is not None:
        progress(0.5, "sleeping stubbornly")
    time.sleep(seconds)


def sleep_in_temp_dir(seconds: float, marker: str) -> None:
    """Holds a temporary directory while sleeping; SIGTERM must unwind through its cleanup."""
    with tempfile.TemporaryDirectory() as scratch:
        Path(marker).write_text(scratch)
        time.sleep(seconds)


def report_steps(n: int, progress) -> list[str]:
    sent = [f"step {i}" for i in range(n)]
    for i, message in enumerate(sent):
        progress(i / n, message)
    return sent


def report_while_sleeping(steps: int, seconds: float, progress) -> None:
    for i in range(steps):
        progress(i / steps, f"nap {i}")
        time.sleep(seconds)


def segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def exit_status(code: int) -> None:
    os._exit(code)


class TwoArgError(Exception):
    """Its constructor takes other arguments than its args, so plain pickling cannot rebuild it."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field


def raise_two_arg_error() -> None:
    raise TwoArgError("trace", "bad")


def raise_local_error() -> None:
    class Local(Exception):
        pass

    raise Local("defined inside a function")


def seen(key: str) -> bool:
    return first_call(key)


def ask_each(questions: list[int], ask, progress=None) -> list[str]:
    """Ask each question in turn (reporting progress between), keeping the answers and the errors raised here."""
    heard = []
    for i, question in enumerate(questions):
        if progress is not None:
            progress(i / len(questions), f"asking {question}")
        try:
            heard.append(f"{os.getpid()}: {ask(question)}")
        except ValueError as exc:
            heard.append(f"{os.getpid()}: {type(exc).__name__} {exc}")
    return heard


# ---------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def worker():
    w = Worker(enabled=True)
    w.start()
    yield w
    w.close()


def children_states(parent: int) -> dict[int, str]:
    """{pid: state letter} of `parent`'s child processes, from /proc."""
    states = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # exited while we looked
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == parent:
                states[int(entry.name)] = state
    return states


def assert_gone(old: int) -> None:
    """`old` is neither running nor a zombie, and no child of ours or of the forkserver is a zombie."""
    assert not Path(f"/proc/{old}").exists()
    for parent in (os.getpid(), forkserver._forkserver._forkserver_pid):
        zombies = [p for p, state in children_states(parent).items() if state == "Z"]
        assert zombies == [], f"zombie children of {parent}: {zombies}"


def timed(fn, *args, **kwargs) -> tuple[BaseException, float]:
    start = time.monotonic()
    with pytest.raises(Exception) as caught:
        fn(*args, **kwargs)
    return caught.value, time.monotonic() - start


# ---------------------------------------------------------------- tests


def test_calls_reuse_one_process(worker):
    first = worker.call(pid)
    assert first != os.getpid()
    assert worker.call(pid) == first == worker.pid
    assert worker.call(divmod, 7, 2) == (3, 1)


def test_time_limit_kills_a_child_that_ignores_sigterm(worker):
    old = worker.pid
    error, elapsed = timed(worker.call, stubborn_sleep, 30, time_limit_s=0.5, progress=lambda f, m: None)
    assert isinstance(error, RunError)
    assert str(error) == "time limit: the run passed 0.5 s during sleeping stubbornly; try a smaller shape"
    assert 0.5 <= elapsed < 0.5 + KILL_MARGIN_S
    assert_gone(old)
    assert worker.call(pid) == worker.pid != old  # the replacement serves the next call


def test_sigterm_unwinds_the_run_so_temporary_files_are_removed(worker, tmp_path):
    marker = tmp_path / "scratch"
    error, elapsed = timed(worker.call, sleep_in_temp_dir, 30, str(marker), time_limit_s=0.5)
    assert isinstance(error, RunError) and "during its first stage" in str(error)
    assert elapsed < 0.5 + KILL_MARGIN_S
    assert not Path(marker.read_text()).exists()  # TemporaryDirectory's cleanup ran in the child


@pytest.mark.parametrize(
    ("crash", "args", "cause"),
    [(segfault, (), "SIGSEGV: a crash in native code"), (exit_status, (3,), "exit status 3")],
)
def test_a_dead_child_gives_a_clear_error_and_the_next_call_works(worker, crash, args, cause):
    old = worker.call(pid)
    with pytest.raises(RunError) as caught:
        worker.call(crash, *args)
    assert (
        str(caught.value)
        == f"the run's worker process died ({cause}) during its first stage; the next run gets a new one"
    )
    assert_gone(old)
    assert worker.call(pid) not in (old, None)


def test_killed_from_outside_names_the_likely_cause(worker):
    victim = worker.call(pid)
    with pytest.raises(RunError, match=r"died \(SIGKILL: killed from outside, most often by the kernel's out-of-"):
        worker.call(os.kill, victim, signal.SIGKILL)
    assert_gone(victim)


def test_exceptions_keep_their_type_message_and_fields(worker, tmp_path):
    before = worker.call(pid)
    with pytest.raises(SpecError, match="^device: cuda was asked for") as caught:
        worker.call(measure, AttentionSpec(**{**TINY, "device": "cuda"}), tmp_path)  # no CUDA here: preflight
    assert caught.value.field == "device"
    (tmp_path / "bad.json").write_text('{"traceEvents": [')
    with pytest.raises(TraceError, match="^trace: "):
        worker.call(load_trace, tmp_path / "bad.json")
    with pytest.raises(TwoArgError) as two:
        worker.call(raise_two_arg_error)
    assert str(two.value) == "trace: bad" and two.value.field == "trace"
    assert "in the worker process" in "\n".join(two.value.__notes__)  # the child's traceback, for the log
    with pytest.raises(RunError) as local:
        worker.call(raise_local_error)
    assert str(local.value) == "Local: defined inside a function"
    assert worker.call(pid) == before  # an exception does not cost the process


def answer_in_parent(question: int) -> str:
    """Answered in this process: its pid shows where; an odd question raises."""
    if question % 2:
        raise ValueError(f"{question} is odd")
    return f"{question} answered in {os.getpid()}"


@pytest.mark.parametrize("enabled", [True, False], ids=["worker", "in process"])
def test_a_call_asks_this_process_and_hears_each_answer_or_error_where_it_asked(enabled):
    worker, heard = Worker(enabled=enabled), []
    try:
        answers = worker.call(ask_each, [2, 3, 4], answer=answer_in_parent, progress=lambda f, m: heard.append(m))
        child = worker.pid if enabled else os.getpid()
    finally:
        worker.close()
    me = os.getpid()
    assert answers == [
        f"{child}: 2 answered in {me}",
        f"{child}: ValueError 3 is odd",
        f"{child}: 4 answered in {me}",
    ]
    assert heard == ["asking 2", "asking 3", "asking 4"]  # progress still flows between questions


def test_a_child_that_dies_while_its_question_is_answered_reports_its_death():
    worker = Worker(enabled=True)

    def answer(question: int) -> str:
        os.kill(worker.pid, signal.SIGKILL)  # as the OOM killer would, while the child waits for memory
        while not worker.exited():
            time.sleep(0.01)
        return "too late"

    try:
        with pytest.raises(RunError, match="died"):
            worker.call(ask_each, [2], answer=answer)
    finally:
        worker.close()


def test_the_app_has_one_measuring_worker():
    """Every run of the app goes through one worker, one run at a time (its lock), one warm process."""
    assert default_worker() is default_worker()


def test_progress_arrives_in_order(worker):
    heard = []
    sent = worker.call(report_steps, 200, progress=lambda f, m: heard.append((f, m)))
    assert heard == [(i / 200, message) for i, message in enumerate(sent)]


def test_a_real_run_reports_the_same_stages_as_in_process(worker, tmp_path):
    spec = AttentionSpec(**TINY)
    here, there = [], []
    measure(spec, tmp_path, lambda f, m: here.append((f, m)))
    measured = worker.call(measure, spec, tmp_path, progress=lambda f, m: there.append((f, m)))
    assert there == here
    assert measured.spec == spec and measured.trace_path.is_file() and measured.max_abs_error < 1e-5


def test_a_real_run_is_stopped_in_whatever_stage_passes_the_limit(worker, tmp_path):
    """The runner's own checks fall between forwards; the worker's limit holds inside any stage."""
    spec = AttentionSpec(variant="naive", device="cpu", batch=1, heads=8, seq_len=4096, head_dim=64)
    old = worker.pid
    error, elapsed = timed(worker.call, measure, spec, tmp_path, time_limit_s=1.0, progress=lambda f, m: None)
    assert re.fullmatch(r"time limit: the run passed 1 s during .+; try a smaller shape", str(error))
    assert elapsed < 1.0 + KILL_MARGIN_S
    assert_gone(old)


def test_cancellation_stops_the_child(worker):
    old = worker.call(pid)
    asked = time.monotonic() + 0.3
    error, elapsed = timed(worker.call, stubborn_sleep, 30, cancelled=lambda: time.monotonic() > asked)
    assert isinstance(error, Cancelled) and isinstance(error, RunError)
    assert elapsed < 0.3 + KILL_MARGIN_S
    assert_gone(old)


def test_closing_iterate_stops_the_child_as_a_gradio_generator_would(worker):
    old = worker.call(pid)
    job = worker.iterate(stubborn_sleep, 30, tick="tick", heartbeat_s=0.05)
    assert [next(job), next(job)] == ["tick", "tick"]
    start = time.monotonic()
    job.close()  # what Gradio does to a generator handler whose client left
    assert time.monotonic() - start < KILL_MARGIN_S
    assert_gone(old)


def test_iterate_returns_the_value_through_yield_from(worker):
    def handler():
        value = yield from worker.iterate(report_while_sleeping, 3, 0.1, progress=print, tick="tick", heartbeat_s=0.05)
        yield ("done", value)

    items = list(handler())
    assert items[-1] == ("done", None) and items.count("tick") >= 3


def test_first_call_is_per_process(worker):
    assert worker.call(seen, "spec A") is True
    assert worker.call(seen, "spec A") is False
    assert worker.call(seen, "spec B") is True
    worker.close()  # a replacement process has run nothing yet
    assert worker.call(seen, "spec A") is True


def test_warm_call_overhead_is_small(worker):
    worker.call(pid)
    times = []
    for _ in range(50):
        start = time.perf_counter()
        worker.call(pid)
        times.append(time.perf_counter() - start)
    assert sorted(times)[len(times) // 2] < slack(0.005)  # measured: ~0.1 ms a round trip


def test_in_process_mode_checks_the_limit_and_cancellation_at_progress_reports():
    here = Worker(enabled=False)
    assert here.call(pid) == os.getpid()
    error, elapsed = timed(here.call, report_while_sleeping, 20, 0.1, time_limit_s=0.25, progress=lambda f, m: None)
    assert str(error) == "time limit: the run passed 0.25 s during nap 2; try a smaller shape"
    assert elapsed < 0.25 + 0.1 + KILL_MARGIN_S  # late by at most one step between reports
    asked = time.monotonic() + 0.15
    with pytest.raises(Cancelled):
        here.call(report_while_sleeping, 20, 0.1, cancelled=lambda: time.monotonic() > asked, progress=print)
    assert list(here.iterate(divmod, 7, 2)) == []  # no ticks in-process: it runs to the end, then returns


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        ({}, True),
        ({"ATTENTION_PROFILER_WORKER": "0"}, False),
        ({"SPACES_ZERO_GPU": "true"}, False),
        ({"SPACES_ZERO_GPU": "true", "ATTENTION_PROFILER_WORKER": "1"}, True),
    ],
)
def test_the_environment_switches_the_worker(monkeypatch, env, enabled):
    for name in ("ATTENTION_PROFILER_WORKER", "SPACES_ZERO_GPU"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert worker_enabled() is enabled


def test_a_script_is_not_imported_again_and_its_worker_dies_with_it(tmp_path):
    """`python app.py`: the worker does not run the app's script (all of Gradio) again, and exits with it."""
    script, log = tmp_path / "app_like.py", tmp_path / "imports.log"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            sys.path.insert(0, {str(ROOT)!r})
            with open({str(log)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            from profiling.worker import default_worker
            if __name__ == "__main__":
                print(default_worker().call(os.getpid), flush=True)
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=slack(120), check=True)
    child = int(done.stdout.strip())
    imported_in = log.read_text().split()
    assert len(imported_in) == 1 and str(child) not in imported_in  # the script's own process only
    deadline = time.monotonic() + slack(5)
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the forkserver reaps it once it has exited
    assert not Path(f"/proc/{child}").exists()


def test_until_closed_stops_work_that_makes_worker_calls(worker):
    """What a generator handler around /compare or /sweep does; Gradio closes it when the client leaves."""
    old = worker.call(pid)

    def several_runs(seconds: float, cancelled) -> None:
        worker.call(stubborn_sleep, seconds, cancelled=cancelled)

    job = until_closed(several_runs, 30, tick="tick", heartbeat_s=0.05)
    assert [next(job), next(job)] == ["tick", "tick"]
    start = time.monotonic()
    job.close()
    assert time.monotonic() - start < KILL_MARGIN_S
    assert_gone(old)
    assert worker.call(pid) not in (old, None)


def test_until_closed_returns_raises_and_keeps_the_callers_context(worker):
    def looks_up(cancelled) -> tuple:
        return REQUEST.get(), cancelled(), worker.call(divmod, 7, 2, cancelled=cancelled)

    def handler(fn):
        value = yield from until_closed(fn, tick="tick", heartbeat_s=0.01)
        yield ("done", value)

    REQUEST.set("request 1")
    assert list(handler(looks_up))[-1] == ("done", ("request 1", False, (3, 1)))
    with pytest.raises(TwoArgError):
        list(handler(lambda cancelled: worker.call(raise_two_arg_error, cancelled=cancelled)))


def test_a_worker_left_holding_much_memory_is_replaced():
    w = Worker(enabled=True, recycle_rss_bytes=1024**3)
    try:
        small = w.call(hold_memory, 10 * 1024**2)
        assert w.call(pid) == small  # under the threshold: kept
        big = w.call(hold_memory, 1200 * 1024**2)
        assert big == small and w.pid is None  # answered, then replaced
        assert w.call(pid) != big
    finally:
        w.close()
