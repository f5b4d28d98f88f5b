"""Each insight rule, on a real run or a real trace."""

from collections import defaultdict

from profiling.analysis import analyze_file
from profiling.insights import RULES, Evidence
from profiling.insights.copies import hidden_copy
from profiling.trace import load_trace
from profiling.windows import window_stats
from tests.conftest import DATA
from tests.profiling.test_copy_causes import Plain, plain_cause


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


def _plain_memcpy_cause(plain: Plain, memcpy: dict) -> str:
    """A memcpy's cause read by hand: from the outermost copy op that launched it, else from its launching op."""
    around = plain.launched_under(memcpy)
    copy_ops = [a for a in around if a["cat"] == "cpu_op" and a["name"] in ("aten::clone", "aten::copy_")]
    return plain_cause(plain.path(copy_ops[-1]) if copy_ops else around)


def test_gpu_memcpy_dtod_is_a_hidden_copy():
    path = DATA / "sampled_training_rank0.json.gz"
    trace = load_trace(path)
    found = hidden_copy(Evidence(trace, window_stats(trace, None), trace.kernels))
    plain = Plain(path)
    dtod = [g for g in plain.gpu if g["cat"] == "gpu_memcpy" and g["name"].startswith("Memcpy DtoD")]
    per_cause: dict[str, list[int]] = defaultdict(list)
    for g in dtod:
        per_cause[_plain_memcpy_cause(plain, g)].append(g["args"]["bytes"])
    assert len(dtod) == 8 and len(per_cause) > 1  # each DtoD blamed on its own cause, not one "Memcpy DtoD"
    for cause, sizes in per_cause.items():
        group = found.evidence["causes"][cause]
        assert group["copy"].startswith("Memcpy DtoD"), cause
        assert (group["count"], group["bytes"]) == (len(sizes), sum(sizes)), cause
    # The copies are real but small: under 1% of GPU time, so find_insights drops the finding.
    gpu_total = sum(g["dur"] for g in plain.gpu)
    assert 100 * sum(g["dur"] for g in dtod) / gpu_total <= found.gpu_time_percent < 1
    assert "hidden_copy" not in rules(analyze_file(path))


def test_sgemm_is_flagged_as_no_tensor_cores():
    insight = rules(analyze_file(DATA / "a100_simple_add.json.gz"))["fp32_upcast"]
    assert "ampere_sgemm_32x32_sliced1x4_tn" in insight.evidence["kernels"]


def test_a_driver_launched_zero_occupancy_is_blamed_on_its_grid_not_the_launch():
    # Kineto's estimate is min(blocks the calculator fits, grid / SMs): one block on a whole GPU rounds to 0%.
    insight = rules(analyze_file(DATA / "triton_driver_launch.json.gz"))["occupancy"]
    assert "the cause is the grid" in insight.text and "driver" not in insight.text.lower()
    assert insight.evidence["tiny_grid"]["kernels"][0]["grid_blocks"] == 1


def test_device_idle_gaps_on_a_whole_trace():
    insight = rules(analyze_file(DATA / "a100_simple_add.json.gz"))["overhead_bound"]
    assert insight.evidence["gap_ms"] > 0 and insight.evidence["busy_ms"] > 0


def test_no_kernels_is_said_plainly():
    insight = rules(analyze_file(DATA / "cupti_counters_no_kernels.json.gz"))["no_kernels"]
    assert insight.evidence["launch_calls"] > 1000 and "No kernels recorded" in insight.text
    assert "no_kernels" not in rules(analyze_file(DATA / "cpu_only.json.gz"))
