"""Diff: two runs of this session, side by side; the runs are kept in a session State."""

from __future__ import annotations

from typing import Any

import gradio as gr

from endpoints import app_error, diff

HISTORY_SIZE = 20  # runs of this session kept for the Diff tab


def remember(history: list[dict], summary: dict | list) -> list[dict]:
    """Keep this session's runs (newest last) for the Diff tab."""
    new = [s for s in (summary if isinstance(summary, list) else [summary]) if "error" not in s]
    return (history + new)[-HISTORY_SIZE:]


def diff_choices(history: list[dict]) -> tuple[Any, Any]:
    from profiling.compare import row_label

    labels = [f"{i + 1}. {row_label(s)} {s['dtype']} S={s['seq_len']}" for i, s in enumerate(history)]
    before = labels[-2] if len(labels) > 1 else None
    after = labels[-1] if labels else None
    return gr.update(choices=labels, value=before), gr.update(choices=labels, value=after)


def _diff_picked(history: list[dict], before: int | None, after: int | None) -> Any:
    if before is None or after is None:
        raise app_error("diff: profile at least two runs in this session, then pick them")
    from profiling.diff import diff_summaries

    return diff_summaries(history[before], history[after])


def diff_tab(history: gr.State) -> None:
    with gr.Row():
        before = gr.Dropdown([], label="before", type="index", info="runs from this session's Profile and Compare")
        after = gr.Dropdown([], label="after", type="index")
        button = gr.Button("Diff")
    table = gr.Dataframe(label="per forward: added, removed, changed", elem_id="diff-table")
    button.click(_diff_picked, [history, before, after], table, api_visibility="private")
    gr.api(diff, api_name="diff")
    history.change(diff_choices, history, [before, after], api_visibility="private")
