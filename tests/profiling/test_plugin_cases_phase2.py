"""The TensorBoard plugin's own unit tests that need what phase 2 of issue 17 plugs in.

- The plugin's step for a trace without ProfilerSteps (`profiling/fallback_step.py`, through
  `step_breakdown.profiler_steps`): test_no_profilerstep and the distributed cases.
- Its launch rule on 2021 traces, by `external id` (`profiling/launches.py`, through
  `tables.launched_device_time` and `tables.launching_ops`): test_external_id, and which op
  launched a kernel in test_gpu_utilization and the group-by-kernel cases.

These fail until those functions are called; they are not marked xfail on purpose. Same traces,
same conventions as test_plugin_cases.py.
"""

from __future__ import annotations

import pytest

from tests.profiling.test_plugin_cases import GEMM, case, costs, kernels, ops


def test_external_id():
    """test_external_id: 0 µs launches at the instant aten::mm starts and ends belong to the op whose
    id they carry, not to whichever op time nesting finds."""
    table = ops(case("external_id"))
    assert table["aten::mat_mul"]["total device (us)"] == 5 + 6 + 7 + 8
    assert table["aten::mat_mul"]["self device (us)"] == 6 + 8
    assert table["aten::mm"]["total device (us)"] == 5 + 7
    assert table["aten::mm"]["self device (us)"] == 5 + 7


def test_no_profilerstep_costs():
    """test_no_profilerstep: all events are one step, from the first op's start to the end of the
    kernel the last op launched."""
    [step] = costs(case("no_profilerstep"))
    kernel, memcpy, memset, _, runtime, dataloader, cpu_op, other, total = step
    assert (kernel, memcpy, memset, runtime, dataloader) == (100, 0, 0, 320 - 310, 0)
    assert cpu_op == 60 + (310 - 300)
    assert other == 300 - (100 + 60)
    assert total == (320 + 100) - 100


def test_gpu_utilization_launching_ops():
    """test_gpu_utilization: gemmSN_TN is aten::mat_mul's (external id 2), though its 0 µs launch
    sits at the instant aten::mm starts."""
    assert kernels(case("gpu_utilization"))[GEMM]["launched by"] == "aten::mat_mul"


@pytest.mark.parametrize("name", ["group_by_kernel_columns", "group_by_kernel_columns_invalid_input"])
def test_group_by_kernel_columns_launching_op(name):
    """test_group_by_kernel_columns(_invalid_input): op1 launched kernel1 (external id 3) from
    another thread than its own."""
    assert kernels(case(name))["kernel1"]["launched by"] == "op1"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("distributed_nccl_worker0", [105, 0, 0, 75, 0, 0, 20, 35, 235]),
        ("distributed_gloo_gpu_worker0", [101, 0, 0, 39, 0, 0, 16, 0, 156]),
        ("distributed_gloo_gpu_worker1", [70, 0, 0, 44, 0, 0, 20, 12, 146]),
        ("distributed_gloo_cpu_worker0", [0, 0, 0, 109, 0, 0, 47, 0, 156]),
        ("distributed_gloo_cpu_worker1", [0, 0, 0, 98, 0, 0, 36, 12, 146]),
    ],
)
def test_distributed_steps_costs(name, expected):
    """test_distributed_nccl / _gloo_gpu / _gloo_cpu: `steps_costs[0].costs` of each worker."""
    assert costs(case(name)) == [expected]


def test_distributed_nccl_worker1_communication():
    """test_distributed_nccl: worker1's communication not overlapped by computation."""
    [step] = costs(case("distributed_nccl_worker1"))
    assert step[3] == 74
