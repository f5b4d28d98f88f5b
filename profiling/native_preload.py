"""Imported by the app's forkserver (profiling/worker_process.py PRELOAD): numba and the compiled code loaded, and
compiled or read from numba's cache, once, so every worker forked from it reads any upload by the compiled route
(profiling/reader.py `native_wanted`) and nests its events by the compiled walk (profiling/structure.py
`compiled_walk`) at no cost to load them."""

import numpy as np

from profiling.native import warm

if warm():  # numba is installed
    from profiling.native_nest import walked

    walked(np.zeros(1, np.int64), np.zeros(1), np.ones(1), 0.0)
