"""Decode batches in a forked helper process while this one inflates and scans: the reader on two cores.

msgspec holds the GIL, so threads cannot share the decode; a process can. One helper is forked
(`os.fork`: no interpreter start, no imports, and it shares the parent's pages) once a read has passed
`START_AFTER_BYTES` of JSON, on a machine with two or more CPUs. The protocol keeps at most one
batch in flight, so neither side ever blocks writing to a pipe the other is not reading: the parent
sends batch i, scans batch i+1 while the helper decodes batch i, then takes block i and sends i+1.
Blocks come back in order.

Bounded and cancellable: the helper reads only from its pipe and exits (`os._exit`) when the pipe
closes, which happens when the read ends, raises (a cap, a time limit's exception from the progress
callback) or the parent process is killed (the OS closes its pipe ends); the parent also kills and
reaps it on close. `ATTENTION_PROFILER_READ_HELPER=0` reads on one core.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from profiling.columns import Block

ENV = "ATTENTION_PROFILER_READ_HELPER"
# Below this much JSON the fork (a few ms for a large parent) is not worth it, and a small trace reads
# exactly as before in one process.
START_AFTER_BYTES = 16 * 1024**2


def helper_wanted() -> bool:
    """Whether a read may fork a decode helper: two or more CPUs, fork available, not turned off."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not hasattr(os, "fork") or sys.platform != "linux":
        return False
    # Fork only a single-threaded process (the CLI, the app's worker): a fork copies the locks other
    # threads hold (a Gradio server's, an allocator's) into a child that could then wait on them forever.
    if threading.active_count() > 1:
        return False
    return len(os.sched_getaffinity(0)) >= 2


class DecodeHelper:
    """One forked process that turns batches into Blocks (`reader.decode_batch`), one at a time, in order."""

    def __init__(self, source: str) -> None:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which leaves by os._exit
            # Only its own two pipe ends: an end of another read's helper held here would keep that
            # helper from seeing its parent go.
            low, high = sorted((to_child, from_child))
            os.closerange(3, low)
            os.closerange(low + 1, high)
            os.closerange(high + 1, os.sysconf("SC_OPEN_MAX"))
            _serve(Connection(to_child, writable=False), Connection(from_child, readable=False), source)
        os.close(to_child)
        os.close(from_child)
        self.pid = pid
        self.send_end = Connection(from_parent, readable=False)
        self.recv_end = Connection(to_parent, writable=False)
        self.pending = False

    def submit(self, text: bytes, base: int) -> Block | None:
        """Send one batch; returns the previous batch's block (None when there was none)."""
        done = self.take() if self.pending else None
        self.send_end.send_bytes(pickle.dumps((text, base), protocol=5))
        self.pending = True
        return done

    def take(self) -> Block | None:
        """The block of the batch in flight, if any; re-raises the helper's error for it."""
        if not self.pending:
            return None
        self.pending = False
        try:
            outcome = pickle.loads(self.recv_end.recv_bytes())
        except EOFError:
            raise RuntimeError("the trace reader's decode helper died") from None
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def close(self) -> None:
        """Stop the helper (its pipe closed, then killed if still there) and reap it."""
        for end in (self.send_end, self.recv_end):
            end.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


def _serve(requests: Connection, replies: Connection, source: str) -> None:  # pragma: no cover - in the child
    from profiling.reader import decode_batch

    gc.disable()  # blocks hold no cycles; the parent disabled it too, for the same reason
    code = 0
    try:
        while True:
            try:
                text, base = pickle.loads(requests.recv_bytes())
            except EOFError:
                break
            outcome: Any
            try:
                outcome = decode_batch(text, base, source)
            except Exception as exc:  # a batch that is not valid JSON: the parent raises it
                outcome = exc
            replies.send_bytes(pickle.dumps(outcome, protocol=5))
    except BaseException:  # the parent went away mid-reply: nothing to report to
        code = 1
    finally:
        os._exit(code)
