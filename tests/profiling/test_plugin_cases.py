"""The TensorBoard plugin's own unit tests, replayed: its traces, its asserted numbers.

Each test is one of torch-tb-profiler 0.4.3's `test/test_profiler.py` cases (named in its
docstring), on the same events (tests/data/plugin_cases/, BSD licence beside them). The expected
numbers are the plugin's, written as its test writes them. Where the app deliberately differs, the
test says so and cites docs/plugin-parity.md. Cases that need the plugin's step for a trace
without ProfilerSteps, or its External-id launch rule on 2021 traces, are in
test_plugin_cases_phase2.py.

The plugin's step costs are [Kernel, Memcpy, Memset, Communication, Runtime, DataLoader, CpuOp,
Other, Total] (overall_parser.py); its GPU utilization and SM efficiency are fractions where the
app shows percent; its occupancy is the trace's `est. achieved occupancy %`, as the app's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from profiling import intervals as iv
from profiling.gpu_metrics import gpu_metrics, sm_efficiency_ranges
from profiling.step_breakdown import exclusive_roles, step_breakdown
from profiling.tables import kernel_table, op_table_from_trace
from profiling.trace import Trace, load_trace
from tests.conftest import DATA

CASES = DATA / "plugin_cases"
ROLES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")
CUNN = "void cunn_ClassNLLCriterion_updateGradInput_kernel<float>"
GEMM = "void gemmSN_TN_kernel_64addr"


def case(name: str) -> Trace:
    return load_trace(CASES / f"{name}.json")


def ops(trace: Trace) -> dict[str, dict[str, Any]]:
    """The op table by name: calls, host (cpu) and device times, total and self."""
    return {row["name"]: row for row in op_table_from_trace(trace).to_dict(orient="records")}


def kernels(trace: Trace) -> dict[str, dict[str, Any]]:
    """The kernel table's kernels (not memcpy/memset) by full name."""
    table = kernel_table(trace)
    return {row["name"]: row for row in table[table["kind"] == "kernel"].to_dict(orient="records")}


def costs(trace: Trace) -> list[list[float]]:
    """Each step's costs in the plugin's order, 0 for a role the app leaves out (communication
    is shown only where there is some), Total last."""
    per_step = step_breakdown(trace).per_step
    return [
        [float(row.get(f"{role} (us)", 0.0)) for role in ROLES] + [float(row["step time (us)"])]
        for _, row in per_step.iterrows()
    ]


def assert_times(row: dict[str, Any], count: int, total: float, mean: float, low: float, high: float):
    """A kernel row's calls and total/mean/min/max µs (the plugin's kernel table)."""
    assert (row["count"], row["total (us)"], row["avg (us)"]) == (count, total, pytest.approx(mean))
    assert (row["min (us)"], row["max (us)"]) == (low, high)


def assert_op(row: dict[str, Any], calls: int, host: float, device: float, self_host: float, self_device: float):
    assert row["calls"] == calls
    assert row["total cpu (us)"] == pytest.approx(host)
    assert row["total device (us)"] == pytest.approx(device)
    assert row["self cpu (us)"] == pytest.approx(self_host)
    assert row["self device (us)"] == pytest.approx(self_device)


def test_all_categories():
    """test_all_categories: every role in one step, and the op and kernel tables."""
    trace = case("all_categories")
    [step] = costs(trace)
    kernel, memcpy, memset, _, runtime, dataloader, cpu_op, other, _ = step
    assert (kernel, memcpy, memset, runtime, dataloader, cpu_op, other) == (15, 10, 5, 30, 180, 35, 125)
    table = ops(trace)
    assert len(table) == 2
    assert_op(table["aten::to"], 1, 60, 0, 60, 0)
    assert_op(table["aten::nll_loss_backward"], 1, 70, 30, 70 - 20 - 10 - 5, 30)
    [(name, row)] = kernels(trace).items()
    assert name == CUNN and row["launched by"] == "aten::nll_loss_backward"
    assert_times(row, 1, 15, 15, 15, 15)


