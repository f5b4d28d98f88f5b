"""`python -m profiling view TRACE --view NAME [--json] [--top N]`: one extra view of a trace, headless.

The text form prints the view's title, its note and the columns a reader needs (`ViewKind.text_columns`)
within WIDTH characters, cutting text cells (never numbers) to fit; `--json` prints every column of every
row shown. Needs neither gradio nor plotly. Every string from the trace goes through `plain` (see
profiling/__main__.py) before it reaches the terminal.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from profiling.terminal import plain, whole_number

WIDTH = 120  # characters a printed line may take
TEXT_ROWS = 20  # rows printed unless --top says otherwise
MIN_TEXT = 12  # a text column is cut no narrower than this
GAP = "  "
CUT = "…"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The `view` subcommand on `subparsers` (the object `add_subparsers` returned)."""
    from profiling.views import VIEWS

    parser = subparsers.add_parser(
        "view",
        help="one extra view of a Chrome trace: memory, modules, grouping, tensor cores",
        description="One extra view of a torch.profiler Chrome trace (.json or .json.gz).",
    )
    parser.add_argument("trace")
    parser.add_argument("--view", choices=tuple(VIEWS), default="memory", help="which view (default: memory)")
    parser.add_argument("--json", action="store_true", help="one JSON object: the view with every column")
    parser.add_argument(
        "--top", type=whole_number, default=TEXT_ROWS, help=f"rows shown, in the view's order (default {TEXT_ROWS})"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the view; 0 done, 2 a bad trace (the message names `trace`)."""
    import json

    from profiling.progress import TerminalProgress
    from profiling.trace import TraceError, load_trace
    from profiling.views import VIEWS, view

    if Path(args.trace).is_dir():
        print(f"error: trace: {plain(args.trace)} is a directory; give a .json or .json.gz file", file=sys.stderr)
        return 2
    try:
        with TerminalProgress() as progress:
            shown = view(load_trace(args.trace, progress), args.view, args.top)
    except TraceError as exc:
        print(f"error: {plain(str(exc))}", file=sys.stderr)
        return 2
    if args.json:  # json escapes control characters itself
        print(json.dumps(shown.to_dict(), indent=1, allow_nan=False))
        return 0
    print(plain(shown.title))
    print(textwrap.fill(plain(shown.note), WIDTH))
    columns = [c for c in VIEWS[args.view].text_columns if c in shown.table.columns]
    for line in text_table(shown.table[columns], plain):
        print(line)
    return 0


def text_table(table: pd.DataFrame, clean: Callable[[str], str] = str, width: int = WIDTH) -> list[str]:
    """`table` as lines of at most `width` characters (when its numbers fit): numbers right-aligned with
    thousands separators (3 decimals in a column that has fractions), text made `clean`, and the widest text
    columns cut with "…" to one common width, no narrower than MIN_TEXT."""
    if table.empty:
        return ["(no rows)"]
    cells = {str(c): _column(table[c], clean) for c in table.columns}
    right = {str(c): _is_number(table[c]) for c in table.columns}
    widths = {c: max(len(c), *(len(v) for v in values)) for c, values in cells.items()}
    texts = sorted((widths[c] for c in cells if not right[c]), reverse=True)
    room = width - len(GAP) * (len(widths) - 1) - sum(widths[c] for c in cells if right[c])
    if sum(texts) > room:
        level = _level(texts, room)
        widths = {c: w if right[c] else min(w, level) for c, w in widths.items()}
    lines = [GAP.join(_fit(c, widths[c], right[c]) for c in cells)]
    lines += [GAP.join(_fit(cells[c][i], widths[c], right[c]) for c in cells) for i in range(len(table))]
    return [line.rstrip() for line in lines]


def _level(texts: list[int], room: int) -> int:
    """The widest common cap on the text columns' widths (`texts`, widest first) that fits `room`: columns
    narrower than it keep their width. Never under MIN_TEXT (the numbers then overflow `room`)."""
    for count in range(1, len(texts) + 1):
        narrower = sum(texts[count:])
        level = (room - narrower) // count
        if count == len(texts) or level >= texts[count]:
            return max(MIN_TEXT, level)
    return MIN_TEXT


def _is_number(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def _column(column: pd.Series, clean: Callable[[str], str]) -> list[str]:
    values = column.tolist()
    if not _is_number(column):
        return [("yes" if v else "no") if isinstance(v, bool) else clean("" if v is None else str(v)) for v in values]
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    digits = 0 if all(v.is_integer() for v in finite) else 3
    return [f"{float(v):,.{digits}f}" if v is not None and math.isfinite(v) else "-" for v in values]


def _fit(text: str, width: int, right: bool) -> str:
    if len(text) > width:
        text = text[: width - len(CUT)] + CUT
    return text.rjust(width) if right else text.ljust(width)
