"""Property tests: the spec and the trace reader raise nothing but their own clear errors."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attention import AttentionSpec, SpecError
from profiling.analysis import analyze
from profiling.trace import TraceError, parse_trace

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
field_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**7),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.lists(st.integers(), max_size=3),
)
arg_keys = st.sampled_from(
    ["correlation", "grid", "block", "registers per thread", "Input Dims", "Total Allocated", "bytes"]
)
events = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["X", "i", "M", "s", "f", "B"]) | field_values,
        "cat": st.sampled_from(["cpu_op", "kernel", "cuda_runtime", "user_annotation", "gpu_memcpy"]) | field_values,
        "name": st.sampled_from(["aten::clone", "attn_fwd", "ProfilerStep#1", "[memory]", "Memcpy DtoD"])
        | field_values,
        "ts": field_values,
        "dur": field_values,
        "pid": field_values,
        "tid": field_values,
        "args": st.dictionaries(arg_keys, field_values) | field_values,
    },
)
spec_values = st.one_of(st.integers(-5, 10**6), st.floats(), st.text(max_size=6), st.booleans(), st.none())


@FUZZ
@given(
    variant=st.sampled_from(["naive", "sdpa", "flex", "bogus"]) | spec_values,
    backend=st.sampled_from(["auto", "math", "cudnn"]) | spec_values,
    batch=spec_values,
    seq_len=spec_values,
    dtype=st.sampled_from(["float32", "bfloat16", "int8"]) | spec_values,
    device=st.sampled_from(["cpu", "auto", "cuda", "mps"]) | spec_values,
)
def test_spec_raises_only_spec_errors(variant, backend, batch, seq_len, dtype, device):
    try:
        spec = AttentionSpec(variant=variant, backend=backend, batch=batch, seq_len=seq_len, dtype=dtype, device=device)
    except SpecError as exc:
        assert str(exc).startswith(f"{exc.field}: ")
    else:
        assert spec.device in ("cpu", "cuda") and isinstance(spec.batch, int) and spec.estimated_bytes() > 0


@FUZZ
@given(document=json_values)
def test_arbitrary_json_is_a_trace_or_a_trace_error(document):
    try:
        trace = parse_trace(json.dumps(document).encode())
    except TraceError as exc:
        assert str(exc).startswith("trace: ")
    else:
        raw = document if isinstance(document, list) else document["traceEvents"]
        assert len(trace.events) + trace.skipped == len(raw)


@FUZZ
@given(body=st.lists(events, max_size=25), bare=st.booleans())
def test_arbitrary_events_are_analyzed_or_skipped(body, bare):
    trace = parse_trace(json.dumps(body if bare else {"traceEvents": body}).encode())
    assert len(trace.events) + trace.skipped == len(body)
    analysis = analyze(trace)  # tables, windows and every insight rule, on junk
    assert analysis.summary["events"] == len(trace.events)
    assert analysis.summary["kernel_events"] == int((trace.complete["cat"] == "kernel").sum())
