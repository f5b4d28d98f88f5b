"""Imported by the app's forkserver (profiling/worker_process.py PRELOAD): numba and the compiled decoder loaded
and their code compiled or read from numba's cache once, so every worker forked from it reads any upload by the
compiled route at no cost to load it (profiling/reader.py `native_wanted`)."""

from profiling.native import warm

warm()
