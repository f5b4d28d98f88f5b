"""The spec validates values once, with messages that name the field; it reads no free memory."""

import pytest
import torch

from attention import LIMITS, AttentionSpec, SpecError


@pytest.mark.parametrize("field", list(LIMITS))
@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True, 10**9])
def test_bad_sizes_name_the_field(field, bad):
    with pytest.raises(SpecError) as err:
        AttentionSpec(device="cpu", **{field: bad})
    assert err.value.field == field
    low, high = LIMITS[field]
    assert str(err.value).startswith(f"{field}:")
    assert f"{low} to {high}" in str(err.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("variant", "fast"),
        ("backend", "xformers"),
        ("dtype", "float8"),
        ("device", "tpu"),
        ("mode", "train"),
        ("mask", "causal_bottom_right"),
        ("mask", None),
    ],
)
def test_unknown_choices_list_what_is_allowed(field, value):
    with pytest.raises(SpecError, match=f"^{field}: {value!r} is not one of") as err:
        AttentionSpec(**{field: value})
    assert err.value.field == field


def test_compile_must_be_a_bool():
    with pytest.raises(SpecError, match="^compile:"):
        AttentionSpec(device="cpu", compile="yes")


def test_defaults_are_todays_run():
    spec = AttentionSpec(device="cpu")
    assert (spec.mode, spec.kv_heads, spec.q_len, spec.mask, spec.window, spec.valid_len) == (
        "inference",
        4,
        256,
        "causal",
        0,
        (),
    )


def test_neutral_values_resolve():
    spec = AttentionSpec(heads=8, seq_len=100, kv_heads=0, q_len=0, device="auto")
    assert (spec.kv_heads, spec.q_len) == (8, 100)
    assert spec.device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_a_spec_reads_no_free_memory():
    # Far beyond any machine's memory, yet a valid value: only preflight refuses it.
    spec = AttentionSpec(variant="naive", batch=512, heads=256, seq_len=131_072, device="cpu")
    assert spec.estimated_bytes() > 2**50


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        (dict(kv_heads=3), "kv_heads", "must divide heads (8), got 3"),
        (dict(kv_heads=9), "kv_heads", "must be from 0 to 8 (0 means heads), got 9"),
        (dict(kv_heads=-1), "kv_heads", "must be from 0 to 8"),
        (dict(kv_heads=2.0), "kv_heads", "must be a whole number"),
        (dict(q_len=101), "q_len", "must be from 0 to 100 (0 means seq_len), got 101"),
        (dict(q_len=True), "q_len", "must be a whole number"),
        (dict(mask="sliding_window"), "window", "sliding_window needs a window from 1 to seq_len (100), got 0"),
        (dict(mask="sliding_window", window=101), "window", "from 1 to seq_len (100), got 101"),
        (dict(window=-1), "window", "must be from 0"),
        (dict(mask="padding"), "valid_len", "padding needs one length, or one per batch row (2), got 0"),
        (dict(mask="padding", valid_len="5,6,7"), "valid_len", "one per batch row (2), got 3"),
        (dict(mask="padding", valid_len="0"), "valid_len", "each length must be from 1 to seq_len (100), got 0"),
        (dict(mask="padding", valid_len=(5, 101)), "valid_len", "got 101"),
        (dict(mask="padding", valid_len="5;6"), "valid_len", "must be a whole number or a comma list"),
        (dict(mask="padding", valid_len=[5, 2.5]), "valid_len", "must be a whole number or a comma list"),
        (dict(mask="padding", valid_len=True), "valid_len", "must be a whole number or a comma list"),
    ],
)
def test_new_parameters_are_validated_with_the_field(changes, field, message):
    with pytest.raises(SpecError) as err:
        AttentionSpec(batch=2, heads=8, seq_len=100, device="cpu", **changes)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")
    assert message in str(err.value)


def test_valid_len_is_one_int_per_row():
    base = dict(batch=3, seq_len=50, device="cpu", mask="padding")
    assert AttentionSpec(**base, valid_len=7).valid_len == (7, 7, 7)
    assert AttentionSpec(**base, valid_len="7").valid_len == (7, 7, 7)
    assert AttentionSpec(**base, valid_len="7, 8,9").valid_len == (7, 8, 9)
    assert AttentionSpec(**base, valid_len=[7, 8, 9]).valid_len == (7, 8, 9)


def test_values_a_mask_does_not_use_are_reset():
    spec = AttentionSpec(device="cpu", mask="causal", window=16, valid_len="3")
    assert (spec.window, spec.valid_len) == (0, ())
    assert AttentionSpec(device="cpu", variant="naive", backend="math").backend == "auto"
    assert AttentionSpec(device="cpu", variant="sdpa", backend="math").backend == "math"


HUGE = "9" * 20_000_000  # the red team's 20 MB valid_len


def longest_run(text: str, char: str) -> int:
    """The longest stretch of `char` in `text`: how much of an input made of it a message repeats."""
    best = run = 0
    for c in text:
        run = run + 1 if c == char else 0
        best = max(best, run)
    return best