@pytest.mark.parametrize("name", ["operator_relation_same_start", "operator_relation_same_end"])
def test_operator_relation(name):
    """test_operator_relation: a child sharing its parent's start, or its end, is still its child."""
    table = ops(case(name))
    assert table["aten::mat_mul"]["self cpu (us)"] == 100 - 70
    assert table["aten::mm"]["self cpu (us)"] == 70


def test_remove_dup_nodes():
    """test_remove_dup_nodes: aten::mm in aten::mm in aten::mm is one op with the innermost's launches."""
    table = ops(case("remove_dup_nodes"))
    assert len(table) == 1
    assert table["aten::mm"]["self device (us)"] == 8
    assert table["aten::mm"]["calls"] == 1


def test_top_level_runtime():
    """test_top_level_runtime: a launch from a thread with no op around it belongs to no op."""
    trace = case("top_level_runtime")
    row = ops(trace)["aten::mm"]
    assert row["total device (us)"] == 0 and row["self device (us)"] == 0
    assert kernels(trace)[GEMM]["count"] == 1


def test_runtime_called_by_profilerstep():
    """test_runtime_called_by_profilerstep: a launch straight from the step is runtime, not an op."""
    trace = case("runtime_called_by_profilerstep")
    [step] = costs(trace)
    assert (step[0], step[4], step[6], step[7]) == (8, 20, 0, 300 - 8 - 20)
    assert ops(trace) == {}  # ProfilerStep is not regarded as an operator
    assert kernels(trace)[GEMM]["count"] == 1 and len(kernels(trace)) == 1


def test_runtime_launch_multiple_kernels():
    """test_runtime_launch_multipe_kernels: one launch, two kernels on two devices, both the op's."""
    trace = case("runtime_launch_multiple_kernels")
    assert ops(trace)["Broadcast"]["total device (us)"] == 120318 + 132800
    [(_, row)] = kernels(trace).items()
    assert row["count"] == 2


def test_no_profilerstep_tables():
    """test_no_profilerstep, its op and kernel tables (its step costs: test_plugin_cases_phase2.py)."""
    trace = case("no_profilerstep")
    table = ops(trace)
    assert len(table) == 2
    assert_op(table["aten::to"], 1, 60, 0, 60, 0)
    assert_op(table["aten::nll_loss_backward"], 1, 70, 100, 70 - 20, 100)
    row = kernels(trace)[CUNN]
    assert row["launched by"] == "aten::nll_loss_backward"
    assert_times(row, 1, 100, 100, 100, 100)


def test_multiple_profilersteps_no_overlap():
    """test_multiple_profilersteps_no_overlap: each step reaches the end of the GPU work it launched."""
    trace = case("multiple_profilersteps_no_overlap")
    first, second = costs(trace)
    assert first == [0, 40, 0, 0, 5, 0, 60 - 5, 200 - 60 - 20, 320 - 100]
    assert second == [200, 0, 0, 0, 5, 0, 50 - 5, 360 - 350, 610 - 350]
    assert step_breakdown(trace).average_step_time_us == ((320 - 100) + (610 - 350)) / 2
    table = ops(trace)
    assert len(table) == 2
    assert_op(table["aten::to"], 1, 60, 40, 60 - 5, 40)
    assert_op(table["aten::mm"], 1, 50, 200, 50 - 5, 200)
    [(name, row)] = kernels(trace).items()
    assert name == CUNN and row["launched by"] == "aten::mm"
    assert_times(row, 1, 200, 200, 200, 200)


def test_self_time():
    """test_self_time: self host time leaves out children and launches; self device, children's kernels."""
    table = ops(case("self_time"))
    assert_op(table["aten::mat_mul"], 1, 100, 20 + 16, 100 - 40 - 25, 16)
    assert_op(table["aten::mm"], 1, 40, 20, 30, 20)


