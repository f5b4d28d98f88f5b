"""One memory budget for the whole machine, which profiled runs and trace analyses both draw from.

A run's preflight and `/analyze`'s admission once kept separate books (60% of the free memory for a run,
75% of the machine for analyses), so a run and an analysis could together claim more than there is. Now
each holds its estimated peak in `machine_budget()` for as long as it works: a job that could never fit
is refused at once, one that does not fit now waits (first come, first served) or is refused, with the
numbers. A job that learns it needs more once it has started (an analysis, after reading its trace) grows
its share, ahead of the jobs not yet admitted. It lives here, below `profiling`, because the run's
preflight (`attention.support`) reads it too; it imports nothing heavy.

The budget is of host memory: a CUDA run's tensors are on the GPU and are checked against its free
memory alone.

    with machine_budget().admit(need, field="trace", kind="analysis", wait_s=300):
        ...
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

MiB, GiB = 1024**2, 1024**3
# Runs and analyses together may hold this share of the machine's memory (or of its container's
# limit); the rest is for the app itself, the idle profiling worker and the system.
MEMORY_SHARE = 0.75
BUDGET_ENV = "ATTENTION_PROFILER_MEMORY"  # bytes, overrides MEMORY_SHARE
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # v2, v1
KINDS = ("run", "analysis")
ErrorFactory = Callable[[str, str], Exception]  # (field, detail) -> the caller's own error type


class BudgetError(RuntimeError):
    """A job the budget cannot take; `field` is the input to change, the message starts with it."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field


def size(n: float) -> str:
    """`3.2 GiB`, or `80 MiB` under a GiB: how the budget's messages write sizes."""
    return f"{n / GiB:,.1f} GiB" if n >= GiB else f"{n / MiB:,.0f} MiB"


