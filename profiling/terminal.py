"""Text for a terminal: names from a trace made harmless, and the CLI's whole-number arguments.

Every string printed from a trace goes through `plain` first: a name carrying `ESC ] 0 ;` or
`ESC [ 2 J` would otherwise retitle, clear or recolour the user's terminal.
"""

from __future__ import annotations

import argparse
import re

# Whole terminal sequences, 7- and 8-bit: CSI (`ESC [`, 0x9b) up to its final byte; OSC, DCS, SOS,
# PM and APC strings up to their terminator (BEL or ST), or to the end when it never comes, as a
# terminal would swallow them; any other `ESC` with its intermediates and final byte. Possessive
# throughout, so stripping a hostile name is linear in its length.
_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*+[ -/]*+[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*+(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*+[0-~]?"
)
# What is left of C0, DEL and C1: dropped; the whitespace among them becomes a space, so a name
# stays one line and one cell (the CLI's own newlines and tabs are written after this).
_CONTROLS = {c: None for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {ord(c): " " for c in "\t\n\v\f\r"}


def plain(text: str) -> str:
    """`text` without terminal control: no escape sequence, no C0 or C1 control, no DEL."""
    return _SEQUENCES.sub("", text).translate(_CONTROLS)


def whole_number(text: str) -> int:
    """`--top`: a whole number of rows from 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"top: give a whole number of rows from 0, got {text!r:.40}")
    return value