def test_multiple_profilersteps_with_overlap():
    """test_multiple_profilersteps_with_overlap: GPU work running past a step's end starts the next step."""
    first, second = costs(trace := case("multiple_profilersteps_with_overlap"))
    assert first == [0, 100, 0, 0, 5, 0, (200 + 60) - (150 + 90) - 5, 280 - (200 + 60), (280 + 100) - (150 + 90)]
    assert second == [200, 0, 0, 0, 5, 0, (280 + 100) - 360 + (410 - 405), 0, 610 - (280 + 100)]
    assert len(step_breakdown(trace).per_step) == 2


def test_last_steps_no_kernel():
    """test_last_steps_no_kernel: trailing steps that launched nothing leave the overview."""
    [step] = costs(case("last_steps_no_kernel"))
    assert step[-1] == (150 + 180) - (90 + 20)


def test_pure_cpu():
    """test_pure_cpu: without GPU work each step is its host span."""
    first, second = costs(case("pure_cpu"))
    assert first == [0, 0, 0, 0, 0, 0, 10, 200 - 10, 200]
    assert second == [0, 0, 0, 0, 0, 0, 40, 100 - 40, 100]


def test_gpu_utilization():
    """test_gpu_utilization: utilization, est. SM efficiency and occupancy over the span, and the
    kernel table's duration-weighted blocks per SM and occupancy (a 0 µs kernel weighs nothing).

    The span is the plugin's step "0", [100, 220]; the app's span without steps (the whole trace)
    is the same here, so this passes before the fallback step exists."""
    trace = case("gpu_utilization")
    [gpu] = gpu_metrics(trace)["gpus"]
    assert gpu["device"] == 1
    assert gpu["gpu_utilization_percent"] == pytest.approx(100 * (40 + 20) / 120)
    sm = (0.5 * 5 + 1.0 * 5 + 0.6 * 5 + 0.9 * 5 + 0.3 * 20 + 1.0 * 20) / (220 - 100)
    assert gpu["sm_efficiency_percent"] == pytest.approx(100 * sm)
    occupancy = (0.6 * 10 + 0.1 * 15 + 1.0 * 25 + 0.3 * 20) / (10 + 15 + 25 + 20)
    assert gpu["achieved_occupancy_percent"] == pytest.approx(occupancy)
    starts, ends, values = sm_efficiency_ranges(trace.kernels)
    # The plugin's test expects a range (170, 200) of about 0 too: the running sum of blocks per SM
    # leaves a float residue after the last kernel ends (range_utils.merge_ranges_with_value).
    expected = [(130, 135, 0.5), (135, 140, 1.0), (140, 145, 0.6), (145, 150, 0.9), (150, 170, 0.3), (170, 200, 0)]
    expected.append((200, 220, 1.0))
    np.testing.assert_allclose(np.column_stack([starts, ends, values]), expected, atol=1e-9)
    table = kernels(trace)
    assert table[GEMM]["blocks per SM"] == pytest.approx(0.6)
    assert table[GEMM]["achieved occupancy (%)"] == pytest.approx(0.1)
    assert table[CUNN]["blocks per SM"] == pytest.approx((0.5 * 10 + 0.3 * 25 + 10.5 * 20) / (10 + 25 + 20))
    assert table[CUNN]["achieved occupancy (%)"] == pytest.approx((0.6 * 10 + 1.0 * 25 + 0.3 * 20) / (10 + 25 + 20))


def test_gpu_utilization_kernel_out_of_step():
    """test_gpu_utilization_kernel_out_of_step: kernels outside the steps' span count for nothing there."""
    trace = case("gpu_utilization_kernel_out_of_step")
    [gpu] = gpu_metrics(trace)["gpus"]
    assert gpu["gpu_utilization_percent"] == pytest.approx(0.0)
    assert gpu["sm_efficiency_percent"] is None and gpu["achieved_occupancy_percent"] is None
    row = kernels(trace)[CUNN]
    assert row["blocks per SM"] == pytest.approx((20 * 0.5 + 25 * 10.5) / (20 + 25))
    assert row["achieved occupancy (%)"] == pytest.approx((20 * 0.6 + 25 * 0.3) / (20 + 25))


