"""Progress on a terminal for the CLI: a tqdm bar when tqdm is installed, a plain line when not, silence off a TTY.

The callback has the signature every long step takes (`progress(fraction, message)`), so the CLI
hands it to `load_trace` and the analysis as the app hands them `gr.Progress`.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any, TextIO

try:  # optional: the CLI must run on a bare torch install
    from tqdm import tqdm
except ImportError:  # pragma: no cover - exercised by the stdlib test through `use_tqdm=False`
    tqdm = None

STEPS = 1000  # the bar's resolution: 0.1%
DEFAULT_SIZE = os.terminal_size((80, 24))  # for a terminal that reports none (a pty nobody sized)


def _size(stream: TextIO) -> os.terminal_size:
    """The terminal's size; tqdm draws nothing at all on one that reports 0 rows or columns."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return DEFAULT_SIZE
    return os.terminal_size((size.columns or DEFAULT_SIZE.columns, size.lines or DEFAULT_SIZE.lines))


class TerminalProgress:
    """A `progress(fraction, message)` callback drawing on `stream` (stderr) only when it is a terminal."""

    def __init__(self, stream: TextIO | None = None, use_tqdm: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.use_tqdm = (tqdm is not None) if use_tqdm is None else use_tqdm and tqdm is not None
        self.bar: Any = None
        self.drawn = False

    def __call__(self, fraction: float, message: str) -> None:
        if not self.enabled:
            return
        fraction = min(max(fraction, 0.0), 1.0)
        if self.use_tqdm:
            if self.bar is None:
                self.bar = tqdm(
                    total=STEPS,
                    file=self.stream,
                    leave=False,
                    ncols=_size(self.stream).columns,
                    nrows=_size(self.stream).lines,
                    bar_format="{l_bar}{bar}| {elapsed}",
                )
            self.bar.n = round(fraction * STEPS)
            self.bar.set_description_str(message, refresh=False)
            self.bar.refresh()
        else:
            self.stream.write(f"\r[{fraction:4.0%}] {message[:70]:<70}")
            self.stream.flush()
            self.drawn = True

    def close(self) -> None:
        """Take the bar off the terminal, leaving the line for what the CLI prints next."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.drawn:
            self.stream.write("\r" + " " * 78 + "\r")
            self.stream.flush()

    def __enter__(self) -> TerminalProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
