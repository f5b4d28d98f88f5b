"""Every variant x mode x kv_heads x q_len x mask it supports matches the float64 reference; the rest is refused."""

import itertools
from pathlib import Path

import pytest
import torch

import attention
from attention import RUNS, VARIANTS, AttentionSpec, SpecError, refusal

CPU_RUNS = [("naive", "auto"), ("inplace", "auto"), ("sdpa", "auto"), ("sdpa", "math"), ("sdpa", "flash"),
            ("flex", "auto")]  # fmt: skip
GPU_ONLY = {"hub_flash"}  # its refusals are tested on CPU, its numbers by the GPU check
TOLERANCE = {"float32": dict(atol=2e-5, rtol=1e-4), "bfloat16": dict(atol=3e-2, rtol=3e-2)}
MASKS = [
    dict(mask="causal"),
    dict(mask="causal_top_left"),
    dict(mask="none"),
    dict(mask="sliding_window", window=5),
    dict(mask="padding", valid_len="37,20"),
]
GRID = list(itertools.product(CPU_RUNS, ["inference", "training"], [0, 2, 1], [0, 1, 13], range(len(MASKS))))


def _spec(variant, backend, **changes):
    shape = dict(batch=2, heads=4, seq_len=37, head_dim=16)  # 37: not a power of two
    return AttentionSpec(variant=variant, backend=backend, device="cpu", **{**shape, **changes})


def _check(spec: AttentionSpec, dtype_tolerance: dict) -> None:
    prepared = attention.prepare(spec)
    out = prepared()
    assert out.shape == (spec.batch, spec.heads, spec.q_len, spec.head_dim)
    assert out.dtype == spec.torch_dtype
    reference = prepared.reference()
    torch.testing.assert_close(out.double(), reference.output, **dtype_tolerance)
    if spec.training:
        prepared.backward(out)
        grads = (prepared.query.grad, prepared.key.grad, prepared.value.grad)
        for grad, expected in zip(grads, reference.grads, strict=True):
            torch.testing.assert_close(grad.double(), expected, **dtype_tolerance)


def test_every_variant_is_tested_somewhere():
    assert {v for v, _ in CPU_RUNS} | GPU_ONLY == set(VARIANTS)
    assert {v for v, _ in RUNS} == set(VARIANTS)


@pytest.mark.parametrize(("run", "mode", "kv_heads", "q_len", "mask"), GRID)
def test_matches_float64_reference_or_is_refused(run, mode, kv_heads, q_len, mask):
    spec = _spec(*run, mode=mode, kv_heads=kv_heads, q_len=q_len, **MASKS[mask])
    refused = refusal(spec)
    if refused:
        # Refused, never computed wrongly: and the refusal is real, torch cannot do it either.
        assert refused[0] == "mode" and spec.variant == "flex" and spec.training
        with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
            attention.prepare(spec)()
        return
    with torch.no_grad() if not spec.training else torch.enable_grad():
        _check(spec, TOLERANCE["float32"])


@pytest.mark.parametrize("run", CPU_RUNS)
@pytest.mark.parametrize("changes", [dict(), dict(kv_heads=2, q_len=1), dict(mask="padding", valid_len=9, q_len=20)])
def test_bfloat16(run, changes):
    spec = _spec(*run, dtype="bfloat16", seq_len=100, **changes)
    with torch.no_grad():
        _check(spec, TOLERANCE["bfloat16"])


def test_bfloat16_training_gradients():
    _check(_spec("sdpa", "flash", dtype="bfloat16", mode="training", kv_heads=2, q_len=20), TOLERANCE["bfloat16"])


def test_first_query_sees_only_itself():
    spec = AttentionSpec(variant="naive", seq_len=8, head_dim=4, heads=1, device="cpu")
    prepared = attention.prepare(spec)
    torch.testing.assert_close(prepared()[..., 0, :], prepared.value[..., 0, :])


def test_inputs_are_seeded_and_shaped():
    spec = AttentionSpec(device="cpu", heads=4, kv_heads=2, seq_len=16, q_len=3)
    first, second = attention.make_inputs(spec), attention.make_inputs(spec)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert not torch.equal(attention.make_inputs(spec, seed=1)[0], first[0])
    assert [t.shape for t in first] == [(1, 4, 3, 64), (1, 2, 16, 64), (1, 2, 16, 64)]
    assert not any(t.requires_grad for t in first)
    assert all(t.requires_grad for t in attention.make_inputs(spec.replace(mode="training")))


def test_training_steps_do_not_accumulate_gradients():
    prepared = attention.prepare(_spec("inplace", "auto", mode="training", kv_heads=2))
    prepared.backward(prepared())
    first = prepared.key.grad.clone()
    prepared.backward(prepared())
    torch.testing.assert_close(prepared.key.grad, first)
    assert torch.equal(prepared.grad_out, attention.upstream_gradient(prepared.spec))


def test_backward_needs_training_mode():
    prepared = attention.prepare(_spec("naive", "auto"))
    with pytest.raises(RuntimeError, match="mode='training'"):
        prepared.backward(prepared())


