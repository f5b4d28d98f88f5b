"""Names from a trace: cut to 4 kB at load and before decode's cache, and every regex over them linear.

A 100,000-digit kernel name (263 bytes gzipped) once made one decoder pattern backtrack for 28 s
while holding the GIL. Each regex applied to a trace's strings is timed here on adversarial names
at 400 and 4,000 characters, side by side: ten times the length must cost under twenty times the
time (linear gives about ten, quadratic about a hundred). The best of several repetitions is
compared, so a busy machine slows both sides or neither.
"""

from __future__ import annotations

import gc
import importlib
import json
import pkgutil
import random
import re
import time
import tracemalloc
from collections.abc import Callable

import pytest

import profiling
from profiling import kernels
from profiling.terminal import plain
from profiling.trace import parse_trace
from tests.timing_slack import TIMING_SLACK

# README: names are cut at load to 4 kB: the first 4,095 characters and "…". Restated, not imported.
NAME_CHARS = 4096
SHORT, LONG = 400, 4000
# 10x the name may cost up to 20x the time (a quadratic cost is 100x), widened by TIMING_SLACK: best-of
# timings interleaved are mostly immune to load, and up to a slack of 5 a quadratic cost still fails.
MAX_RATIO = 20.0 * TIMING_SLACK
# Many short timings, not a few long ones: on a busy machine some short ones run undisturbed.
REPEATS = 21
ROUNDS = 3
MEASURE_S = 2e-4  # each timing of the long name runs at least this long


def _module_regexes() -> dict[str, re.Pattern[str]]:
    """Every compiled text regex `profiling` keeps at module level, alone or in a tuple of rows: the
    ones applied to names, categories, device names and messages. Found, not listed, so a regex
    added later is timed too. Keyed by where it lives and its pattern."""
    found: dict[str, re.Pattern[str]] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(profiling.__path__)):
        for attr, value in vars(importlib.import_module(f"profiling.{module}")).items():
            for row in value if isinstance(value, tuple) else (value,):
                for regex in row if isinstance(row, tuple) else (row,):
                    if isinstance(regex, re.Pattern) and isinstance(regex.pattern, str):
                        found.setdefault(f"{module}.{attr}: {regex.pattern[:48]}", regex)
    return found


REGEXES = _module_regexes()


def test_the_regexes_found_include_the_decoder_table():
    patterns = {regex.pattern for regex in REGEXES.values()}
    assert {p.regex for p in kernels.PATTERNS} | {kernels._ARCH.pattern} <= patterns
    # The table lives in a data file: every row of it is timed, read from the file itself.
    rows = json.loads(kernels.PATTERNS_FILE.read_text(encoding="utf-8"))["patterns"]
    assert len(rows) == len(kernels.PATTERNS) and {row["regex"] for row in rows} <= patterns
    assert {kernels._TYPE.pattern, kernels._BACK_REFERENCE.pattern, kernels._BRACKET.pattern} <= patterns


CUDNN = "cudnn_generated_fort_native_sdpa"
FRAGMENTS = [
    "1", "x", "_", "_ldg", "fmha_cutlassF_", "f16", "_aligned", "_rf", CUDNN, "_knob_", "sm", "_sm", "sm_", "90",
    "\n", " ", "ProfilerStep#", "A100", "-", "\x1b[", "\x1b]", "\x9b", ";", "٣", "a",
    # the rows of issue 18: Tensile, TRT-LLM, Triton, NCCL, C++ brackets and mangled names, element types
    "Cijk_", "A", "_B", "_MI", "_ISA", "bmm_", "Mx", "tensorop_", "fmhaSm", "Kernel_Qkv", "Fmha", "Causal",
    "triton_poi_fused_", "nccl", "Kernel_", "<", ">", "(", ")", "::", "_Z", "N", "S_", "float", "tf32",
]  # fmt: skip
# (head, body): the name is the head, then the body repeated, cut to the length measured. Each body
# makes some pattern start a match at almost every position and fail late.
ADVERSARIAL: dict[str, tuple[str, str]] = {
    "digit run": ("", "1"),
    "1x1x1x...": ("", "1x"),
    "tiles without _ldg<digit>": ("", "12x34_ldg_"),
    "_ctile_ fragments without _tn": ("", "_1x1_1x1_t"),
    "fmha_cutlassF_ repeated": ("", "fmha_cutlassF_"),
    "fmha_cutlassF_ with digits": ("", "fmha_cutlassF_f16_1x"),
    "fmha_cutlassF_ then one long word": ("fmha_cutlassF_", "a_"),
    "cuDNN prefix repeated": ("", CUDNN),
    "cuDNN prefix, knobs without a tile": (CUDNN, "_knob_1_1x1_"),
    "cuDNN prefix per line": ("", CUDNN + "_knob_1\n"),
    "sm_ prefixes": ("", "sm_"),
    "_sm digits": ("", "_sm1234x"),
    "sm_ and digits": ("", "sm_9"),
    "ProfilerStep# digits": ("ProfilerStep#", "1"),
    "ProfilerStep# repeated": ("", "ProfilerStep#1x"),
    "unicode digits": ("", "٣x٣_"),
    "device names": ("", "A100-SXM4-"),
    "escape openers": ("", "\x1b["),
    "unterminated OSC": ("", "\x1b]0;"),
    "8-bit CSI parameters": ("", "\x9b1;"),
    "NCCL kernel prefixes": ("", "ncclKernel_a "),
    "unclosed brackets": ("void f", "<("),
    "mangled substitutions without their end": ("_ZN", "S"),
    "every fragment in turn": ("", "".join(FRAGMENTS)),
    "a seeded mixture": ("", "".join(random.Random(16).choice(FRAGMENTS) for _ in range(2000))),
}


