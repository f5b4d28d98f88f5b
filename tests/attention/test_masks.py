"""Masks, the float64 reference and flex's block sparsity against plain loops over (query, key) positions."""

import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

import attention
from attention import AttentionSpec, block_sparsity, masks, reference_attention

MASK_CASES = [
    dict(),
    dict(q_len=1),
    dict(q_len=4),
    dict(q_len=4, mask="causal_top_left"),
    dict(mask="none", q_len=3),
    dict(mask="sliding_window", window=3),
    dict(mask="sliding_window", window=2, q_len=5),
    dict(mask="padding", valid_len="7,3"),
    dict(mask="padding", valid_len="2,6", q_len=4),
]


def _sees(spec: AttentionSpec, b: int, i: int, j: int) -> bool:
    """Does query i of batch row b see key j? The issue's definitions, written out."""
    p = i if spec.mask == "causal_top_left" else i + spec.seq_len - spec.q_len
    if spec.mask == "none":
        return True
    if spec.mask == "sliding_window":
        return p - spec.window < j <= p
    if spec.mask == "padding":
        return j <= p and j < spec.valid_len[b]
    return j <= p


def _loop_attention(spec, q, k, v):
    """Softmax attention with Python floats, one (batch, head, query) at a time."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    groups = spec.heads // spec.kv_heads
    for b in range(spec.batch):
        for h in range(spec.heads):
            for i in range(spec.q_len):
                keys = [j for j in range(spec.seq_len) if _sees(spec, b, i, j)]
                logits = [
                    sum(q[b, h, i, d].item() * k[b, h // groups, j, d].item() for d in range(spec.head_dim))
                    / math.sqrt(spec.head_dim)
                    for j in keys
                ]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                for w, j in zip(weights, keys, strict=True):
                    out[b, h, i] += w / sum(weights) * v[b, h // groups, j].double()
    return out


@pytest.mark.parametrize("changes", MASK_CASES)
@pytest.mark.parametrize("kv_heads", [0, 1])
def test_reference_matches_a_plain_loop(changes, kv_heads):
    spec = AttentionSpec(batch=2, heads=2, kv_heads=kv_heads, seq_len=7, head_dim=3, device="cpu", **changes)
    q, k, v = attention.make_inputs(spec)
    expected = _loop_attention(spec, q, k, v)
    torch.testing.assert_close(reference_attention(spec, q, k, v).output, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("changes", MASK_CASES)
def test_dense_mask_and_pair_count_match_the_loop(changes):
    spec = AttentionSpec(batch=2, heads=1, seq_len=7, device="cpu", **changes)
    dense = masks.visible(spec)
    pairs = 0
    for b in range(spec.batch):
        row = dense[b, 0] if spec.mask == "padding" else (dense if dense is not None else None)
        for i in range(spec.q_len):
            for j in range(spec.seq_len):
                sees = _sees(spec, b, i, j)
                pairs += sees
                assert row is None or bool(row[i, j]) == sees, (b, i, j)
    assert masks.visible_pairs(spec) == pairs
    hidden = masks.hidden(spec)
    assert (hidden is None) == (dense is None)
    if hidden is not None:
        assert torch.equal(hidden, ~dense)


def test_top_left_alignment_hides_keys_from_decode():
    decode = AttentionSpec(seq_len=6, q_len=1, heads=1, device="cpu")
    assert masks.visible(decode).tolist() == [[True] * 6]  # bottom right: the last query sees every key
    assert masks.visible(decode.replace(mask="causal_top_left")).tolist() == [[True] + [False] * 5]


def test_reference_in_query_blocks_matches_one_block(monkeypatch):
    spec = AttentionSpec(batch=2, heads=2, seq_len=300, q_len=100, head_dim=16, mode="training", device="cpu")
    q, k, v = attention.make_inputs(spec)
    grad_out = attention.upstream_gradient(spec)
    whole = reference_attention(spec, q, k, v, grad_out)
    monkeypatch.setattr(attention.reference, "REFERENCE_BLOCK_BYTES", 2 * 2 * 300 * 8 * 7)  # 7 query rows per block
    assert attention.reference.block_rows(spec) == 7
    blocked = reference_attention(spec, q, k, v, grad_out)
    torch.testing.assert_close(blocked.output, whole.output, atol=1e-12, rtol=0)
    for mine, one_block in zip(blocked.grads, whole.grads, strict=True):
        torch.testing.assert_close(mine, one_block, atol=1e-12, rtol=0)


def test_reference_gradients_match_autograd_on_the_loop():
    spec = AttentionSpec(
        batch=1,
        heads=2,
        kv_heads=1,
        seq_len=5,
        q_len=3,
        head_dim=2,
        mode="training",
        mask="sliding_window",
        window=2,
        device="cpu",
    )
    q, k, v = attention.make_inputs(spec)
    grad_out = attention.upstream_gradient(spec)
    ref = reference_attention(spec, q, k, v, grad_out)
    # Central differences of <out, grad_out> on the loop attention, one input element at a time.
    for tensor, grad in zip((q, k, v), ref.grads, strict=True):
        flat = tensor.detach().view(-1)
        for index in range(flat.numel()):
            saved = flat[index].item()
            values = []
            for step in (1e-4, -1e-4):
                flat[index] = saved + step
                values.append((_loop_attention(spec, q, k, v) * grad_out.double()).sum().item())
            flat[index] = saved
            assert grad.view(-1)[index].item() == pytest.approx((values[0] - values[1]) / 2e-4, abs=1e-3)


def _tile_sparsity(spec: AttentionSpec, block: int) -> float:
    rows = spec.batch if spec.mask == "padding" else 1
    empty = total = 0
    for b in range(rows):
        for q0 in range(0, spec.q_len, block):
            for k0 in range(0, spec.seq_len, block):
                total += 1
                empty += not any(
                    _sees(spec, b, i, j)
                    for i in range(q0, min(q0 + block, spec.q_len))
                    for j in range(k0, min(k0 + block, spec.seq_len))
                )
    return empty / total


@pytest.mark.parametrize(
    "changes",
    [
        dict(seq_len=50),
        dict(seq_len=47, q_len=13),
        dict(seq_len=50, mask="causal_top_left", q_len=20),
        dict(seq_len=50, mask="none"),
        dict(seq_len=45, mask="sliding_window", window=9),
        dict(seq_len=45, mask="sliding_window", window=1, q_len=30),
        dict(seq_len=50, mask="padding", valid_len="10,41", q_len=33),
    ],
)
def test_block_sparsity_matches_a_tile_loop(changes):
    spec = AttentionSpec(batch=2, device="cpu", **changes)
    assert block_sparsity(spec, block_size=8) == pytest.approx(_tile_sparsity(spec, 8))


@pytest.mark.parametrize(
    "changes", [dict(), dict(mask="sliding_window", window=128), dict(mask="padding", valid_len="100,300")]
)
def test_block_sparsity_agrees_with_torch_where_torch_is_right(changes):
    # With lengths that are multiples of the block size, BlockMask.sparsity() is correct.
    spec = AttentionSpec(batch=2, seq_len=512, device="cpu", **changes)
    torch_mask = create_block_mask(
        masks.mask_mod(spec), B=2 if spec.mask == "padding" else None, H=None, Q_LEN=512, KV_LEN=512, device="cpu"
    )
    assert block_sparsity(spec) == pytest.approx(torch_mask.sparsity() / 100)
