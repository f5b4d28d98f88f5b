"""A persistent worker process for the measuring part of a run, killed when it passes its time limit.

Why a process: a run spends most of its time inside torch ops that no Python check can interrupt
(the float64 reference, a long forward, compilation), and a client that leaves must free the
device. Only a process can be stopped anywhere. Why persistent: a fresh process pays ~1.5 s to
import torch, so one child serves every call until it is killed or dies, and it is forked from a
forkserver that imported torch once, so a replacement starts in a fraction of that.

    worker = default_worker()
    measured = worker.call(measure, spec, run_dir, time_limit_s=300, progress=report, cancelled=gone)

Inside a Gradio generator handler, `yield from worker.iterate(...)` yields a tick at least every
second, so a client that leaves closes the generator at a tick and the child is killed there.

`ATTENTION_PROFILER_WORKER=0` runs calls in the calling process instead (default on ZeroGPU, whose
`spaces` already forks the handler): then the limit and cancellation are checked at each progress
report only.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import importlib.machinery
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Generator, Hashable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from profiling.runner import Progress, RunError

ENV = "ATTENTION_PROFILER_WORKER"
# Imported once by the forkserver, so every worker forked from it starts with them loaded.
PRELOAD = ("torch", "attention", "profiling.runner", "profiling.worker", "profiling.uploads", "profiling.charts")
POLL_S = 0.05  # how often `call` looks at the clock and at cancelled() while the child works
HEARTBEAT_S = 1.0  # `iterate` yields at least this often, so a generator handler can be closed
TERM_GRACE_S = 0.25  # after SIGTERM, time for the child's `finally` blocks before SIGKILL
WORKER_NAME = "attention-profiler-worker"
# A worker left holding more than this after a call is replaced: freed heap that glibc keeps (the
# runner asks it to keep up to 1 GiB) would otherwise stay resident while idle and shrink the memory
# the next run's preflight sees. Idle, a worker holds ~250 MiB; after a 1x8x4096x64 naive run, 455 MiB.
RECYCLE_RSS_BYTES = 1024**3


class Cancelled(RunError):
    """The caller stopped waiting (the client left); the run was stopped."""


def worker_enabled() -> bool:
    """Whether calls run in a worker process: `ATTENTION_PROFILER_WORKER`, else off on ZeroGPU only."""
    value = os.environ.get(ENV, "").strip().lower()
    if value:
        return value not in ("0", "false", "no", "off")
    return os.environ.get("SPACES_ZERO_GPU", "").lower() not in ("1", "t", "true")


# ---------------------------------------------------------------- in the child (or in-process)

_seen: set[Hashable] = set()
# Who is calling (a session id), so that what one caller ran never shows in another's run.
_caller: contextvars.ContextVar[str | None] = contextvars.ContextVar("caller", default=None)


def called_by(caller: str | None, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on behalf of `caller`: worker calls made inside it keep callers apart
    (see `Worker.call`'s `private`). Call it in a thread or context of its own (`until_closed` does)."""
    _caller.set(caller)
    return fn(*args, **kwargs)


def first_call(key: Hashable) -> bool:
    """True the first time `key` (e.g. an AttentionSpec) is seen in this process, False after.

    A worker process starts with none seen, and a replacement after a kill starts afresh, so the
    runner can time a spec's first call in a process that has not run it yet (its cold start).
    """
    fresh = key not in _seen
    _seen.add(key)
    return fresh


def _serve(conn: Connection) -> None:
    """The child's loop: run each request, answer with progress messages and then one outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the server's terminal is the parent's to handle
    signal.signal(signal.SIGTERM, _exit_on_term)
    lock = threading.Lock()  # fn may report progress from its own threads
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the parent closed the pipe or died: nothing more will come
        answer = _answer(request, functools.partial(_report, conn, lock))
        with lock:
            conn.send_bytes(answer)


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the run's `finally` blocks, then the process exits


def _report(conn: Connection, lock: threading.Lock, fraction: float, message: str) -> None:
    with lock:
        conn.send_bytes(pickle.dumps(("progress", float(fraction), str(message))))


def _answer(request: bytes, report: Progress) -> bytes:
    """Run one pickled request; its value, or its exception's type, args and attributes, pickled."""
    try:
        fn, args, kwargs, wants_progress = pickle.loads(request)
        if wants_progress:
            kwargs = {**kwargs, "progress": report}
        return pickle.dumps(("done", fn(*args, **kwargs)))
    except Exception as exc:  # any failure of the call is the caller's to see, by type and message
        exc.add_note("in the worker process:\n" + "".join(traceback.format_exception(exc)).rstrip())
        return _pickled_exception(exc)


