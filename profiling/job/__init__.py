"""Whole training jobs: every rank's trace summarised where it is read, then one distributed view.

Imports only `profiling` and `attention` (never gradio or plotly), so the CLI and Dask workers run it bare.
"""
