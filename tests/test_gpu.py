"""On a CUDA GPU: the blog's kernel counts. Skipped where there is no CUDA (they never replace a CPU test)."""

import pytest
import torch

from attention import AttentionSpec
from profiling.pipeline import profile_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
BLOG = dict(batch=8, heads=16, seq_len=1024, head_dim=64, dtype="bfloat16", device="cuda")


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    runs = {
        "naive": ("naive", "auto"),
        "inplace": ("inplace", "auto"),
        "math": ("sdpa", "math"),
        "flash": ("sdpa", "flash"),
    }
    return {name: profile_attention(AttentionSpec(variant=v, backend=b, **BLOG), out) for name, (v, b) in runs.items()}


def test_naive_has_one_more_kernel_a_dtod_copy(gpu_runs):
    naive, inplace = gpu_runs["naive"].summary, gpu_runs["inplace"].summary
    assert naive["kernels_per_forward"] == inplace["kernels_per_forward"] + 1
    assert any(name.startswith("Memcpy DtoD") for name in naive["per_forward_kernels"])
    assert naive["forward_device_ms"] > 0 and naive["self_device_total_ms"] > 0


def test_math_many_fused_one(gpu_runs):
    assert gpu_runs["math"].summary["kernels_per_forward"] > gpu_runs["inplace"].summary["kernels_per_forward"]
    assert gpu_runs["flash"].summary["kernels_per_forward"] == 1
    assert gpu_runs["flash"].kernel_table["meaning"].str.contains("FlashAttention").any()


def test_kernel_table_has_launch_shapes(gpu_runs):
    table = gpu_runs["flash"].kernel_table
    assert table["grid"].iloc[0] and table["registers/thread"].iloc[0] > 0


def test_gpu_out_of_memory_is_caught_and_the_next_run_works(tmp_path, monkeypatch):
    import attention.spec
    from profiling.runner import RunError

    monkeypatch.setattr(attention.spec, "available_bytes", lambda device: 2**60)
    huge = AttentionSpec(
        variant="naive", batch=64, heads=64, seq_len=65536, head_dim=64, dtype="bfloat16", device="cuda"
    )
    with pytest.raises(RunError, match="^out of GPU memory"):
        profile_attention(huge, tmp_path)
    monkeypatch.undo()
    assert profile_attention(AttentionSpec(**BLOG), tmp_path).summary["kernels_per_forward"] > 0