def machine_memory_bytes() -> int:
    """Physical memory, or the container's memory limit where that is lower (cgroup v2 or v1)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        with contextlib.suppress(OSError, ValueError):  # no such cgroup file, or "max": no limit
            total = min(total, int(Path(path).read_text().strip()))
    return total


def budget_bytes() -> int:
    """What runs and analyses may hold together: `ATTENTION_PROFILER_MEMORY`, else MEMORY_SHARE."""
    value = os.environ.get(BUDGET_ENV, "")
    if value:
        if not value.isdigit() or int(value) == 0:
            raise ValueError(f"{BUDGET_ENV}: give a positive whole number of bytes, got {value[:100]!r}")
        return int(value)
    return int(machine_memory_bytes() * MEMORY_SHARE)


class MemoryBudget:
    """Admits jobs while the bytes held by all of them fit `budget_bytes`; first come, first served."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._held: collections.Counter[str] = collections.Counter()
        self._queue: collections.deque[object] = collections.deque()  # jobs waiting to be admitted
        self._growing: collections.deque[tuple[object, int]] = collections.deque()  # admitted jobs waiting to grow
        self._holders = 0  # jobs admitted and not yet done
        self._changed = threading.Condition()

    @property
    def in_use_bytes(self) -> int:
        return sum(self._held.values())

    def available_bytes(self) -> int:
        """What a job could be given now, were it first in line (the growth admitted jobs wait for is theirs)."""
        return max(0, self.budget_bytes - self.in_use_bytes - self._pending_growth())

    def holders(self) -> str:
        """Who holds the budget now: `runs hold 0 MiB and analyses 80 MiB of 100 MiB`."""
        runs, analyses = size(self._held["run"]), size(self._held["analysis"])
        return f"runs hold {runs} and analyses {analyses} of {size(self.budget_bytes)}"

    @contextlib.contextmanager
    def admit(
        self,
        need_bytes: int,
        *,
        field: str,
        kind: str,
        wait_s: float,
        cancelled: Callable[[], bool] | None = None,
        error: ErrorFactory = BudgetError,
    ) -> Iterator[Share]:
        """Hold `need_bytes` for the `with` block, waiting up to `wait_s` for room; `kind` is run or analysis.
        The block gets the `Share` held, which it may grow (`Share.grow_to`) once it knows more.

        Raises `error(field, detail)` when the job can never fit, when the wait runs out (at once
        for `wait_s=0`), or when `cancelled()` turns true while it waits.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self._never_fits(need_bytes, field, kind, error)
        self._acquire(need_bytes, field, kind, wait_s, cancelled, error)
        share = Share(self, kind, need_bytes, field, error)
        try:
            yield share
        finally:
            with self._changed:
                self._held[kind] -= share.bytes
                self._holders -= 1
                share.closed = True
                self._changed.notify_all()

    def _never_fits(self, need: int, field: str, kind: str, error: ErrorFactory) -> None:
        if need > self.budget_bytes:
            raise error(
                field,
                f"this {kind} needs about {size(need)} of memory; this server allows "
                f"{size(self.budget_bytes)} for runs and analyses together",
            )

    def _acquire(
        self,
        need: int,
        field: str,
        kind: str,
        wait_s: float,
        cancelled: Callable[[], bool] | None,
        error: ErrorFactory,
    ) -> None:
        ticket, give_up = object(), time.monotonic() + wait_s
        with self._changed:
            self._queue.append(ticket)
            try:
                # The growth that admitted jobs wait for is theirs: a newcomer waiting on one of them would
                # wait for a release that waits on the newcomer.
                while not (self._queue[0] is ticket and self._fits(need + self._pending_growth())):
                    self._wait(give_up, wait_s, need, field, kind, cancelled, error)
                self._held[kind] += need
                self._holders += 1
            finally:
                self._queue.remove(ticket)
                self._changed.notify_all()  # the next in line may fit now

    def _fits(self, more: int) -> bool:
        return self.in_use_bytes + more <= self.budget_bytes

    def _pending_growth(self) -> int:
        return sum(extra for _, extra in self._growing)

    def _grow(self, share: Share, extra: int, wait_s: float, cancelled: Callable[[], bool] | None) -> None:
        """Add `extra` bytes to `share`, before any newcomer: first come, first served among the shares that
        grow, except where every holder waits to grow (none will release while it waits), when any that fits
        goes. Where every holder waits and none of them fits, the one that finds this gives up."""
        ticket, give_up = object(), time.monotonic() + wait_s
        entry = (ticket, extra)
        with self._changed:
            if share.closed:
                raise RuntimeError("this share was given back when its admit block ended; it cannot grow")
            self._growing.append(entry)
            try:
                while True:
                    everyone = len(self._growing) == self._holders
                    if self._fits(extra) and (everyone or self._growing[0] is entry):
                        break
                    if everyone and not any(self._fits(more) for _, more in self._growing):
                        raise share.error(
                            share.field,
                            f"the server is busy: {self.holders()} and this {share.kind} needs {size(extra)} more, "
                            "while every other holder waits to grow too; try again in a few minutes",
                        )
                    self._wait(give_up, wait_s, extra, share.field, share.kind, cancelled, share.error)
                self._held[share.kind] += extra
                share.bytes += extra
            finally:
                self._growing.remove(entry)
                self._changed.notify_all()

    def _wait(
        self,
        give_up: float,
        wait_s: float,
        need: int,
        field: str,
        kind: str,
        cancelled: Callable[[], bool] | None,
        error: ErrorFactory,
    ) -> None:
        """Wait a moment for a change (the lock held); raise where cancelled or past `give_up`."""
        if cancelled is not None and cancelled():
            raise error(field, "cancelled while waiting for memory")
        left = give_up - time.monotonic()
        if left <= 0:
            waited = f"waited {wait_s:g} s, try" if wait_s > 0 else "try"
            raise error(
                field,
                f"the server is busy: {self.holders()} and this {kind} needs {size(need)}; "
                f"{waited} again in a few minutes",
            )
        self._changed.wait(min(left, 0.1))  # wakes to look at cancelled() too


class Share:
    """The bytes one admitted job holds of a `MemoryBudget`, given back when its `admit` block ends."""

    def __init__(self, budget: MemoryBudget, kind: str, held: int, field: str, error: ErrorFactory) -> None:
        self.budget, self.kind, self.bytes, self.field, self.error = budget, kind, held, field, error
        self.closed = False  # given back: it can grow no more

    def grow_to(self, total_bytes: int, wait_s: float, cancelled: Callable[[], bool] | None = None) -> None:
        """Hold `total_bytes` in all (never less than now): the job learnt it needs more. Waits up to `wait_s`
        for room, ahead of jobs not yet admitted; raises the admission's error where it can never fit, the
        wait runs out, it is cancelled, or every other holder waits to grow too."""
        if total_bytes <= self.bytes:
            return
        self.budget._never_fits(total_bytes, self.field, self.kind, self.error)
        self.budget._grow(self, total_bytes - self.bytes, wait_s, cancelled)


@functools.cache
def machine_budget() -> MemoryBudget:
    """The one budget of this process (the app's), sized by `budget_bytes()` at its first use."""
    return MemoryBudget(budget_bytes())
