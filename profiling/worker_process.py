"""Starting, timing and diagnosing the worker's child process (see `profiling.worker`)."""

from __future__ import annotations

import contextlib
import importlib.machinery
import multiprocessing
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from profiling.runner import RunError

# Imported once by the forkserver, so every worker forked from it starts with them loaded.
PRELOAD = (
    *("torch", "attention", "profiling.runner", "profiling.worker", "profiling.worker_child"),
    *("profiling.uploads", "profiling.charts"),
    "profiling.native_preload",  # numba (0.8 s to load): every upload reads by the compiled route at no load cost
)


def forkserver_context() -> Any:
    """multiprocessing's forkserver context, its server told to import PRELOAD once."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # takes effect when the forkserver starts (once per process)
    return ctx


STARTING = threading.Lock()  # held while a child starts: see main_not_reimported


@contextlib.contextmanager
def main_not_reimported() -> Iterator[None]:
    """Start children that do not import the parent's `__main__` script again.

    multiprocessing makes every forkserver child run the parent's main script (for `python app.py`,
    all of Gradio: seconds per replacement worker, measured 4 s here); the forkserver's own preload
    of `__main__`, meant to do it once, never does in Python 3.11 (it filters on a key that
    `get_preparation_data` never sets). The worker only runs functions importable by module name,
    so while a child starts, main is described as a module named `__main__`, which the child skips.
    """
    with STARTING:  # two threads starting children at once would restore each other's stand-in
        main = sys.modules["__main__"]
        saved = getattr(main, "__spec__", None)
        main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
        try:
            yield
        finally:
            main.__spec__ = saved


def limit_error(limit_s: float, stage: str) -> RunError:
    """What a run that passed its time limit raises."""
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


def death_error(exitcode: int | None, stage: str) -> RunError:
    """What a run whose process died raises."""
    cause = death_cause(exitcode)
    if exitcode == -signal.SIGKILL:
        cause += "; try a smaller shape"
    return RunError(f"the run's worker process died ({cause}) during {stage}; the next run gets a new one")


def resident_bytes(pid: int) -> int:
    """A process's resident memory, from /proc (0 where there is no /proc)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Clock:
    """A call's time limit, counted from the moment the request is sent."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s
        self.started = time.monotonic()

    def remaining_s(self) -> float:
        """Seconds left (infinite without a limit; negative once past it)."""
        if self.limit_s is None:
            return float("inf")
        return self.limit_s - (time.monotonic() - self.started)
