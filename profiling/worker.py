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

`with worker.stderr_to(log):` sends what the child writes to stderr during calls to `log` (the CLI's
`profiler.log`): Kineto's and c10's messages, which torch writes from C++ to file descriptor 2.

`ATTENTION_PROFILER_WORKER=0` runs calls in the calling process instead (default on ZeroGPU, whose
`spaces` already forks the handler): then the limit and cancellation are checked at each progress
report only.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable, Generator, Hashable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from profiling.runner import Progress, RunError
from profiling.worker_child import answered, asking, rebuilt, serve, unpickled
from profiling.worker_child import first_call as first_call  # public names stay importable from here
from profiling.worker_process import (
    Clock,
    death_error,
    forkserver_context,
    limit_error,
    main_not_reimported,
    resident_bytes,
)
from profiling.worker_process import death_cause as death_cause  # public names stay importable from here

ENV = "ATTENTION_PROFILER_WORKER"
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


# ---------------------------------------------------------------- whose call it is

# Who is calling (a session id), so that what one caller ran never shows in another's run.
_caller: contextvars.ContextVar[str | None] = contextvars.ContextVar("caller", default=None)


def called_by(caller: str | None, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on behalf of `caller`: worker calls made inside it keep callers apart
    (see `Worker.call`'s `private`). Call it in a thread or context of its own (`closable.until_closed` does)."""
    _caller.set(caller)
    return fn(*args, **kwargs)


# ---------------------------------------------------------------- in the parent


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
        self.stderr_path: str | None = None  # see `stderr_to`
        _workers.add(self)

    @contextlib.contextmanager
    def stderr_to(self, path: str | Path | None) -> Iterator[None]:
        """While open, each call's stderr in the child (file descriptor 2: what torch prints from C++
        too) is appended to `path`. The call's outcome, an exception included, still comes back by
        pipe, so no error is lost. In-process calls (`enabled=False`) leave stderr alone: it is the
        caller's own, with its progress bar and its error messages."""
        saved, self.stderr_path = self.stderr_path, None if path is None else str(path)
        try:
            yield
        finally:
            self.stderr_path = saved

    def limit_error(self, limit_s: float, stage: str) -> Exception:
        """What a call that passed its time limit raises (a subclass words it for its own work)."""
        return limit_error(limit_s, stage)

    def death_error(self, exitcode: int | None, stage: str) -> Exception:
        """What a call whose process died raises."""
        return death_error(exitcode, stage)

    def exited(self) -> bool:
        """Whether the worker's process ended (killed, say) while a call runs: an answer to it may stop waiting."""
        process = self._process
        return process is not None and not process.is_alive()

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
        answer: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """`fn(*args, **kwargs)` in the worker; `fn` also gets `progress=` when `progress` is given, and
        `ask=` when `answer` is: `ask(question)` returns `answer(question)`, run in this process (where the
        shared state is, such as the memory budget), or raises what it raised.

        `fn` must be a module-level function importable by its module's name (not one defined in the
        script run as `__main__`), and its arguments and result picklable. Past
        `time_limit_s` (counted once the worker is ready), or as soon as `cancelled()` is true, the
        child is killed and RunError (Cancelled) is raised. An exception raised by `fn` comes back
        with its type and message; a child that dies gives RunError, and the next call gets a new one.
        `private` (e.g. a spec) is a key no other caller (see `called_by`) may have run in the same
        process: one who did makes the call start a fresh process.
        """
        if not self.enabled:
            return self._here(fn, args, kwargs | asking(answer), time_limit_s, progress, cancelled)
        job = self.iterate(
            fn,
            *args,
            time_limit_s=time_limit_s,
            progress=progress,
            heartbeat_s=POLL_S,
            private=private,
            answer=answer,
            **kwargs,
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
        answer: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> Generator[Any, None, Any]:
        """Like `call`, as a generator: it yields `tick` at least every `heartbeat_s` while `fn` runs
        and returns its value. Closing it early kills the child: `result = yield from worker.iterate(...)`
        in a Gradio generator handler stops the run when the client leaves. Progress goes to `progress`.
        """
        if not self.enabled:
            return self._here(fn, args, kwargs | asking(answer), time_limit_s, progress, None)
        with self._lock:
            self._keep_private(private)
            conn = self._ready()
            request = (fn, args, kwargs, progress is not None, answer is not None, self.stderr_path)
            conn.send_bytes(pickle.dumps(request))
            finished = False
            try:
                kind, *body = yield from self._await(conn, Clock(time_limit_s), progress, tick, heartbeat_s, answer)
                finished = True  # the child answered and waits for the next call
            finally:
                if not finished:  # time limit, cancellation, a dead child, or the caller's own exception
                    self._stop()
            if resident_bytes(self._process.pid) > self.recycle_rss_bytes:
                self._stop()
        if kind == "raised":
            raise rebuilt(*body)
        return body[0]

    def _await(
        self,
        conn: Connection,
        clock: Clock,
        progress: Progress | None,
        tick: Any,
        heartbeat_s: float,
        answer: Callable[[Any], Any] | None = None,
    ) -> Generator[Any, None, tuple[Any, ...]]:
        """Forward the child's progress and answer its questions until its outcome ("done" or "raised")
        arrives, and return that; tick while waiting; enforce the clock."""
        stage = "its first stage"
        next_tick = time.monotonic() + heartbeat_s
        while True:
            timeout = max(0.0, min(clock.remaining_s(), next_tick - time.monotonic()))
            ready = multiprocessing.connection.wait([conn, self._process.sentinel], timeout)
            if ready:
                kind, *body = self._receive(conn if conn in ready else None, stage)
                if kind == "ask":
                    try:
                        conn.send_bytes(answered(answer, body[0]))
                    except OSError:  # the child died while its question was answered
                        self._receive(None, stage)  # raises its death
                elif kind != "progress":
                    return (kind, *body)
                else:
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
                return unpickled(message)
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
            ctx = forkserver_context()
            conn, child_end = ctx.Pipe(duplex=True)
            process = ctx.Process(target=serve, args=(child_end,), name=WORKER_NAME)
            try:
                with main_not_reimported():
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
        clock, stage = Clock(time_limit_s), ["its first stage"]

        def report(fraction: float, message: str) -> None:
            if cancelled is not None and cancelled():
                raise Cancelled("cancelled: the run was stopped because its caller left")
            if clock.remaining_s() <= 0:
                raise self.limit_error(clock.limit_s or 0.0, stage[0])
            stage[0] = message
            progress(fraction, message)

        with self._lock:
            return fn(*args, progress=report, **kwargs)


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
