"""The worker process's side of `profiling.worker`: its request loop, and the messages both sides exchange.

A request is a pickled `(fn, args, kwargs, wants_progress, wants_ask, stderr_path)`. The child answers with any
number of `("progress", fraction, message)` and `("ask", question)` and then one outcome: `("done", value)` or
`("raised", type, args, attributes)`. The parent answers each question with `("answer", value)` or a
`("raised", ...)` that the child raises where it asked (a call that asks for more memory, say). Everything
here is importable by module name, so the forkserver preloads it and a child starts with it loaded.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Hashable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from profiling.runner import Progress, RunError

LOG_MODE = 0o644

_seen: set[Hashable] = set()


def first_call(key: Hashable) -> bool:
    """True the first time `key` (e.g. an AttentionSpec) is seen in this process, False after.

    A worker process starts with none seen, and a replacement after a kill starts afresh, so the
    runner can time a spec's first call in a process that has not run it yet (its cold start).
    """
    fresh = key not in _seen
    _seen.add(key)
    return fresh


@contextlib.contextmanager
def redirected_stderr(path: str | None) -> Iterator[None]:
    """File descriptor 2 appended to `path` for the block, then restored; None leaves it alone.

    The descriptor, not just `sys.stderr`: Kineto's `USDT …` lines and c10's warnings (the
    CPUAllocator's) are written from C++ straight to fd 2. A log that cannot be opened leaves stderr
    where it was: noise on the terminal is better than a run that fails for its log.
    """
    if path is None:
        yield
        return
    try:
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, LOG_MODE)
    except OSError:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(log, 2)
    os.close(log)
    try:
        yield
    finally:
        sys.stderr.flush()  # what Python buffered belongs in the log, not on the restored terminal
        os.dup2(saved, 2)
        os.close(saved)


def serve(conn: Connection) -> None:
    """The child's loop: run each request, answer with progress messages and then one outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the server's terminal is the parent's to handle
    signal.signal(signal.SIGTERM, _exit_on_term)
    lock = threading.Lock()  # fn may report progress from its own threads
    asking = threading.Lock()  # one question at a time, so each answer reaches its own asker
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the parent closed the pipe or died: nothing more will come
        answer = _answer(request, functools.partial(_report, conn, lock), functools.partial(_ask, conn, lock, asking))
        with lock:
            conn.send_bytes(answer)


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the run's `finally` blocks, then the process exits


def _report(conn: Connection, lock: threading.Lock, fraction: float, message: str) -> None:
    with lock:
        conn.send_bytes(pickle.dumps(("progress", float(fraction), str(message))))


def _ask(conn: Connection, lock: threading.Lock, asking: threading.Lock, question: Any) -> Any:
    """The parent's answer to `question`; its exception is raised here."""
    with asking:
        with lock:
            conn.send_bytes(pickle.dumps(("ask", question)))
        try:
            kind, *body = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            raise SystemExit(1) from None  # the parent is gone: nobody waits for this call any more
    if kind == "raised":
        raise rebuilt(*body)
    return body[0]


def _answer(request: bytes, report: Progress, ask: Callable[[Any], Any]) -> bytes:
    """Run one pickled request; its value, or its exception's type, args and attributes, pickled."""
    try:
        fn, args, kwargs, wants_progress, wants_ask, stderr_path = pickle.loads(request)
        if wants_progress:
            kwargs = {**kwargs, "progress": report}
        if wants_ask:
            kwargs = {**kwargs, "ask": ask}
        with redirected_stderr(stderr_path):
            value = fn(*args, **kwargs)
        return pickle.dumps(("done", value))
    except Exception as exc:  # any failure of the call is the caller's to see, by type and message
        exc.add_note("in the worker process:\n" + "".join(traceback.format_exception(exc)).rstrip())
        return pickled_exception(exc)


def asking(answer: Callable[[Any], Any] | None) -> dict[str, Any]:
    """The `ask=` keyword a call run in the parent's own process gets: the answer itself."""
    return {} if answer is None else {"ask": answer}


def answered(answer: Callable[[Any], Any] | None, question: Any) -> bytes:
    """The parent's reply to a child's question, pickled: ("answer", value), or the exception raised answering it."""
    try:
        if answer is None:
            raise RunError("the worker asked a question, but this call takes none")
        return pickle.dumps(("answer", answer(question)))
    except Exception as exc:  # the asker raises it, where it asked
        return pickled_exception(exc)


def pickled_exception(exc: Exception) -> bytes:
    """The exception as (type, args, attributes), rebuilt without calling its __init__ (which may take
    other arguments than its args, as SpecError's does); failing that, as a RunError with its text."""
    for form in ((type(exc), exc.args, vars(exc)), (type(exc), (str(exc),), {})):
        with contextlib.suppress(Exception):  # an unpicklable argument or attribute, or a local class
            return pickle.dumps(("raised", *form))
    return pickle.dumps(("raised", RunError, (f"{type(exc).__name__}: {exc}",), {}))


def unpickled(message: bytes) -> tuple[Any, ...]:
    """A message from the child, or RunError where this process cannot read it."""
    try:
        return pickle.loads(message)
    except Exception as exc:  # e.g. a result whose class the parent cannot import
        raise RunError(f"the worker's answer could not be read here ({type(exc).__name__}: {exc})") from None


def rebuilt(kind: type[BaseException], args: tuple[Any, ...], attributes: dict[str, Any]) -> BaseException:
    """The child's exception, rebuilt in the parent from `pickled_exception`'s parts."""
    exc = kind.__new__(kind, *args)
    exc.args = args
    vars(exc).update(attributes)
    return exc
