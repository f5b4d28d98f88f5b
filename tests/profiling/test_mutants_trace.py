"""Where a parsed trace says it came from (gaps mutation testing found)."""

from __future__ import annotations

import json

import pytest

from profiling.trace import TraceError, parse_trace

EVENTS = [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]


def test_source_is_kept_and_defaults_to_trace():
    data = json.dumps({"traceEvents": EVENTS}).encode()
    assert parse_trace(data).source == "trace"
    assert parse_trace(data, source="upload.json").source == "upload.json"


def test_limits_reach_the_reader():
    data = json.dumps({"traceEvents": EVENTS * 3}).encode()
    with pytest.raises(TraceError, match=r"more than 2 events \(the cap\)"):
        parse_trace(data, events=2)
    assert len(parse_trace(data, events=3).events) == 3


def test_errors_name_the_source():
    with pytest.raises(TraceError, match=r"upload\.json is JSON but has no `traceEvents`"):
        parse_trace(b'{"a": 1}', source="upload.json")
    with pytest.raises(TraceError, match=r"upload\.json must hold a JSON object or list"):
        parse_trace(b'"text"', source="upload.json")