def _pickled_exception(exc: Exception) -> bytes:
    """The exception as (type, args, attributes), rebuilt without calling its __init__ (which may take
    other arguments than its args, as SpecError's does); failing that, as a RunError with its text."""
    for form in ((type(exc), exc.args, vars(exc)), (type(exc), (str(exc),), {})):
        with contextlib.suppress(Exception):  # an unpicklable argument or attribute, or a local class
            return pickle.dumps(("raised", *form))
    return pickle.dumps(("raised", RunError, (f"{type(exc).__name__}: {exc}",), {}))


def _unpickled(message: bytes) -> tuple[Any, ...]:
    try:
        return pickle.loads(message)
    except Exception as exc:  # e.g. a result whose class the parent cannot import
        raise RunError(f"the worker's answer could not be read here ({type(exc).__name__}: {exc})") from None


def _rebuilt(kind: type[BaseException], args: tuple[Any, ...], attributes: dict[str, Any]) -> BaseException:
    exc = kind.__new__(kind, *args)
    exc.args = args
    vars(exc).update(attributes)
    return exc


# ---------------------------------------------------------------- in the parent


def _context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # takes effect when the forkserver starts (once per process)
    return ctx


@contextlib.contextmanager
def _main_not_reimported() -> Iterator[None]:
    """Start children that do not import the parent's `__main__` script again.

    multiprocessing makes every forkserver child run the parent's main script (for `python app.py`,
    all of Gradio: seconds per replacement worker, measured 4 s here); the forkserver's own preload
    of `__main__`, meant to do it once, never does in Python 3.11 (it filters on a key that
    `get_preparation_data` never sets). The worker only runs functions importable by module name,
    so while a child starts, main is described as a module named `__main__`, which the child skips.
    """
    with _STARTING:  # two threads starting children at once would restore each other's stand-in
        main = sys.modules["__main__"]
        saved = getattr(main, "__spec__", None)
        main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
        try:
            yield
        finally:
            main.__spec__ = saved


_STARTING = threading.Lock()


def _limit_error(limit_s: float, stage: str) -> RunError:
    return RunError(f"time limit: the run passed {limit_s:g} s during {stage}; try a smaller shape")


def death_cause(exitcode: int | None) -> str:
    """Why a child with this exit code ended, in words."""
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        why = {
            "SIGKILL": "killed from outside, most often by the kernel's out-of-memory killer",
            "SIGSEGV": "a crash in native code",
        }.get(name, "stopped by a signal")
        return f"{name}: {why}"
    return f"exit status {exitcode}"


def _death_error(exitcode: int | None, stage: str) -> RunError:
    cause = death_cause(exitcode)
    if exitcode == -signal.SIGKILL:
        cause += "; try a smaller shape"
    return RunError(f"the run's worker process died ({cause}) during {stage}; the next run gets a new one")


def _resident_bytes(pid: int) -> int:
    """A process's resident memory, from /proc (0 where there is no /proc)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class _Clock:
    """A call's time limit, counted from the moment the request is sent."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s
        self.started = time.monotonic()

    def remaining_s(self) -> float:
        if self.limit_s is None:
            return float("inf")
        return self.limit_s - (time.monotonic() - self.started)


