"""The reader on real GPU traces, and on every kind of bad upload."""

import gzip
import json

import pandas as pd
import pytest

from profiling.step_breakdown import step_breakdown
from profiling.tables import kernel_table, op_table_from_trace
from profiling.trace import LAUNCH_CATEGORIES, TraceError, load_trace, parse_trace
from tests.conftest import DATA, GPU_TRACES


def _raw(name):
    return json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))


@pytest.mark.parametrize("name", GPU_TRACES)
def test_kernel_table_counts_and_time_match_the_events(name):
    raw = [e for e in _raw(name)["traceEvents"] if e.get("ph") == "X"]
    trace = load_trace(DATA / f"{name}.json.gz")
    table = kernel_table(trace)
    for cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        events = [e for e in raw if e.get("cat") == cat]
        rows = table[table["kind"] == cat]
        assert rows["count"].sum() == len(events)
        assert rows["total (us)"].sum() == pytest.approx(sum(e["dur"] for e in events))


def test_a100_kernel_args_are_lifted():
    trace = load_trace(DATA / "a100_simple_add.json.gz")
    kernel = trace.kernels.dropna(subset=["registers"]).iloc[0]
    assert kernel["grid"] and kernel["block"] and kernel["occupancy"] >= 0
    assert trace.devices == ["NVIDIA A100-PG509-200"]
    assert trace.device_properties[0]["regsPerMultiprocessor"] == 65536


def test_no_kernels_trace_is_empty_but_keeps_its_schema():
    table = kernel_table(load_trace(DATA / "cupti_counters_no_kernels.json.gz"))
    assert table.empty and "registers/thread" in table.columns


def test_cpu_only_trace():
    trace = load_trace(DATA / "cpu_only.json.gz")
    assert trace.devices == ["cpu"] and trace.kernels.empty and len(trace.events) == 30


def test_bare_list_and_plain_json(tmp_path):
    events = _raw("triton_driver_launch")["traceEvents"]
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(events))
    assert len(load_trace(path).kernels) == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "is not valid JSON"),
        (b'{"foo": 1}', "has no `traceEvents`"),
        (b'{"traceEvents": {"a": 1}}', "`traceEvents` must be a list"),
        (b'"a string"', "must hold a JSON object or list"),
    ],
)
def test_bad_documents(data, message):
    with pytest.raises(TraceError, match=message):
        parse_trace(data)


def test_bad_events_are_skipped_and_counted():
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 2},  # wrong type
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": -1},  # negative duration
        {"ph": "X", "cat": "kernel", "ts": 5, "dur": 1},  # no name
        {"ph": "X", "cat": "kernel", "name": "k", "ts": True, "dur": 1},  # a bool is not a time
        42,
        ["not", "an", "event"],
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 3, "dur": 1, "args": "junk"},
    ]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    assert len(trace.events) == 2 and trace.skipped == 6
    assert trace.kernels["dur"].sum() == 3


def test_truncated_gzip(tmp_path):
    path = tmp_path / "cut.json.gz"
    path.write_bytes((DATA / "a100_simple_add.json.gz").read_bytes()[:5000])
    with pytest.raises(TraceError, match="truncated"):
        load_trace(path)


def test_corrupt_gzip(tmp_path):
    data = bytearray((DATA / "a100_simple_add.json.gz").read_bytes())
    data[100:200] = b"\x00" * 100
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="corrupt|truncated|not valid JSON"):
        load_trace(path)


