"""Property tests: the spec and the trace reader raise nothing but their own clear errors."""

import gzip
import json
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attention import AttentionSpec, SpecError
from profiling.analysis import analyze
from profiling.reader import MAX_DEPTH
from profiling.trace import CATEGORY_SPELLINGS, NUMERIC_ARGS, OBJECT_ARGS, TraceError, parse_trace
from tests.profiling.test_reader import _same, reference_rows
from tests.timing_slack import slack

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


# --- a structured fuzzer for traces (issue 10) ---------------------------------------------------

MARKUP = [
    '<svg><a href="javascript:alert(1)">x</a></svg>',
    "<img src=https://example.invalid/x.png>",
    "[x](javascript:alert(1))",
    "``` `aten::mm` ```",
    "void cutlass::Kernel<float, 128>(Params)",
    "\u202eevil\u0000nul",
    "n" * 5000,
]
numbers = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -0.0, 5e-324, 1e308, -1e308, 2**53 + 1, 1.5e15, 1623212388426902]),
)
any_value = st.recursive(
    st.none() | st.booleans() | numbers | st.text(max_size=10) | st.sampled_from(MARKUP),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
ARG_KEYS = [*NUMERIC_ARGS, *OBJECT_ARGS, "external id", "Input dims", "Call stack"]
kineto_events = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "i", "M", "s", "f"]) | any_value,
        "cat": st.sampled_from([s for s, _, _ in CATEGORY_SPELLINGS]) | any_value,
        "name": st.sampled_from(["ProfilerStep#3", "aten::mm", "cudaLaunchKernel", *MARKUP]) | any_value,
        "ts": numbers | any_value,
    },
    optional={
        "dur": numbers | any_value,
        "pid": st.integers(-5, 2**31) | st.text(max_size=8) | any_value,
        "tid": st.integers(-5, 2**31) | st.sampled_from(["stream 7", "5555"]) | any_value,
        "args": st.dictionaries(st.sampled_from(ARG_KEYS), numbers | any_value, max_size=6) | any_value,
    },
)


def _deep(levels: int, kind: str) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value} if kind == "objects" else [value]
    return value


@st.composite
def documents(draw: st.DrawFn) -> tuple[Any, int]:
    """A trace document, and how deep its nesting goes (objects and lists opened before the deepest value)."""
    events = draw(st.lists(kineto_events, max_size=20))
    levels = draw(st.sampled_from([0, 0, 5, MAX_DEPTH - 5, MAX_DEPTH + 1, 200]))
    if levels and events:
        events[0] = {**events[0], "args": {"deep": _deep(levels, draw(st.sampled_from(["objects", "lists"])))}}
    metadata = draw(
        st.dictionaries(st.sampled_from(["deviceProperties", "displayTimeUnit", "schemaVersion"]), any_value)
    )
    bare = draw(st.booleans())
    document = events if bare else {**metadata, "traceEvents": events}
    # depth: document, traceEvents array, event, args, the `deep` value's levels
    return document, (levels + (3 if bare else 4) if levels and events else 0)


def _encoded(draw: st.DrawFn, text: bytes) -> bytes:
    kind = draw(st.sampled_from(["plain", "gzip", "gzip-fast", "two members", "padded"]))
    if kind == "gzip":
        return gzip.compress(text, compresslevel=9)
    if kind == "gzip-fast":
        return gzip.compress(text, compresslevel=1)
    if kind == "two members":
        cut = draw(st.integers(0, len(text)))
        return gzip.compress(text[:cut]) + gzip.compress(text[cut:])
    return b"  \n" + text + b"\n  " if kind == "padded" else text


@FUZZ
@given(data=st.data())
def test_structured_traces_read_like_the_reference_or_fail_clearly(data):
    document, depth = data.draw(documents())
    text = json.dumps(document).encode()
    payload = _encoded(data.draw, text)
    start = time.perf_counter()
    try:
        trace = parse_trace(payload)
    except TraceError as exc:
        assert str(exc).startswith("trace: ")
        expected_refusal = depth > MAX_DEPTH or _bad_device_properties(document)
        assert expected_refusal, f"refused a readable trace: {exc}"
        if depth > MAX_DEPTH:
            assert str(exc) == f"trace: nested deeper than {MAX_DEPTH} levels; not a torch.profiler trace"
        return
    assert depth <= MAX_DEPTH and not _bad_device_properties(document)
    expected, skipped = reference_rows(document)
    assert trace.skipped == skipped and len(trace.events) == len(expected)
    for want, have in zip(expected, trace.events.to_dict(orient="records"), strict=True):
        assert all(_same(have[k], want[k]) for k in want), (want, have)
    analysis = analyze(trace)  # every table and insight rule, on whatever was read
    assert analysis.summary["events"] == len(trace.events)
    assert time.perf_counter() - start < slack(30)


def _bad_device_properties(document: Any) -> bool:
    if not isinstance(document, dict) or "deviceProperties" not in document:
        return False
    value = document["deviceProperties"]
    if value is None:
        return False
    if not isinstance(value, list):
        return True
    return any(not isinstance(d, dict) or ("id" in d and type(d["id"]) is not int) for d in value)


@FUZZ
@given(data=st.data())
def test_corrupt_gzip_fails_clearly(data):
    document, _ = data.draw(documents())
    packed = gzip.compress(json.dumps(document).encode())
    cut = data.draw(st.integers(0, len(packed) - 1))
    flip = data.draw(st.integers(0, len(packed) - 1))
    broken = bytearray(packed[:cut] if data.draw(st.booleans()) else packed)
    if broken and flip < len(broken):
        broken[flip] ^= 0xFF
    try:
        parse_trace(bytes(broken))
    except TraceError as exc:
        assert str(exc).startswith("trace: ")