class Worker:
    """One child process (forkserver context, torch and profiling.runner preloaded), started lazily,
    reused across calls, replaced after a kill or a crash. One call at a time (the others wait)."""

    def __init__(self, enabled: bool | None = None, recycle_rss_bytes: int = RECYCLE_RSS_BYTES) -> None:
        self.enabled = worker_enabled() if enabled is None else enabled
        self.recycle_rss_bytes = recycle_rss_bytes
        # A Lock, not an RLock: a Gradio generator handler is resumed in different threads.
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Connection | None = None
        self._callers: dict[Hashable, str | None] = {}  # private keys run in this process, by caller
        _workers.add(self)

    def limit_error(self, limit_s: float, stage: str) -> Exception:
        """What a call that passed its time limit raises (a subclass words it for its own work)."""
        return _limit_error(limit_s, stage)

    def death_error(self, exitcode: int | None, stage: str) -> Exception:
        """What a call whose process died raises."""
        return _death_error(exitcode, stage)

    @property
    def pid(self) -> int | None:
        """The worker process's id, or None when none is running."""
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the worker now (the first start also starts the forkserver: ~2 s), not at the first call."""
        if self.enabled:
            with self._lock:
                self._ready()

    def close(self) -> None:
        """Stop the worker process, if any; a later call starts a new one."""
        with self._lock:
            self._stop()

    def call(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        time_limit_s: float | None = None,
        progress: Progress | None = None,
        cancelled: Callable[[], bool] | None = None,
        private: Hashable | None = None,
        **kwargs: Any,
    ) -> Any:
        """`fn(*args, **kwargs)` in the worker; `fn` also gets `progress=` when `progress` is given.

        `fn` must be a module-level function importable by its module's name (not one defined in the
        script run as `__main__`), and its arguments and result picklable. Past
        `time_limit_s` (counted once the worker is ready), or as soon as `cancelled()` is true, the
        child is killed and RunError (Cancelled) is raised. An exception raised by `fn` comes back
        with its type and message; a child that dies gives RunError, and the next call gets a new one.
        `private` (e.g. a spec) is a key no other caller (see `called_by`) may have run in the same
        process: one who did makes the call start a fresh process.
        """
        if not self.enabled:
            return self._here(fn, args, kwargs, time_limit_s, progress, cancelled)
        job = self.iterate(
            fn, *args, time_limit_s=time_limit_s, progress=progress, heartbeat_s=POLL_S, private=private, **kwargs
        )
        try:
            while True:
                next(job)
                if cancelled is not None and cancelled():
                    raise Cancelled("cancelled: the run was stopped because its caller left")
        except StopIteration as done:
            return done.value
        finally:
            job.close()  # a no-op once finished; else it kills the child

    def iterate(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        time_limit_s: float | None = None,
        progress: Progress | None = None,
        tick: Any = None,
        heartbeat_s: float = HEARTBEAT_S,
        private: Hashable | None = None,
        **kwargs: Any,
    ) -> Generator[Any, None, Any]:
        """Like `call`, as a generator: it yields `tick` at least every `heartbeat_s` while `fn` runs
        and returns its value. Closing it early kills the child: `result = yield from worker.iterate(...)`
        in a Gradio generator handler stops the run when the client leaves. Progress goes to `progress`.
        """
        if not self.enabled:
            return self._here(fn, args, kwargs, time_limit_s, progress, None)
        with self._lock:
            self._keep_private(private)
            conn = self._ready()
            conn.send_bytes(pickle.dumps((fn, args, kwargs, progress is not None)))
            finished = False
            try:
                kind, *body = yield from self._await(conn, _Clock(time_limit_s), progress, tick, heartbeat_s)
                finished = True  # the child answered and waits for the next call
            finally:
                if not finished:  # time limit, cancellation, a dead child, or the caller's own exception
                    self._stop()
            if _resident_bytes(self._process.pid) > self.recycle_rss_bytes:
                self._stop()
        if kind == "raised":
            raise _rebuilt(*body)
        return body[0]

    def _await(
        self, conn: Connection, clock: _Clock, progress: Progress | None, tick: Any, heartbeat_s: float
    ) -> Generator[Any, None, tuple[Any, ...]]:
        """Forward the child's progress until its outcome ("done" or "raised") arrives, and return that;
        tick while waiting; enforce the clock."""
        stage = "its first stage"
        next_tick = time.monotonic() + heartbeat_s
        while True:
            timeout = max(0.0, min(clock.remaining_s(), next_tick - time.monotonic()))
            ready = multiprocessing.connection.wait([conn, self._process.sentinel], timeout)
            if ready:
                kind, *body = self._receive(conn if conn in ready else None, stage)
                if kind != "progress":
                    return (kind, *body)
                stage = body[1]
                if progress is not None:
                    progress(*body)
            if clock.remaining_s() <= 0:
                raise self.limit_error(clock.limit_s or 0.0, stage)
            if time.monotonic() >= next_tick:
                yield tick
                next_tick = time.monotonic() + heartbeat_s

    def _receive(self, conn: Connection | None, stage: str) -> tuple[Any, ...]:
        """The next message, from `conn` when it has one; else (or at end of file) the child died."""
        if conn is not None:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                message = None  # the pipe closed: the child is gone
            if message is not None:
                return _unpickled(message)
        self._process.join()  # reaps it; the forkserver reports its exit status
        raise self.death_error(self._process.exitcode, stage)

    def _keep_private(self, key: Hashable | None) -> None:
        """Replace the process when another caller already ran `key` in it, so that this caller's first
        call of `key` is truly its first (a cold start it can measure) and tells it nothing of others."""
        if key is None:
            return
        caller = _caller.get()
        if key in self._callers and self._callers[key] != caller:
            self._stop()
        self._callers[key] = caller

    def _ready(self) -> Connection:
        """The live child's pipe, starting a child if there is none or it died while idle."""
        if self._process is not None and not self._process.is_alive():
            self._stop()
        if self._process is None:
            ctx = _context()
            conn, child_end = ctx.Pipe(duplex=True)
            process = ctx.Process(target=_serve, args=(child_end,), name=WORKER_NAME)
            try:
                with _main_not_reimported():
                    process.start()
            finally:
                child_end.close()
            self._process, self._conn = process, conn  # only a started process is ever stopped or joined
        assert self._conn is not None
        return self._conn

    def _stop(self) -> None:
        """SIGTERM, then SIGKILL after TERM_GRACE_S; wait for the exit so no zombie is left."""
        process, conn, self._process, self._conn = self._process, self._conn, None, None
        self._callers.clear()  # a new process has run nothing
        if conn is not None:
            conn.close()
        if process is None:
            return
        if process.is_alive():
            process.terminate()
            process.join(TERM_GRACE_S)
        if process.is_alive():
            process.kill()
        process.join()
        process.close()

    def _here(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        time_limit_s: float | None,
        progress: Progress | None,
        cancelled: Callable[[], bool] | None,
    ) -> Any:
        """In-process: the limit and cancellation are checked at each progress report, as the only
        points where the run comes back to us."""
        if progress is None:
            with self._lock:
                return fn(*args, **kwargs)
        clock, stage = _Clock(time_limit_s), ["its first stage"]

        def report(fraction: float, message: str) -> None:
            if cancelled is not None and cancelled():
                raise Cancelled("cancelled: the run was stopped because its caller left")
            if clock.remaining_s() <= 0:
                raise self.limit_error(clock.limit_s or 0.0, stage[0])
            stage[0] = message
            progress(fraction, message)

        with self._lock:
            return fn(*args, progress=report, **kwargs)


