"""Each insight rule, on a real run or a real trace."""

from profiling.analysis import analyze_file
from profiling.insights import RULES
from tests.conftest import DATA


def rules(result):
    return {i.rule: i for i in result.insights}


def test_rules_are_data_with_unique_names():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)) and all(r.applies_to for r in RULES)


def test_naive_names_the_hidden_copy_and_its_fix(cpu_runs):
    insight = rules(cpu_runs["naive"])["hidden_copy"]
    assert "aten::masked_fill" in insight.text and "masked_fill_" in insight.text
    assert insight.evidence["bytes_per_forward"] == 1 * 4 * 256 * 256 * 4
    assert "hidden_copy" not in rules(cpu_runs["inplace"])


def test_math_names_the_mask_and_the_safe_softmax(cpu_runs):
    found = rules(cpu_runs["math"])
    assert "is_causal did not remove the work, it moved it" in found["mask_rebuilt"].text
    assert "aten::tril" in found["mask_rebuilt"].evidence["ops_per_forward"]
    assert "NaN" in found["safe_softmax"].text
    assert "fp32_upcast" not in found  # float32 inputs have nothing to upcast


def test_bf16_math_shows_the_upcast(cpu_runs):
    upcast = rules(cpu_runs["math-bf16"])["fp32_upcast"]
    assert upcast.evidence["per_forward"] == 3  # q, k and v
    assert "BFloat16" in upcast.text


def test_fused_names_the_kernel(cpu_runs):
    fused = rules(cpu_runs["flash"])["fused_attention"]
    assert "_scaled_dot_product_flash_attention_for_cpu" in fused.text
    assert "fused_attention" not in rules(cpu_runs["naive"])


def test_gpu_memcpy_dtod_is_a_hidden_copy():
    insight = rules(analyze_file(DATA / "sampled_training_rank0.json.gz"))["hidden_copy"]
    assert insight.evidence["kernel"] == "Memcpy DtoD" and insight.evidence["per_forward"] == 8
    assert insight.evidence["bytes_per_forward"] > 0


def test_sgemm_is_flagged_as_no_tensor_cores():
    insight = rules(analyze_file(DATA / "a100_simple_add.json.gz"))["fp32_upcast"]
    assert "ampere_sgemm_32x32_sliced1x4_tn" in insight.evidence["kernels"]


def test_driver_launch_zero_occupancy_is_a_measurement_gap():
    insight = rules(analyze_file(DATA / "triton_driver_launch.json.gz"))["occupancy"]
    assert "measurement gap, not a stall" in insight.text
    assert insight.evidence["kernels"][0]["driver_launch"] is True


def test_device_idle_gaps_on_a_whole_trace():
    insight = rules(analyze_file(DATA / "a100_simple_add.json.gz"))["overhead_bound"]
    assert insight.evidence["gap_ms"] > 0 and insight.evidence["busy_ms"] > 0


def test_no_kernels_is_said_plainly():
    insight = rules(analyze_file(DATA / "cupti_counters_no_kernels.json.gz"))["no_kernels"]
    assert insight.evidence["launch_calls"] > 1000 and "No kernels recorded" in insight.text
    assert "no_kernels" not in rules(analyze_file(DATA / "cpu_only.json.gz"))
