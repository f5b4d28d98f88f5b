"""Diff: two runs of this session, side by side; the runs are kept in a session State."""

from __future__ import annotations

import shlex
import time
from typing import Any

import gradio as gr

from endpoints import app_error, diff

HISTORY_SIZE = 20  # runs of this session kept for the Diff tab
PROFILED_AT = "profiled_at"  # the key `remember` adds to each run it keeps: when it finished (UTC)
# What can tell two runs apart besides their variant and backend (`row_label`), in the order a label shows them.
LABEL_FIELDS = (
    *("mode", "mask", "window", "valid_len", "q_len", "kv_heads"),
    *("batch", "heads", "seq_len", "head_dim", "dtype", "device"),
)
MASK_FIELDS = {"window": "sliding_window", "valid_len": "padding"}  # shown only on a run with that mask


def remember(history: list[dict], summary: dict | list) -> list[dict]:
    """Keep this session's runs (newest last) for the Diff tab, each with the time it finished."""
    at = time.strftime("%H:%M:%S UTC", time.gmtime())
    new = [{**s, PROFILED_AT: at} for s in (summary if isinstance(summary, list) else [summary]) if "error" not in s]
    return (history + new)[-HISTORY_SIZE:]


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def run_labels(history: list[dict]) -> list[str]:
    """One label per run: its number and name, every field whose value differs among the runs, and its time."""
    from profiling.compare import row_label

    differing = [f for f in LABEL_FIELDS if len({_shown(s.get(f)) for s in history}) > 1]
    labels = []
    for i, s in enumerate(history):
        used = [f for f in differing if MASK_FIELDS.get(f, s.get("mask")) == s.get("mask")]
        fields = " ".join(f"{f}={_shown(s.get(f))}" for f in used)
        labels.append(" · ".join(part for part in (f"{i + 1}. {row_label(s)}", fields, s.get(PROFILED_AT)) if part))
    return labels


def diff_choices(history: list[dict]) -> tuple[Any, Any]:
    labels = run_labels(history)
    before = labels[-2] if len(labels) > 1 else None
    after = labels[-1] if labels else None
    return gr.update(choices=labels, value=before), gr.update(choices=labels, value=after)


def cli_command(summary: dict[str, Any]) -> str:
    """The `python -m profiling run` line that repeats this run: the shape, and each practice flag that is
    not its default (kv_heads and q_len are stored resolved: equal to heads and seq_len means the default)."""
    flags: list[tuple[str, Any]] = [("variant", summary["variant"])]
    if summary["variant"] == "sdpa":
        flags.append(("backend", summary.get("backend", "auto")))
    flags += [(f, summary[f]) for f in ("batch", "heads", "seq_len", "head_dim", "dtype", "device")]
    if summary.get("mode", "inference") != "inference":
        flags.append(("mode", summary["mode"]))
    if summary.get("kv_heads") not in (None, 0, summary["heads"]):
        flags.append(("kv_heads", summary["kv_heads"]))
    if summary.get("q_len") not in (None, 0, summary["seq_len"]):
        flags.append(("q_len", summary["q_len"]))
    mask = summary.get("mask", "causal")
    if mask != "causal":
        flags.append(("mask", mask))
    if mask == "sliding_window":
        flags.append(("window", summary["window"]))
    if mask == "padding":
        flags.append(("valid_len", _shown(summary["valid_len"])))
    words = ["python", "-m", "profiling", "run"]
    for name, value in flags:
        words += [f"--{name.replace('_', '-')}", shlex.quote(_shown(value))]
    return " ".join(words + (["--compile"] if summary.get("compile") else []))


def _diff_picked(history: list[dict], before: int | None, after: int | None) -> tuple[Any, str]:
    if before is None or after is None:
        raise app_error("diff: profile at least two runs in this session, then pick them")
    from profiling.diff import diff_summaries

    runs = history[before], history[after]
    commands = "\n".join(f"# {which}\n{cli_command(run)}" for which, run in zip(("before", "after"), runs, strict=True))
    return diff_summaries(*runs), commands


def diff_tab(history: gr.State) -> None:
    with gr.Row():
        before = gr.Dropdown(
            [], label="before", type="index", info="runs from this session's Profile and Compare", scale=3
        )
        after = gr.Dropdown([], label="after", type="index", scale=3)
        button = gr.Button("Diff", scale=1)
    table = gr.Dataframe(label="per forward: added, removed, changed", elem_id="diff-table")
    commands = gr.Textbox(
        label="the two runs as CLI commands",
        lines=4,
        interactive=False,
        buttons=["copy"],
        elem_id="diff-commands",
    )
    button.click(_diff_picked, [history, before, after], [table, commands], api_visibility="private")
    gr.api(diff, api_name="diff")
    history.change(diff_choices, history, [before, after], api_visibility="private")