def until_closed(
    fn: Callable[..., Any], /, *args: Any, tick: Any = None, heartbeat_s: float = HEARTBEAT_S, **kwargs: Any
) -> Generator[Any, None, Any]:
    """Run `fn(*args, cancelled=..., **kwargs)` in a thread; yield `tick` at least every `heartbeat_s`
    until it returns, then return its value (or raise its exception).

    For Gradio generator handlers around work that makes several worker calls (compare, sweep):
    `rows = yield from until_closed(compare_all, ..., tick=skips)`. Closing the generator (the
    client left) makes `cancelled()` true, which `Worker.call(cancelled=...)` turns into a killed
    child within POLL_S + TERM_GRACE_S; the close waits that long for `fn` to return, no longer.
    The thread runs in a copy of the caller's context, so gr.Progress still reaches the page.
    """
    stop, done = threading.Event(), threading.Event()
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, fn(*args, cancelled=stop.is_set, **kwargs)))
        except BaseException as exc:  # handed to the generator, which raises it in the caller's thread
            outcome.append((False, exc))
        finally:
            done.set()

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(run,), name="until-closed", daemon=True).start()
    try:
        while not done.wait(heartbeat_s):
            yield tick
    finally:
        stop.set()
        done.wait(POLL_S + TERM_GRACE_S + HEARTBEAT_S)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


_workers: weakref.WeakSet[Worker] = weakref.WeakSet()


@functools.cache
def default_worker() -> Worker:
    """The worker that runs profiling measurements (one per app process)."""
    return Worker()


@atexit.register
def _stop_all() -> None:
    # Registered after multiprocessing's own exit hook (imported above), so it runs first: that
    # hook joins non-daemon children, which would wait forever for an idle worker.
    for worker in list(_workers):
        worker._stop()
