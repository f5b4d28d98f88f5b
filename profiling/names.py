"""The one bound on a name from a trace, applied before any regex, cache, groupby or display sees it.

A hostile trace can carry a kernel name of megabytes (a 100,000-digit name gzips to 263 bytes):
every regex over it, every cache keyed on it and every table showing it would pay for each
character. Real names stay far below the cap: the longest in the test traces, a templated CUDA
kernel, takes 5,123 characters; CUTLASS and cuDNN names take 0.2-2 kB, and what they say (the
family, tile, dtype, architecture) sits in their first few hundred characters.
"""

from __future__ import annotations

MAX_NAME_CHARS = 4096
# Shows that the name goes on; one character, so a cut name is exactly MAX_NAME_CHARS long.
CUT_MARK = "…"


def cut_name(name: str) -> str:
    """`name` unchanged up to MAX_NAME_CHARS characters; longer, its start and CUT_MARK in that many."""
    if len(name) <= MAX_NAME_CHARS:
        return name
    return name[: MAX_NAME_CHARS - len(CUT_MARK)] + CUT_MARK