def test_gzip_bomb_stops_at_the_limit(tmp_path):
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        event = b'{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1, "args": {"Bytes": 4}},'
        f.write(b'{"traceEvents": [' + event * (64 * 1024**2 // len(event)))  # 64 MiB, ~200 KiB on disk
    assert path.stat().st_size < 400_000
    with pytest.raises(TraceError, match=r"inflates to more than 8 MiB of JSON \(the limit\)"):
        load_trace(path, inflated_bytes=8 * 1024**2)


def test_file_over_the_size_limit(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 2048)
    with pytest.raises(TraceError, match=r"the file is 2,048 bytes; the limit is 1,024 bytes"):
        load_trace(path, upload_bytes=1024)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "nope.json")


# --- other accelerators' launch categories, DataPipe, the 2021 spellings (issue 17) -------------------

VINTAGES = DATA / "vintages"
# Restated here, not imported: Kineto's ActivityType names of other accelerators' host-side calls,
# and the CUDA category each stands for.
ACCELERATOR_LAUNCHES = {
    "mtia_runtime": "cuda_runtime",
    "xpu_runtime": "cuda_runtime",
    "xpu_driver": "cuda_driver",
    "privateuse1_runtime": "cuda_runtime",
    "privateuse1_driver": "cuda_driver",
}
ACCELERATOR_TRACES = ("mtia_runtime.json", "xpu_runtime_driver.json", "privateuse1_runtime_driver.json")


def _as_cuda(document: dict) -> bytes:
    """The same trace with CUDA's launch categories, and DataPipe's range as an annotation."""
    events = []
    for e in document["traceEvents"]:
        e = dict(e, cat=ACCELERATOR_LAUNCHES.get(e.get("cat"), e.get("cat")))
        if e["name"].startswith("enumerate(DataPipe)#"):
            e["cat"] = "user_annotation"
        events.append(e)
    return json.dumps({**document, "traceEvents": events}).encode()


@pytest.mark.parametrize("name", ACCELERATOR_TRACES)
def test_other_accelerators_launch_categories_read_as_cudas(name):
    document = json.loads((VINTAGES / name).read_text())
    trace = load_trace(VINTAGES / name)
    pd.testing.assert_frame_equal(trace.events, parse_trace(_as_cuda(document)).events)
    launches = [e for e in document["traceEvents"] if e["cat"] in ACCELERATOR_LAUNCHES]
    assert len(trace.of_category(*LAUNCH_CATEGORIES)) == len(launches) > 0


def _role_cells(document: dict) -> dict[str, int]:
    """µs of the one step's span per role, each µs to the first role busy then (the plugin's
    ProfileRole order), by counting whole-µs cells of the raw events: the plain route."""
    events = [e for e in document["traceEvents"] if e.get("ph") == "X"]
    step = next(e for e in events if e["name"].startswith("ProfilerStep#"))
    roles = {
        "kernel": lambda e: e["cat"] == "kernel",
        "memcpy": lambda e: e["cat"] == "gpu_memcpy",
        "runtime": lambda e: e["cat"] in ACCELERATOR_LAUNCHES or e["cat"] in ("cuda_runtime", "cuda_driver"),
        "dataloader": lambda e: e["name"].startswith("enumerate(DataPipe)#"),
        "cpu_exec": lambda e: e["cat"] in ("cpu_op", "user_annotation") and e is not step,
    }
    taken: set[int] = set()
    cells = {}
    for role, plays in roles.items():
        busy = {t for e in events if plays(e) for t in range(e["ts"], e["ts"] + e["dur"])}
        mine = {t for t in busy - taken if step["ts"] <= t < step["ts"] + step["dur"]}
        cells[role] = len(mine)
        taken |= busy
    cells["other"] = step["dur"] - sum(cells.values())
    return cells


@pytest.mark.parametrize("name", ACCELERATOR_TRACES)
def test_an_mtia_xpu_or_privateuse1_step_is_not_all_cpu_exec(name):
    expected = _role_cells(json.loads((VINTAGES / name).read_text()))
    per_step = step_breakdown(load_trace(VINTAGES / name)).per_step
    assert len(per_step) == 1
    row = per_step.iloc[0]
    assert expected["runtime"] > 0 and row["runtime (us)"] == expected["runtime"]
    for role, us in expected.items():
        assert row.get(f"{role} (us)", 0.0) == pytest.approx(us), role


def test_a_datapipe_range_is_dataloader_time_and_not_an_op():
    # The plugin's TestDataPipe: `enumerate(DataPipe)#...`, recorded as a cpu_op, is DataLoader time
    # and never an operator (node.py, create_operator_node / is_operator_node).
    trace = load_trace(VINTAGES / "mtia_runtime.json")
    pipe = trace.events[trace.events["name"].str.startswith("enumerate(DataPipe)#")]
    assert list(pipe["cat"]) == ["user_annotation"]
    table = op_table_from_trace(trace)
    assert list(table["name"]) == ["aten::linear"]
    assert step_breakdown(trace).per_step.iloc[0]["dataloader (us)"] == 20


@pytest.mark.parametrize(
    ("path", "old"),
    [
        (VINTAGES / "kineto_2021.json", True),
        (VINTAGES / "kineto_2024.json", False),
        (VINTAGES / "driver_1x_style.json", False),  # `Driver` alone: never written by Kineto 2021
        (DATA / "a100_simple_add.json.gz", False),
        (VINTAGES / "mtia_runtime.json", False),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_the_2021_spellings_are_recognised_as_written(path, old):
    assert load_trace(path).kineto_2021 is old


def test_one_2021_spelling_among_new_ones_marks_the_trace_old():
    # The plugin's own distributed tests mix `cpu_op` with `Kernel`.
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "nccl:broadcast", "ts": 0, "dur": 75, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "Kernel", "name": "ncclKernel", "ts": 16, "dur": 16, "pid": 0, "tid": 7},
    ]
    trace = parse_trace(json.dumps(events).encode())
    assert trace.kineto_2021 and trace.spellings == {"cpu_op", "Kernel"}


@pytest.mark.parametrize(
    ("cats", "old"),
    [(["Operator", "Python"], True), (["cpu_op", "python_function"], False), (["Python", "python_function"], False)],
)
def test_python_events_spelled_the_2021_way(cats, old):
    events = [{"ph": "X", "cat": c, "name": f"e{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1} for i, c in enumerate(cats)]
    assert parse_trace(json.dumps(events).encode()).python_spelled_2021 is old
    assert load_trace(VINTAGES / "kineto_2021.json").python_spelled_2021


def test_complete_rows_are_the_duration_events_alone():
    # Instants, begin/end pairs, flows and counters are kept as events but are not complete: `complete_rows`
    # is the "X" events, in file order, as a plain loop over the JSON finds them.
    base = {"cat": "cpu_op", "pid": 1, "tid": 1}
    events = [
        base | {"ph": "X", "name": "op", "ts": 0, "dur": 10},
        base | {"ph": "i", "s": "t", "name": "instant", "ts": 1},
        base | {"ph": "B", "name": "begun", "ts": 2},
        base | {"ph": "E", "name": "begun", "ts": 3},
        base | {"ph": "s", "cat": "ac2g", "name": "flow", "id": 1, "ts": 4},
        base | {"ph": "f", "cat": "ac2g", "name": "flow", "id": 1, "ts": 5, "bp": "e"},
        base | {"ph": "C", "name": "counter", "ts": 6, "args": {"bytes": 1}},
        base | {"ph": "X", "name": "later op", "ts": 20, "dur": 1},
    ]
    trace = parse_trace(json.dumps(events).encode())
    assert len(trace.events) == len(events)
    want = [e["name"] for e in events if e["ph"] == "X"]
    assert trace.events["name"].iloc[trace.complete_rows].tolist() == want
