"""The one error a run specification raises: it names the field, so every caller can point at it."""

from __future__ import annotations

import reprlib
from typing import Any

QUOTE_CHARS = 100  # the most of any input an error message repeats
_REPR = reprlib.Repr()  # Python 3.11's Repr takes no arguments: its limits are set below
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = QUOTE_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8


def quote(value: Any) -> str:
    """`repr(value)` for an error message, at most QUOTE_CHARS long, whatever the value's size.

    reprlib slices strings and containers before it renders them, so a 20 MB input costs no more
    than a short one; an int too long for `repr` (Python refuses past 4,300 digits) is described.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * QUOTE_CHARS:
        return f"a whole number of about {int(value.bit_length() * 0.30103):,} digits"
    text = _REPR.repr(value)
    return text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 3] + "..."


class SpecError(ValueError):
    """A spec that cannot be run. The message names the field and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