def test_valid_len_is_not_parsed_unless_the_mask_is_padding():
    # Unparseable and huge alike are dropped unread: only padding reads the field.
    for mask in ("none", "causal", "causal_top_left"):
        assert AttentionSpec(device="cpu", mask=mask, valid_len=HUGE).valid_len == ()
        assert AttentionSpec(device="cpu", mask=mask, valid_len="5;x").valid_len == ()
        assert AttentionSpec(device="cpu", mask=mask, valid_len=[2.5] * 1000).valid_len == ()


@pytest.mark.parametrize(
    ("valid_len", "message"),
    [
        (HUGE, "valid_len: padding needs one length, or one per batch row (2): at most 42 characters, got 20,000,000"),
        ("1," * 21, "valid_len: padding needs one length, or one per batch row (2), got 21"),  # 42 characters: parsed
        (
            "1," * 21 + "1",
            "valid_len: padding needs one length, or one per batch row (2): at most 42 characters, got 43",
        ),
        ("9" * 21, "valid_len: each length is a whole number of a few digits, got '" + "9" * 21 + "'"),
        ([7] * 10**6, "valid_len: padding needs one length, or one per batch row (2), got 1,000,000"),
        ([10**5000, 3], "valid_len: each length must be from 1 to seq_len (100), got a whole number of about 5,0"),
    ],
)
def test_a_long_valid_len_is_refused_before_parsing(valid_len, message):
    with pytest.raises(SpecError) as err:
        AttentionSpec(batch=2, seq_len=100, device="cpu", mask="padding", valid_len=valid_len)
    assert err.value.field == "valid_len"
    assert str(err.value).startswith(message)
    assert len(str(err.value)) < 200
    prefill = AttentionSpec(heads=8, seq_len=256, device="cpu")
    assert prefill.replace(seq_len=128).q_len == 128
    assert prefill.replace(heads=4).kv_heads == 4
    decode = AttentionSpec(heads=8, kv_heads=2, seq_len=256, q_len=1, device="cpu")
    assert (decode.replace(seq_len=1024).q_len, decode.replace(heads=16).kv_heads) == (1, 2)
    padded = AttentionSpec(batch=2, seq_len=64, mask="padding", valid_len=10, device="cpu")
    assert padded.replace(batch=4).valid_len == (10,) * 4
    with pytest.raises(SpecError, match="^valid_len: "):
        AttentionSpec(batch=2, seq_len=64, mask="padding", valid_len="10,20", device="cpu").replace(batch=3)
    with pytest.raises(SpecError, match="^heads:"):
        prefill.replace(heads=0)


def test_as_dict_echoes_every_field():
    spec = AttentionSpec(
        batch=2, seq_len=64, mode="training", kv_heads=2, q_len=16, mask="padding", valid_len="30,40", device="cpu"
    )
    fields = spec.as_dict()
    assert fields["valid_len"] == [30, 40]
    assert {k: fields[k] for k in ("mode", "kv_heads", "q_len", "mask", "window")} == dict(
        mode="training", kv_heads=2, q_len=16, mask="padding", window=0
    )
    assert set(fields) == set(AttentionSpec.__dataclass_fields__)
    assert AttentionSpec(**fields) == spec


def _unmasked_pairs(spec: AttentionSpec) -> int:
    """A plain loop over every (batch row, query, key): the definition, written apart from attention.masks."""
    pairs = 0
    for b in range(spec.batch):
        for i in range(spec.q_len):
            p = i if spec.mask == "causal_top_left" else i + spec.seq_len - spec.q_len
            for j in range(spec.seq_len):
                ok = spec.mask == "none" or j <= p
                ok = ok and (spec.mask != "sliding_window" or j > p - spec.window)
                ok = ok and (spec.mask != "padding" or j < spec.valid_len[b])
                pairs += ok
    return pairs


@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(q_len=1),
        dict(q_len=7, kv_heads=1),
        dict(q_len=7, mask="causal_top_left"),
        dict(mask="none", q_len=5),
        dict(mask="sliding_window", window=4, q_len=9),
        dict(mask="padding", valid_len="3,11", q_len=6),
    ],
)
def test_flops_count_only_unmasked_pairs(changes):
    spec = AttentionSpec(batch=2, heads=2, seq_len=11, head_dim=3, device="cpu", **changes)
    pairs = _unmasked_pairs(spec)
    assert spec.flops() == 4 * 3 * 2 * pairs
    assert spec.backward_flops() == 10 * 3 * 2 * pairs


def test_causal_flops_are_todays():
    spec = AttentionSpec(batch=1, heads=1, seq_len=4, head_dim=2, device="cpu")
    # QK^T and PV over the 10 unmasked (query, key) pairs of a 4x4 causal mask, 2 FLOPs per MAC.
    assert spec.flops() == 2 * 2 * 10 * 2


def test_bytes_moved_and_score_bytes():
    spec = AttentionSpec(batch=2, heads=8, kv_heads=2, seq_len=100, q_len=1, head_dim=16, dtype="bfloat16")
    q_and_out = 2 * (2 * 8 * 1 * 16)
    k_and_v = 2 * (2 * 2 * 100 * 16)
    assert spec.bytes_moved() == (q_and_out + k_and_v) * 2
    assert spec.score_bytes() == 2 * 8 * 1 * 100 * 2
