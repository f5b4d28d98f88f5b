"""What every endpoint shares: validation, gr.Error, ZeroGPU, run directories, cancellation. No layout."""

from __future__ import annotations

import contextlib
import html
import math
import os
from collections.abc import Callable, Generator, Iterator
from typing import Any

import gradio as gr

QUEUE_SIZE = int(os.environ.get("ATTENTION_PROFILER_QUEUE", "16"))
RUN_TIME_LIMIT_S = float(os.environ.get("ATTENTION_PROFILER_TIME_LIMIT", "300"))
# ZeroGPU reserves the GPU for the duration a request asks for: a run's share of the time limit and
# its unprofiled timing loops (the forward's, and in training the backward's: each at most the timing
# budget), a sweep or comparison at most the one limit they share, plus a margin for import and export.
GPU_SECONDS_PER_RUN, GPU_MARGIN_S, TIMING_LOOPS_PER_RUN = 60, 30, 2
# How many outputs each generator handler has: it yields "no change" to all of them while it waits.
PROFILE_OUTPUTS, COMPARE_OUTPUTS, SWEEP_OUTPUTS, ANALYZE_OUTPUTS, DIFF_TRACES_OUTPUTS = 7, 3, 2, 8, 2


def gpu_seconds(runs: int) -> int:
    """The GPU time to reserve for `runs` runs that share one time limit, their timing loops included."""
    from profiling.timing import timing_budget_s

    per_run = GPU_SECONDS_PER_RUN + TIMING_LOOPS_PER_RUN * timing_budget_s()
    return math.ceil(min(RUN_TIME_LIMIT_S, runs * per_run) + GPU_MARGIN_S)


try:  # ZeroGPU on Hugging Face Spaces: the GPU is attached only inside @spaces.GPU.
    import spaces

    def on_gpu(duration: Any) -> Any:
        return spaces.GPU(duration=duration)

except ImportError:

    def on_gpu(duration: Any) -> Any:
        return lambda fn: fn


_store = None


def store() -> Any:
    """The per-request run directories (created on first use, pruned as runs are added)."""
    global _store
    if _store is None:
        from profiling.storage import RunStore

        _store = RunStore(os.environ.get("ATTENTION_PROFILER_DIR"))
    return _store


def start_worker() -> None:
    """Start the run worker (and its forkserver, which imports torch) beside the server, so the first
    request's time limit does not pay for it."""
    import threading

    from profiling.worker import default_worker

    threading.Thread(target=default_worker().start, name="worker-start", daemon=True).start()


def app_error(message: str) -> gr.Error:
    # Messages can quote an uploaded file's name or a trace's field: shown as text, never markup.
    return gr.Error(html.escape(message, quote=False), print_exception=False)


def app_file(path: str | None, field: str) -> str:
    """`path` if it is a file this app holds (an upload or one of its own runs), else gr.Error.

    An API caller can name any server path in a FileData; none but these may be read or shared.
    """
    from pathlib import Path

    from gradio.utils import get_upload_folder

    if not path:
        raise app_error(f"{field}: upload a .json or .json.gz Chrome trace")
    resolved = Path(path).resolve()
    uploaded = resolved.is_file() and resolved.is_relative_to(Path(get_upload_folder()).resolve())
    if not (uploaded or store().owns(resolved)):
        raise app_error(f"{field}: only files uploaded to this app or produced by it can be used")
    return str(resolved)


def whole(value: Any) -> Any:
    """Numbers from the UI arrive as floats; pass whole ones on as int, the rest untouched."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def spec_of(**fields: Any) -> Any:
    """The AttentionSpec for UI/API values; it validates them all and names the bad field."""
    from attention import AttentionSpec

    values = {name: whole(value) for name, value in fields.items()}
    values["backend"] = values.get("backend") or "auto"
    with user_errors():
        return AttentionSpec(**values)


def session_of(request: gr.Request | None) -> str | None:
    """The caller's session, which keeps its runs apart from other sessions' in the worker."""
    return getattr(request, "session_hash", None) if request is not None else None


def progress_of(progress: gr.Progress) -> Any:
    return lambda fraction, message: progress(fraction, desc=message)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Our own errors (bad spec, failed run, bad trace, failed share) reach the user as gr.Error."""
    from attention import SpecError
    from profiling.runner import RunError
    from profiling.share import ShareError
    from profiling.trace import TraceError

    try:
        yield
    except (SpecError, RunError, TraceError, ShareError) as exc:
        raise app_error(str(exc)) from None


def while_running(
    outputs: int, work: Callable[..., Any], /, *args: Any, caller: str | None = None, **kwargs: Any
) -> Generator[Any, None, Any]:
    """`work(*args, cancelled=..., **kwargs)` in a thread, on behalf of `caller` (a session: runs keep
    sessions apart, see `worker.called_by`); yields "no change" to the handler's `outputs` outputs every
    second meanwhile, and returns its result.

    Why a generator: Gradio closes a generator handler at its next yield when the client leaves
    (a plain handler runs to the end), which sets `cancelled` and kills the run's worker process.
    """
    from profiling.closable import until_closed
    from profiling.worker import called_by

    # A handler with one output takes a tuple as that output's value: its "no change" is a bare skip.
    tick = gr.skip() if outputs == 1 else tuple(gr.skip() for _ in range(outputs))
    with user_errors():
        return (yield from until_closed(called_by, caller, work, *args, tick=tick, **kwargs))
