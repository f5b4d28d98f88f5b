"""Profile attention with torch.profiler and explain the trace. Never imports gradio.

plotly is imported only by `profiling.charts`, so the CLI runs on a bare torch install.
"""