def test_group_by_kernel_columns():
    """test_group_by_kernel_columns: the plugin's three (kernel, op, grid, block, ...) groups, which the
    app's kernel table shows as one row per kernel name (docs/plugin-parity.md)."""
    row = kernels(case("group_by_kernel_columns"))["kernel1"]
    assert row["count"] == 2 + 1 + 1
    assert row["total (us)"] == (15 + 10) + 13 + 17
    assert (row["min (us)"], row["max (us)"]) == (min(15, 10, 13, 17), max(15, 10, 13, 17))


def test_group_by_kernel_columns_invalid_input():
    """test_group_by_kernel_columns_invalid_input: kernels missing grid, block, registers or shared
    memory are still counted."""
    row = kernels(case("group_by_kernel_columns_invalid_input"))["kernel1"]
    assert (row["count"], row["total (us)"], row["min (us)"], row["max (us)"]) == (5, 1 + 2 + 3 + 4 + 5, 1, 5)


def test_tensor_core():
    """test_tensor_core: the tensor-core share of kernel time, and which op launched each kernel.

    `kernel_no_tc` is "unknown" in the app where the plugin's allow-list says no: the app names
    tensor-core kernels by decoding the name and says unknown where the name tells nothing
    (docs/plugin-parity.md)."""
    trace = case("tensor_core")
    volta = "volta_fp16_s884cudnn_fp16_128x128_ldg8_splitK_relu_f2f_exp_small_nhwc_tn_v1"
    table = kernels(trace)
    assert table[volta]["tensor cores"] == "yes" and table[volta]["launched by"] == "aten::cudnn_convolution"
    assert table["kernel_no_tc"]["tensor cores"] == "unknown" and table["kernel_no_tc"]["launched by"] == "op_no_tc"
    [gpu] = gpu_metrics(trace)["gpus"]
    assert gpu["tensor_core_time_percent"] == pytest.approx(100 * 15 / (15 + 10))


def test_datapipe():
    """test_datapipe: `enumerate(DataPipe)#...` is DataLoader time, [100, 123], and no operator."""
    trace = case("datapipe")
    starts, ends = exclusive_roles(trace)["dataloader"]
    assert list(zip(starts, ends, strict=True)) == [(100, 123)]
    assert ops(trace) == {}


def test_distributed_nccl_user_annotation_has_communication():
    """test_distributed_nccl_user_annotation_has_communication: an `nccl:all_reduce` recorded as a
    user annotation is communication (pytorch/kineto#640)."""
    communication = exclusive_roles(case("distributed_nccl_user_annotation"))["communication"]
    assert iv.total(communication) == 71


def test_every_case_file_is_replayed_here_or_in_phase2():
    # A new file under tests/data/plugin_cases/ must be asserted on somewhere.
    here = Path(__file__).read_text()
    phase2 = (Path(__file__).parent / "test_plugin_cases_phase2.py").read_text()
    names = sorted(p.stem for p in CASES.glob("*.json"))
    missing = [n for n in names if f'"{n}"' not in here and f'"{n}"' not in phase2]
    assert not missing and len(names) == 27


def test_costs_add_up_to_each_step():
    # The plugin's Other is what the roles leave of the step: the roles and Other fill it exactly.
    for path in sorted(CASES.glob("*.json")):
        for step in costs(load_trace(path)):
            assert sum(step[:-1]) == pytest.approx(step[-1]), path.name


def test_the_replayed_traces_are_the_plugins_2021_spellings():
    # Most cases use `Operator`/`Runtime`/`Kernel`; the app reads them as today's categories.
    trace = case("all_categories")
    assert trace.kineto_2021
    assert set(pd.unique(trace.events["cat"])) == {
        "cpu_op",
        "user_annotation",
        "gpu_memcpy",
        "gpu_memset",
        "kernel",
        "cuda_runtime",
    }
