"""One registry names every variant and run; its parsers refuse bad lists with every allowed name."""

import pytest

from attention import (
    BACKENDS,
    RUN_NAMES,
    RUNS,
    VARIANT_CHOICES,
    VARIANTS,
    AttentionSpec,
    SpecError,
    parse_run,
    parse_runs,
    parse_seq_lens,
    run_label,
)


def test_variants_in_order_with_labels_and_backends():
    assert list(VARIANTS) == ["naive", "inplace", "sdpa", "flex", "hub_flash"]
    assert VARIANT_CHOICES == [
        ("naive", "naive"),
        ("in-place", "inplace"),
        ("SDPA", "sdpa"),
        ("flex_attention", "flex"),
        ("FlashAttention from the Hub", "hub_flash"),
    ]
    assert VARIANTS["sdpa"].backends == BACKENDS == ("auto", "math", "flash", "efficient", "cudnn")
    assert all(v.backends == ("auto",) for name, v in VARIANTS.items() if name != "sdpa")


def test_runs_start_with_the_blogs_six_and_cover_every_variant():
    assert RUN_NAMES == (
        "naive",
        "inplace",
        "sdpa-math",
        "sdpa-flash",
        "sdpa-efficient",
        "sdpa-cudnn",
        "flex",
        "hub_flash",
    )
    assert {variant for variant, _ in RUNS} == set(VARIANTS)
    assert [parse_run(name) for name in RUN_NAMES] == list(RUNS)


@pytest.mark.parametrize(
    ("args", "label"),
    [
        (("naive",), "naive"),
        (("naive", "auto", True), "naive+compile"),
        (("sdpa",), "sdpa-auto"),
        (("sdpa", "flash", True), "sdpa-flash+compile"),
        (("hub_flash",), "hub_flash"),
    ],
)
def test_run_label(args, label):
    assert run_label(*args) == label


def test_spec_name_is_the_run_label():
    spec = AttentionSpec(variant="sdpa", backend="math", device="cpu")
    assert spec.name == "sdpa-math"
    assert spec.replace(compile=True).name == "sdpa-math+compile"


def test_parse_run_and_runs():
    assert parse_run(" sdpa-flash ") == ("sdpa", "flash")
    assert parse_run("sdpa") == parse_run("sdpa-auto") == ("sdpa", "auto")
    assert parse_runs("naive, sdpa-math,,hub_flash") == [("naive", "auto"), ("sdpa", "math"), ("hub_flash", "auto")]


@pytest.mark.parametrize("bad", ["fast", "naive-math", "sdpa-xformers", "flex-auto", "SDPA"])
def test_unknown_run_names_every_allowed_name(bad):
    with pytest.raises(SpecError, match="^variants: ") as err:
        parse_runs(f"naive,{bad}")
    assert err.value.field == "variants"
    for name in (*RUN_NAMES, "sdpa-auto"):
        assert name in str(err.value)


@pytest.mark.parametrize("text", ["", " , ", None, 3])
def test_empty_or_wrong_typed_run_lists_are_refused(text):
    with pytest.raises(SpecError, match="^variants: ") as err:
        parse_runs(text)
    assert "hub_flash" in str(err.value)


def test_duplicate_runs_are_refused():
    with pytest.raises(SpecError, match="^variants: each variant once, please: sdpa-auto given more than once"):
        parse_runs("sdpa,naive,sdpa-auto")


def test_parse_seq_lens():
    assert parse_seq_lens("128, 256,,100") == [128, 256, 100]
    for bad in ("", " , ", "12a", "1.5", "9" * 5000, None):
        with pytest.raises(SpecError, match="^seq_lens: "):
            parse_seq_lens(bad)


def test_long_lists_are_refused_before_they_are_split():
    from attention.errors import QUOTE_CHARS
    from attention.registry import MAX_LIST_CHARS

    for parse, field in ((parse_seq_lens, "seq_lens"), (parse_runs, "variants")):
        with pytest.raises(SpecError, match=rf"^{field}: give at most 1,024 characters, got 20,000,000$"):
            parse("1," * 10_000_000)
    with pytest.raises(SpecError) as bad:
        parse_run("x" * 5000)
    assert len(str(bad.value)) < QUOTE_CHARS + 200
    assert parse_seq_lens(",".join(["131072"] * 64)) == [131072] * 64  # 64 long lengths fit
    assert len(",".join(["131072"] * 64)) <= MAX_LIST_CHARS
