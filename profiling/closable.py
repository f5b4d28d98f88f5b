"""Work in a thread behind a generator that yields a tick every second: a Gradio generator handler around it
can be closed (the client left) at any tick, and the work is told to stop (profiling/worker.py kills its
child then). For handlers that make several worker calls: compare, sweep."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Generator
from typing import Any

from profiling.worker import HEARTBEAT_S, POLL_S, TERM_GRACE_S


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
