"""Analyze's "whole job" box: every rank's trace of one training job, as files or one zip (/analyze_job)."""

from __future__ import annotations

import gradio as gr

from endpoints import analyze_job
from traffic import refusing_urls


def job_box() -> None:
    """Upload the ranks' traces; see the distributed view: the mean step per rank, the step time per rank,
    the findings, the per-rank and collectives tables, and the whole job as JSON."""
    with gr.Accordion("A whole job: every rank's trace", open=False):
        gr.Markdown(
            "One `torch.profiler` trace per rank (at most 64, `.json` or `.json.gz`): on this page, upload one "
            "`.zip` of them (the page sends several files in one request, which this server refuses; API and "
            "MCP callers may send the traces one by one). Ranks are read one after another; the command line "
            "runs them in parallel, on Dask where installed (docs/jobs.md)."
        )
        traces = refusing_urls(
            gr.File(
                label="rank traces (.json, .json.gz) or one .zip",
                file_count="multiple",
                file_types=[".json", ".gz", ".zip"],
                elem_id="job-traces",
            ),
            field="traces",
        )
        button = gr.Button("Analyze the job")
        breakdown = gr.Plot(label="mean step per rank", elem_id="job-breakdown-chart")
        steps = gr.Plot(label="step time per rank", elem_id="job-steps-chart")
        findings = gr.Markdown(label="findings", elem_id="job-findings", latex_delimiters=[])
        per_rank = gr.Dataframe(label="per rank (mean step, µs)", elem_id="job-per-rank", interactive=False)
        collectives = gr.Dataframe(label="collectives (all ranks)", elem_id="job-collectives", interactive=False)
        summary = gr.JSON(label="job summary", elem_id="job-summary")
    button.click(
        analyze_job,
        traces,
        [summary, per_rank, collectives, breakdown, steps, findings],
        api_name="analyze_job",
        concurrency_id="analyze",
        concurrency_limit=2,
    )