def test_naive_and_inplace_differ_by_one_line():
    root = Path(attention.__file__).parent
    naive = (root / "naive.py").read_text().splitlines()
    inplace = (root / "inplace.py").read_text().splitlines()
    body = [(a, b) for a, b in zip(naive, inplace, strict=True) if a != b and not a.startswith(('"""', "def "))]
    assert body == [
        (
            '        scores = scores.masked_fill(mask, float("-inf"))  # [batch, heads, q_len, seq]',
            '        scores.masked_fill_(mask, float("-inf"))  # [batch, heads, q_len, seq]',
        )
    ]


def test_masks_are_built_once_outside_the_forward():
    sdpa_decode = attention.prepare(_spec("sdpa", "auto", q_len=1))
    assert sdpa_decode.mask.is_causal is False  # causal_lower_right, never is_causal with q_len != seq_len
    assert type(sdpa_decode.mask.attn_mask).__name__ == "CausalBias"
    sdpa_prefill = attention.prepare(_spec("sdpa", "auto"))
    assert sdpa_prefill.mask.is_causal and sdpa_prefill.mask.attn_mask is None  # no dense mask at all
    assert attention.prepare(_spec("sdpa", "flash", mask="causal_top_left", q_len=1)).mask.is_causal
    window = attention.prepare(_spec("sdpa", "auto", mask="sliding_window", window=4)).mask.attn_mask
    assert window.dtype == torch.bool and window.shape == (37, 37)
    assert attention.prepare(_spec("naive", "auto", mask="none")).mask is None
    assert type(attention.prepare(_spec("flex", "auto")).mask).__name__ == "BlockMask"


def test_gqa_copy_is_visible_in_eager_variants_only():
    def aten_ops(spec):
        prepared = attention.prepare(spec)
        with torch.no_grad(), torch.profiler.profile() as prof:
            prepared()
        return [e.name for e in prof.events()]

    for variant in ("naive", "inplace"):
        copies = aten_ops(_spec(variant, "auto")).count("aten::copy_")
        # One copy of K and one of V: in reshape for GQA, inside matmul for MQA (a size-1 head dim reshapes as a view).
        assert aten_ops(_spec(variant, "auto", kv_heads=2)).count("aten::copy_") == copies + 2
        assert aten_ops(_spec(variant, "auto", kv_heads=1)).count("aten::copy_") == copies + 2
    assert "aten::repeat_interleave" in aten_ops(_spec("sdpa", "math", kv_heads=1))  # torch's math backend
    flash = aten_ops(_spec("sdpa", "flash", kv_heads=1))
    assert "aten::repeat_interleave" not in flash and "aten::copy_" not in flash


def test_pinned_cuda_backend_on_cpu_is_refused_by_prepare():
    with pytest.raises(SpecError, match="^backend: the efficient .* runs only on CUDA"):
        attention.prepare(_spec("sdpa", "efficient"))


def _compute_ops(spec: AttentionSpec) -> list[str]:
    """Leaf compute aten ops of one forward, as the README defines kernels_per_forward on CPU."""
    from profiling.structure import METADATA_OPS, SCALAR_CONVERSIONS

    def is_metadata(event) -> bool:
        scalar = event.name in SCALAR_CONVERSIONS and bool(event.input_shapes) and event.input_shapes[0] == []
        return event.name in METADATA_OPS or scalar

    def compute(event) -> list[str]:
        below = [name for child in event.cpu_children for name in compute(child)]
        if below or not event.name.startswith("aten::") or is_metadata(event):
            return below
        return [event.name]

    prepared = attention.prepare(spec)
    with torch.no_grad():
        prepared()  # warm
        with torch.profiler.profile(record_shapes=True) as prof:
            prepared()
    return [name for event in prof.events() if event.cpu_parent is None for name in compute(event)]


@pytest.mark.parametrize(("run", "count"), [(("naive", "auto"), 6), (("inplace", "auto"), 5), (("sdpa", "math"), 14),
                                            (("sdpa", "flash"), 1)])  # fmt: skip
def test_default_runs_keep_the_blogs_op_counts(run, count):
    # The README's published counts: the new parameters' defaults must not add an op.
    assert len(_compute_ops(_spec(*run))) == count


@pytest.mark.parametrize(
    "changes", [dict(variant="sdpa", q_len=1), dict(variant="flex", mask="sliding_window", window=8)]
)
def test_compiled_variants_match_the_reference(changes):
    spec = AttentionSpec(device="cpu", seq_len=64, compile=True, **changes)
    with torch.no_grad():
        _check(spec, TOLERANCE["float32"])


def test_sdpa_decode_rebuilds_its_dense_mask_in_every_forward():
    def top_level_ops(spec):
        prepared = attention.prepare(spec)
        with torch.no_grad():
            prepared()
            with torch.profiler.profile() as prof:
                prepared()
        return [e.name for e in prof.events() if e.cpu_parent is None]

    # causal_lower_right materialises [q_len, seq_len] on each call where no fused CUDA kernel takes it.
    assert top_level_ops(_spec("sdpa", "auto", q_len=1)) == [
        "aten::ones",
        "aten::tril",
        "aten::scaled_dot_product_attention",
    ]
    # A window's dense mask was built once, by prepare.
    assert top_level_ops(_spec("sdpa", "auto", mask="sliding_window", window=4)) == [
        "aten::scaled_dot_product_attention"
    ]
