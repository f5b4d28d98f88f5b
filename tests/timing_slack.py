"""One factor that widens every wall-clock bound in the suite, for machines slower or busier than CI.

Timing-subject tests (time limits, worker kill latency, admission waits, request latency) multiply each
bound they assert by `TIMING_SLACK`. It never narrows a bound: a value under 1 is refused, so a test can
only become more lenient, never flaky. Set it from the environment: `TIMING_SLACK=3 pytest ...`
(bench/loaded_suite.sh does, with two busy processes beside the suite).
"""

from __future__ import annotations

import math
import os

VARIABLE = "TIMING_SLACK"


def _read(raw: str | None) -> float:
    """The slack factor in `raw` (default 1); anything not a finite number >= 1 is an error naming the variable."""
    if raw is None or not raw.strip():
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{VARIABLE} must be a number >= 1, got {raw!r}") from None
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"{VARIABLE} must be a finite number >= 1, got {raw!r}")
    return value


TIMING_SLACK: float = _read(os.environ.get(VARIABLE))


def slack(seconds: float) -> float:
    """`seconds` widened by TIMING_SLACK: the bound a timing-subject test asserts."""
    return seconds * TIMING_SLACK
