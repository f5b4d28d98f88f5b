"""The app's endpoints: validation, gr.Error, ZeroGPU, and a call into `profiling`. No layout.

Their signatures are the public API and MCP schema: parameters are only ever appended, with
neutral defaults (`kv_heads` 0 = heads, `q_len` 0 = seq_len), and outputs never move.
"""

from endpoints.common import QUEUE_SIZE, app_error, app_file, gpu_seconds, start_worker, store
from endpoints.compact import analyze_summary, compare_summary, profile_summary
from endpoints.jobs import analyze_job
from endpoints.runs import compare, profile, sweep
from endpoints.uploads import analyze, diff, diff_traces, share
from endpoints.views import trace_views

__all__ = [
    "QUEUE_SIZE",
    "analyze",
    "analyze_job",
    "analyze_summary",
    "app_error",
    "app_file",
    "compare",
    "compare_summary",
    "diff",
    "diff_traces",
    "gpu_seconds",
    "profile",
    "profile_summary",
    "share",
    "start_worker",
    "store",
    "sweep",
    "trace_views",
]