def adversarial(kind: str, length: int) -> str:
    head, body = ADVERSARIAL[kind]
    return (head + body * (length // len(body) + 1))[:length]


def _seconds(call: Callable[[str], object], text: str, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        call(text)
    return time.perf_counter() - start


def cost_ratio(call: Callable[[str], object], kind: str) -> float:
    """Best time on the LONG name over best time on the SHORT one, measured side by side; a ratio
    over MAX_RATIO is measured again (ROUNDS in all), so only a cost that grows faster than the
    name every time fails, not one spell of a busy machine."""
    short, long = adversarial(kind, SHORT), adversarial(kind, LONG)
    number = 1
    while _seconds(call, long, number) < MEASURE_S and number < 1 << 20:
        number *= 2
    ratio = float("inf")
    for _ in range(ROUNDS):
        best_short = best_long = float("inf")
        for _ in range(REPEATS):  # interleaved: a slow spell of the machine hits both sides
            best_short = min(best_short, _seconds(call, short, number))
            best_long = min(best_long, _seconds(call, long, number))
        ratio = min(ratio, best_long / best_short)
        if ratio < MAX_RATIO:
            break
    return ratio


def _worst(call: Callable[[str], object]) -> tuple[float, str]:
    return max((cost_ratio(call, kind), kind) for kind in ADVERSARIAL)


@pytest.mark.parametrize("name", list(REGEXES))
def test_every_name_regex_is_linear(name):
    ratio, kind = _worst(REGEXES[name].search)
    assert ratio < MAX_RATIO, f"{name}: {LONG / SHORT:g}x the name cost {ratio:.0f}x the time on {kind!r}"


@pytest.mark.parametrize(
    ("name", "call"),
    [("kernels.decode, uncached", kernels._decode.__wrapped__), ("__main__.plain", plain)],
)
def test_the_whole_decoder_and_the_cli_stripping_are_linear(name, call):
    ratio, kind = _worst(call)
    assert ratio < MAX_RATIO, f"{name}: {LONG / SHORT:g}x the name cost {ratio:.0f}x the time on {kind!r}"


def test_the_reader_cuts_every_name_to_4096_characters():
    digits = "1" * 100_000
    names = [digits, digits[:NAME_CHARS], digits[: NAME_CHARS + 1], "aten::mm"]
    events = [{"ph": "X", "cat": "kernel", "name": n, "ts": i, "dur": 1} for i, n in enumerate(names)]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    cut = digits[: NAME_CHARS - 1] + "…"
    assert list(trace.events["name"]) == [cut, digits[:NAME_CHARS], cut, "aten::mm"]
    assert [len(n) for n in trace.events["name"]] == [NAME_CHARS, NAME_CHARS, NAME_CHARS, 8]


def test_decode_caches_the_cut_name_only():
    long = "ampere_sgemm_128x64_tn_" + "1" * 100_000
    cut = long[: NAME_CHARS - 1] + "…"
    kernels._decode.cache_clear()
    info = kernels.decode(long)
    assert kernels._decode.cache_info().currsize == 1
    kernels._decode(cut)  # a hit on the one entry: the cut name is its key
    assert kernels._decode.cache_info().hits == 1 and kernels._decode.cache_info().currsize == 1
    assert info == kernels.decode(cut) and "FP32 math on CUDA cores" in info.summary


def test_distinct_huge_names_leave_4_kB_each_in_the_cache():
    # The attack kept each decoded name whole: +160 MiB resident per 167 kB upload of 4 MiB names.
    count, size = 50, 400_000
    kernels._decode.cache_clear()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            kernels.decode(f"kernel_{i}_" + "1" * size)  # built, decoded and dropped: only the cache keeps it
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kernels._decode.cache_info().currsize == count
    assert kept < count * 3 * NAME_CHARS, f"{kept / count:,.0f} bytes kept per name of {size:,}"
