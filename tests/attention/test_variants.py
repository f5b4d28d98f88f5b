"""Every variant and CPU backend matches float64 attention."""

import pytest
import torch

import attention
from attention import ATTENTION_FUNCTIONS, VARIANTS, AttentionSpec

CPU_RUNS = [
    ("naive", "auto"),
    ("inplace", "auto"),
    ("sdpa", "auto"),
    ("sdpa", "math"),
    ("sdpa", "flash"),
    ("flex", "auto"),
]
GPU_ONLY = {"hub_flash"}  # tested through its support predicate on CPU
TOLERANCE = {"float32": dict(atol=1e-5, rtol=1e-4), "bfloat16": dict(atol=3e-2, rtol=3e-2)}


def test_registry_covers_every_variant():
    assert set(ATTENTION_FUNCTIONS) == set(VARIANTS)
    assert {v for v, _ in CPU_RUNS} | GPU_ONLY == set(VARIANTS)  # every variant is tested somewhere


@pytest.mark.parametrize("seq_len", [64, 100])  # 100: not a power of two
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("variant", "backend"), CPU_RUNS)
def test_matches_float64_reference(variant, backend, dtype, seq_len):
    spec = AttentionSpec(
        variant=variant, backend=backend, batch=2, heads=3, seq_len=seq_len, head_dim=32, dtype=dtype, device="cpu"
    )
    q, k, v = attention.make_inputs(spec)
    out = attention.build(spec)(q, k, v, mask=attention.causal_mask(seq_len, "cpu"), backend=backend)
    assert out.shape == (2, 3, seq_len, 32)
    assert out.dtype == spec.torch_dtype
    torch.testing.assert_close(out.double(), attention.reference_attention(q, k, v), **TOLERANCE[dtype])


def test_causal_mask_hides_the_future():
    mask = attention.causal_mask(4, "cpu")
    assert mask.tolist() == [
        [False, True, True, True],
        [False, False, True, True],
        [False, False, False, True],
        [False] * 4,
    ]


def test_first_query_sees_only_itself():
    spec = AttentionSpec(variant="naive", seq_len=8, head_dim=4, heads=1, device="cpu")
    q, k, v = attention.make_inputs(spec)
    out = attention.build(spec)(q, k, v, mask=attention.causal_mask(8, "cpu"))
    torch.testing.assert_close(out[..., 0, :], v[..., 0, :])


def test_inputs_are_seeded():
    spec = AttentionSpec(device="cpu", seq_len=16)
    first, second = attention.make_inputs(spec), attention.make_inputs(spec)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert not torch.equal(attention.make_inputs(spec, seed=1)[0], first[0])


def test_naive_and_inplace_differ_by_one_line():
    from pathlib import Path

    root = Path(attention.__file__).parent
    naive = (root / "naive.py").read_text().splitlines()
    inplace = (root / "inplace.py").read_text().splitlines()
    body = [(a, b) for a, b in zip(naive, inplace, strict=True) if a != b and not a.startswith(('"""', "def "))]
    assert body == [
        (
            '    scores = scores.masked_fill(mask, float("-inf"))  # [batch, heads, seq, seq]',
            '    scores.masked_fill_(mask, float("-inf"))  # [batch, heads, seq, seq]',
        )
    ]


def test_reference_in_query_blocks_matches_one_block(monkeypatch):
    spec = AttentionSpec(batch=2, heads=2, seq_len=300, head_dim=16, device="cpu")
    q, k, v = attention.make_inputs(spec)
    whole = attention.reference_attention(q, k, v)
    monkeypatch.setattr(attention, "REFERENCE_BLOCK_BYTES", 2 * 2 * 300 * 8 * 7)  # 7 query rows per block
    torch.testing.assert_close(attention.reference_attention(q, k, v), whole, atol=1e-12, rtol=0)
