"""Decode batches in a forked helper process while this one inflates and scans: the reader on two cores.

msgspec holds the GIL, so threads cannot share the decode; a process can. One helper is forked
(`os.fork`: no interpreter start, no imports, and it shares the parent's pages) once a read has passed
`START_AFTER_BYTES` of JSON, on a machine with two or more CPUs.

Neither side waits for the other's turn:
- up to IN_FLIGHT batches are out at the helper at once; two threads of the parent move the bytes
  (each in one blocking call without the GIL), and the socket's buffers hold a whole batch or block,
  so the helper starts its next batch as soon as it has sent a block;
- when the helper is IN_FLIGHT batches behind, the parent decodes the next batch itself instead of
  waiting (the two sides' shares follow their speeds);
- blocks come back in the batches' order, an error too (raised when its batch's turn comes).

Bounded and cancellable: the helper reads only from its socket and exits (`os._exit`) when the socket
closes, which happens when the read ends, raises (a cap, a time limit's exception from the progress
callback) or the parent process is killed (the OS closes its end); the parent kills and reaps it on
close. `ATTENTION_PROFILER_READ_HELPER=0` reads on one core.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import queue
import signal
import socket
import struct
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator

from profiling.columns import Block

ENV = "ATTENTION_PROFILER_READ_HELPER"
# Below this much JSON the fork (a few ms for a large parent) is not worth it, and a small trace reads
# exactly as before in one process.
START_AFTER_BYTES = 4 * 1024**2
# Batches out at the helper at once: enough that a slow batch on either side does not stall the other,
# at ~1 MiB of JSON and ~1 MiB of block each. Decoded here, as many again may wait behind the oldest.
IN_FLIGHT = 4
# Each end's send buffer, as far as the system allows (net.core.wmem_max): a block fits whole, so the
# helper never waits for the parent's thread to be given the GIL before it starts the next batch.
BUFFER_BYTES = 4 * 1024**2
_LENGTH = struct.Struct("<Q")  # each message's size, before it
_AT_HELPER = object()  # a pending batch whose block the helper will send

Decode = Callable[[bytes, int], Block]  # a batch's text and its base, to its block


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
    """Batches decoded by `decode`, shared between one forked process and this one, the blocks in order."""

    def __init__(self, decode: Decode) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (ours, theirs):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which leaves by os._exit
            # Only its own socket: an end of another read's helper held here would keep that helper
            # from seeing its parent go.
            keep = theirs.fileno()
            os.closerange(3, keep)
            os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
            _serve(theirs, decode)
        theirs.close()
        self.pid = pid
        self._decode = decode
        self._socket = ours
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._replies: queue.SimpleQueue[bytearray | None] = queue.SimpleQueue()
        self._pending: deque[object] = deque()  # per batch in order: _AT_HELPER, or what `decode` gave here
        self.at_helper = 0
        self._threads = [
            threading.Thread(target=self._send_all, name="trace-reader-send", daemon=True),
            threading.Thread(target=self._receive_all, name="trace-reader-receive", daemon=True),
        ]
        try:
            for thread in self._threads:
                thread.start()
        except BaseException:  # no thread to be had: the helper is not left running unreaped
            self.close()
            raise

    def submit(self, text: bytes, base: int) -> Iterator[Block]:
        """Take one batch, now; the blocks done so far follow, in order and one at a time.

        One at a time, so that what the caller does with a block (a cap's check) is done before a later
        batch's outcome, an error perhaps, is taken: the read fails as a read in one process would.
        """
        if self.at_helper < IN_FLIGHT or not self._replies.empty():
            self._outbox.put(pickle.dumps((text, base), protocol=5))
            self._pending.append(_AT_HELPER)
            self.at_helper += 1
        else:  # the helper is behind: this batch is decoded here, and waits its turn
            self._pending.append(_outcome(self._decode, text, base))
        return self._ready()

    def _ready(self) -> Iterator[Block]:
        while self._pending and (
            self._pending[0] is not _AT_HELPER or not self._replies.empty() or len(self._pending) > 2 * IN_FLIGHT
        ):
            yield self._take()

    def finish(self) -> Iterator[Block]:
        """The blocks of every batch still pending, in order and one at a time."""
        while self._pending:
            yield self._take()

    def _take(self) -> Block:
        """The oldest batch's block; raises its error."""
        outcome = self._pending.popleft()
        if outcome is _AT_HELPER:
            self.at_helper -= 1
            reply = self._replies.get()
            if reply is None:  # the helper is gone; put back for the batches still out at it
                self._replies.put(None)
                raise RuntimeError("the trace reader's decode helper died")
            outcome = pickle.loads(reply)
        if isinstance(outcome, BaseException):
            raise outcome
        assert isinstance(outcome, Block)
        return outcome

    def _send_all(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                _send(self._socket, message)
            except OSError:  # the helper is gone; the receiving thread reports it
                return

    def _receive_all(self) -> None:
        try:
            while True:
                self._replies.put(_receive(self._socket))
        except (OSError, EOFError):
            self._replies.put(None)

    def close(self) -> None:
        """Stop the helper (killed: its end of the socket closes, so both threads leave) and reap it.

        Safe to call twice, and after a failed start: whatever else fails, the threads are joined and the
        socket is closed.
        """
        try:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):  # reaped already
                os.waitpid(self.pid, 0)
        finally:
            self._outbox.put(None)
            try:
                for thread in self._threads:
                    if thread.ident is not None:  # started
                        thread.join()
            finally:
                self._socket.close()


def _outcome(decode: Decode, text: bytes, base: int) -> Block | Exception:
    try:
        return decode(text, base)
    except Exception as exc:  # a batch that is not valid JSON: raised when its turn comes
        return exc


def _send(sock: socket.socket, message: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(message)))
    sock.sendall(message)


def _receive(sock: socket.socket) -> bytearray:
    """One message, read in as few calls as the socket allows (MSG_WAITALL: one, barring a signal)."""
    (size,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    return _exactly(sock, size)


def _exactly(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = sock.recv_into(view[got:], size - got, socket.MSG_WAITALL)
        if n == 0:
            raise EOFError
        got += n
    return buffer


def _serve(sock: socket.socket, decode: Decode) -> None:  # pragma: no cover - in the child
    gc.disable()  # blocks hold no cycles; the parent disabled it too, for the same reason
    code = 0
    try:
        while True:
            try:
                text, base = pickle.loads(_receive(sock))
            except EOFError:
                break
            _send(sock, pickle.dumps(_outcome(decode, text, base), protocol=5))
    except BaseException:  # the parent went away mid-reply: nothing to report to
        code = 1
    finally:
        os._exit(code)
