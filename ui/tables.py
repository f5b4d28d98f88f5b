"""The tables people read: display-only copies of the API's tables, filled by private follow-up steps.

Each endpoint's Dataframe outputs stay as they are, for API callers, and are hidden on the page. A
`.success(...)` step with api_visibility="private" reads them back and fills a read-only, searchable
table beside a CSV download (profiling/display.py decides the order, unit, columns and text).

    view = table_view("op table", "op-table")
    done.success(profile_tables, [summary, op_table, kernels], [*view.outputs, ...], api_visibility="private")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

CHAR_PX = 9  # the table's font, per character, with room to spare
CELL_PAD_PX = 34  # a cell's padding and its header's sort menu button
SORTED_BY = {
    "self device (µs)": "self device time",
    "self cpu (µs)": "self CPU time",
    "total (µs)": "total time",
}
_tables_store = None


@dataclass(frozen=True)
class TableView:
    """A display-only table and its CSV download, as one pair of outputs."""

    frame: gr.Dataframe
    csv: gr.DownloadButton

    @property
    def outputs(self) -> list[gr.components.Component]:
        return [self.frame, self.csv]


def table_view(label: str, elem_id: str) -> TableView:
    """A read-only, searchable table (no row editing, no "+" button) and a hidden CSV button under it.

    Full names stay in the cells, clipped to the column's width on the page; the CSV holds them whole.
    """
    frame = gr.Dataframe(
        label=label,
        elem_id=elem_id,
        interactive=False,
        show_search="search",
        buttons=["fullscreen", "copy"],
        wrap=False,
        max_height=520,
        elem_classes=["display-table"],
    )
    with gr.Row():
        csv = gr.DownloadButton("Download CSV", visible=False, size="sm", scale=0, elem_id=f"{elem_id}-csv")
    return TableView(frame, csv)


def hidden_api_table(label: str, elem_id: str) -> gr.Dataframe:
    """An endpoint's Dataframe output, kept for API callers and read back by the follow-up step."""
    return gr.Dataframe(label=label, elem_id=elem_id, visible=False, interactive=False)


def profile_tables(summary: dict | None, op_table: Any, kernel_table: Any) -> tuple:
    """Profile's op and kernel tables as shown. On CPU the kernel table lists the leaf compute ops."""
    from profiling.display import compute_ops, has_gpu_activity

    summary = summary or {}
    gpu, forwards = has_gpu_activity(summary), summary.get("forwards")
    files = _csv_dir()
    ops = _shown(op_table, "ops", gpu, forwards, files / "op_table.csv", "op table", "annotations last")
    if gpu:
        kernels = _shown(kernel_table, "kernels", gpu, forwards, files / "kernel_table.csv", "kernel table")
    else:
        per_forward = summary.get("per_forward_kernels") or {}
        note = "on CPU: the leaf compute ops, which the cards count as kernels (times over all the op's calls)"
        table = compute_ops(_frame(op_table), per_forward)
        kernels = _shown(table, "compute ops", gpu, forwards, files / "compute_ops.csv", "kernel table", note)
    return (*ops, *kernels)


def analyze_tables(summary: dict | None, ops: Any, kernels: Any, steps: Any, annotations: Any) -> tuple:
    """Analyze's op, kernel, steps and annotations tables as shown."""
    from profiling.analysis import MAX_ANNOTATIONS, MAX_STEPS
    from profiling.display import has_gpu_activity
    from profiling.uploads import MAX_TABLE_ROWS

    summary = summary or {}
    gpu = has_gpu_activity(summary)
    files = _csv_dir()
    op_frame, kernel_frame = _frame(ops), _frame(kernels)
    cut = f"the {MAX_TABLE_ROWS:,} rows with the most self CPU time; % of those rows"
    op_note = cut if len(op_frame) >= MAX_TABLE_ROWS else None
    kernel_note = None if gpu else "no GPU activity in this trace, so no kernels: its compute is in the op table"
    if gpu and len(kernel_frame) >= MAX_TABLE_ROWS:
        kernel_note = f"the {MAX_TABLE_ROWS:,} names with the most time; % of those rows"
    return (
        *_shown(op_frame, "ops", gpu, None, files / "op_table.csv", "op table", op_note),
        *_shown(kernel_frame, "kernels", gpu, None, files / "kernel_table.csv", "kernel table", kernel_note),
        *_shown(steps, "steps", gpu, None, files / "steps.csv", f"steps (the first {MAX_STEPS})", "in time order"),
        *_shown(
            annotations, "annotations", gpu, None, files / "annotations.csv",
            f"annotations (the {MAX_ANNOTATIONS} longest in total)",
        ),
    )  # fmt: skip


def compare_view(table: Any) -> tuple:
    """Compare's side-by-side table as shown: times in µs, one line per run, every run listed."""
    return _shown(table, "compare", False, None, _csv_dir() / "compare.csv", "side by side", "one run per row")


def _frame(value: Any) -> Any:
    """A Dataframe input as a pandas DataFrame with numbers as numbers (None and an empty table included)."""
    import pandas as pd

    if value is None:
        return pd.DataFrame()
    frame = value if isinstance(value, pd.DataFrame) else pd.DataFrame(value)
    frame = frame.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            numbers = pd.to_numeric(frame[column], errors="coerce")
            # A column of numbers sent back as text (or with blanks): numbers again; a text column stays text.
            if numbers.notna().sum() and numbers.notna().sum() == frame[column].map(_filled).sum():
                frame[column] = numbers
    return frame


def _filled(value: Any) -> bool:
    return value is not None and value == value and value != ""


def _shown(
    table: Any, kind: str, gpu: bool, forwards: int | None, csv: Path, title: str, note: str | None = None
) -> tuple[Any, Any]:
    """The (table, CSV button) updates for one API table."""
    from profiling.display import formatter, prepare

    shown = prepare(_frame(table), kind, gpu=gpu, forwards=forwards)
    values = shown.values
    shown.values.to_csv(csv, index=False)
    styled = values.style.format({column: formatter(column) for column in values.columns})
    label = " · ".join(
        part
        for part in (title, _sort_note(shown.sorted_by), "times in µs" if _has_times(values) else None, note)
        if part
    )
    widths = [f"{CHAR_PX * chars + CELL_PAD_PX}px" for chars in shown.widths()]
    frame = gr.update(value=styled if len(values) else values, label=label, column_widths=widths)
    return frame, gr.update(value=str(csv), visible=bool(len(values)))


def _sort_note(key: str | None) -> str | None:
    return f"largest {SORTED_BY[key]} first" if key in SORTED_BY else None


def _has_times(values: Any) -> bool:
    return any("(µs)" in column for column in values.columns)


def _csv_dir() -> Path:
    """A fresh directory for one follow-up's CSV files, in a store of its own beside the run store
    (pruned by age and count, so CSVs never evict a user's run)."""
    global _tables_store
    if _tables_store is None:
        from endpoints.common import store
        from profiling.storage import RunStore

        _tables_store = RunStore(Path(store().root) / "tables")
    return _tables_store.new_dir()
