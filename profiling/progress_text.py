"""Progress a person can follow during a run: the stage, the seconds so far and the run's estimate, in one line.

The page shows a handler's `progress(fraction, message)` only while the request is "pending". A Gradio
generator handler that yields to stay cancellable (`endpoints.common.while_running` yields "no change"
every second) turns the request to "generating" at each yield, and the page then shows an orange border
and nothing else. So the line is sent again after each of those yields (`refreshed`), with its elapsed
time brought up to date, which also makes the elapsed time move while a stage lasts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from typing import TypeVar

Progress = Callable[[float, str], None]
Sent = TypeVar("Sent")
Returned = TypeVar("Returned")

FIRST_STAGE = "starting"


def progress_line(stage: str, elapsed_s: float, estimate_s: float | None) -> str:
    """`stage · 12 s of about 40 s`; past the estimate `stage · 52 s (estimated 40 s)`; with none `stage · 12 s`."""
    elapsed = f"{stage} · {elapsed_s:.0f} s"
    if estimate_s is None:
        return elapsed
    if elapsed_s <= estimate_s:
        return f"{elapsed} of about {_seconds(estimate_s)}"
    return f"{elapsed} (estimated {_seconds(estimate_s)})"


def _seconds(value: float) -> str:
    # Under a second the estimate still reads as a figure, not "about 0 s".
    return f"{value:.0f} s" if value >= 1 else "< 1 s"


class Stopwatch:
    """A `progress(fraction, message)` callback that adds the elapsed time and the estimate to each message
    before passing it to `report`; `refresh()` repeats the last one with the time brought up to date.

    The clock starts when the stopwatch is made: the run's own setup counts as time the user waits.
    """

    def __init__(self, report: Progress, estimate_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.report = report
        self.estimate_s = estimate_s
        self.clock = clock
        self.started = clock()
        self.fraction, self.stage = 0.0, FIRST_STAGE
        self._lock = threading.Lock()  # stages arrive on the run's thread, refreshes on the handler's

    def __call__(self, fraction: float, message: str) -> None:
        with self._lock:
            self.fraction, self.stage = fraction, message
        self.refresh()

    def refresh(self) -> None:
        """Send the current stage again, with the seconds elapsed now."""
        with self._lock:
            fraction, stage = self.fraction, self.stage
        self.report(fraction, progress_line(stage, self.clock() - self.started, self.estimate_s))


def refreshed(steps: Generator[Sent, None, Returned], refresh: Callable[[], None]) -> Generator[Sent, None, Returned]:
    """`yield from steps`, calling `refresh()` first, then each time `steps` resumes after a yield (the
    caller has shown what was yielded by then); returns what `steps` returns.

    Closing this generator closes `steps` (a client that left still cancels the run).
    """
    refresh()
    try:
        item = next(steps)
        while True:
            yield item
            refresh()
            item = next(steps)
    except StopIteration as done:
        return done.value
    finally:
        steps.close()
