"""The analysis on two threads: the steps measured beside the forwards, then a trace's kernel table and insights beside
the op and window tables. The insights are those found alone, from the same evidence; an error on either thread is the
analysis's error, and no thread outlives it. Then the freed heap goes back to the OS (profiling/heap_trim.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from profiling import analysis as analysis_module
from profiling.analysis import analyze
from profiling.insights import find_insights
from profiling.tables import kernel_table
from profiling.trace import load_trace
from profiling.windows import FORWARD, window_stats
from tests.conftest import DATA

GPU_TRACES = [
    "h100_owlv2_eager-attn",
    "b200_vllm_gpt-oss_eager_rank0",
    "mi300x_sglang_qwen3-8b_decode",
    "h100_nn-mha_fp32",
]


def _records(insights: list) -> list[dict]:
    return [insight.record() for insight in insights]


@pytest.mark.parametrize("name", GPU_TRACES)
def test_insights_found_beside_the_tables_are_those_found_alone(name):
    path = DATA / "gpu" / f"{name}.json.gz"
    analysed = analyze(load_trace(path))
    alone = load_trace(path)  # a fresh trace: nothing cached by the tables
    forwards = window_stats(alone, FORWARD) if analysed.forwards is not None else None
    scope = forwards or window_stats(alone, None)
    backward = window_stats(alone, "attn_bwd") if "attn_bwd" in set(alone.annotations["name"]) else None
    want = find_insights(alone, scope, kernel_table(alone, forwards), None, None, backward)
    assert _records(analysed.insights) == _records(want)
    assert analysed.summary["findings"] == _records(want)
    assert want  # each of these traces teaches something


def test_a_traces_insights_run_on_the_second_thread(monkeypatch):
    threads: list[str] = []

    def found_on(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return find_insights(*args, **kwargs)

    monkeypatch.setattr(analysis_module, "find_insights", found_on)
    analyze(load_trace(DATA / "gpu" / "h100_owlv2_eager-attn.json.gz"))
    assert len(threads) == 1 and threads[0].startswith("analysis") and threads[0] != threading.main_thread().name


def test_an_error_on_the_insights_thread_is_the_analysis_error_and_no_thread_is_left(monkeypatch):
    class RuleFailed(Exception):
        pass

    def failing(*args, **kwargs):
        raise RuleFailed("a rule broke")

    monkeypatch.setattr(analysis_module, "find_insights", failing)
    before = threading.active_count()
    with pytest.raises(RuleFailed, match="a rule broke"):
        analyze(load_trace(DATA / "gpu" / "h100_owlv2_eager-attn.json.gz"))
    assert threading.active_count() == before


def test_a_failing_table_waits_for_the_insights_thread_and_leaves_none(monkeypatch):
    # The tables fail while the insights run: the analysis raises the tables' error once the thread is done.
    finished = threading.Event()

    def slow_insights(*args, **kwargs):
        result = find_insights(*args, **kwargs)
        finished.set()
        return result

    def broken_table(*args, **kwargs):
        raise ValueError("op table broke")

    monkeypatch.setattr(analysis_module, "find_insights", slow_insights)
    monkeypatch.setattr(analysis_module, "op_table_from_trace", broken_table)
    before = threading.active_count()
    with pytest.raises(ValueError, match="op table broke"):
        analyze(load_trace(DATA / "gpu" / "h100_owlv2_eager-attn.json.gz"))
    assert finished.is_set() and threading.active_count() == before


def test_the_heap_freed_on_a_thread_goes_back_to_the_os():
    # 400 MiB of 64 KiB arrays made on a thread, every other one freed: 200 MiB of holes inside its arena, which no
    # trim of the heap's top returns. They stay resident until trimmed; then they go.
    code = """
import threading, numpy as np
from profiling.heap_trim import return_freed_heap
def rss():
    return next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmRSS')) // 1024
kept = []
def churn():
    arrays = [np.ones(8192) for _ in range(6400)]
    kept.extend(arrays[1::2])
    del arrays
thread = threading.Thread(target=churn); thread.start(); thread.join()
before = rss(); released = return_freed_heap(); print(before - rss(), released, len(kept))
"""
    root = Path(__file__).parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    dropped_mib, released, kept = out.stdout.split()
    assert released == "True" and kept == "3200" and int(dropped_mib) >= 150, out.stdout + out.stderr
