r"""Kernel-name decoder: a regex table kept as data (kernel_patterns.json), turning names into meaning.

Rows are tried in order on the demangled name. Each matching row adds one phrase, with `{group}`
placeholders filled from its regex's named groups; the first matching row with a family names the
family, the first with a precision gives the precision, the first with an engine the engine. A
fallback row counts only when no earlier row of its family matched. Where no row gives a precision,
the first element type the name spells (`c10::BFloat16`, `float`, `__half`...) gives it; where none
gives an engine, it is "unknown", never a guess.

Every regex runs in time linear in the name (tests/profiling/test_names.py): names come from
uploads, and one backtracking pattern held the GIL for 28 s on a 100,000-digit name. So no two
quantifiers may trade characters: digit runs are possessive (`\d++`), a run is entered only at its
start (`(?<!\d)`), and a row that needs "A, then later B" commits to the first A of the line or
word (`(?>...)`) instead of retrying B's scan from every later A. Names are also cut to
`MAX_NAME_CHARS` before decoding (profiling/names.py).

Demangling (`_Z...` names, as ROCm traces carry them) goes through cxxfilt, i.e. the C++ runtime's
`__cxa_demangle`, which reads hostile input in C. Two crafted names hurt it (tests/profiling/
test_decoder_real.py): back-references that each double the output (a 585-character name printed
872 MB in 8.5 s; 675 characters never finished) and nested pack expansions (933 characters: 190 MB,
18 s); and at its deepest nesting it needs about 512 KiB of stack, so it crashed a thread with 256
KiB. So a name is demangled only when it is at most MAX_DEMANGLED_CHARS long (libstdc++ refuses
longer ones itself), has at most MAX_BACK_REFERENCES back-references (so the output is at most
2^10 times the name) and no pack expansion, and the demangler runs on a thread of its own with
DEMANGLER_STACK_BYTES of stack.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from profiling.names import cut_name

try:  # pinned in requirements.txt; without it (a bare torch image) names stay as the trace wrote them
    import cxxfilt
except ImportError:  # pragma: no cover - exercised by tests/profiling/test_decoder_real.py in a subprocess
    cxxfilt = None

# Distinct kernel names a rule or metric decodes, those with the most time (`decode_most`): an upload can
# hold 200,000 names, and decoding each costs about 200 µs. One bound for every caller.
MAX_NAMES_DECODED = 1000
PATTERNS_FILE = Path(__file__).with_name("kernel_patterns.json")
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8", "mixed")
ENGINES = ("tensor", "simt", "copy", "unknown")
OTHER = "other"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Pattern:
    regex: str
    family: str | None  # None: the row adds a phrase (or a precision, an engine) but names no family
    meaning: str  # "" adds no phrase
    precision: str | None = None  # one of PRECISIONS, or "{group}" read through the aliases
    engine: str | None = None  # "tensor", "simt" or "copy"; None: the row does not say
    fallback: bool = False  # only when no earlier row of the same family matched


def _load(path: Path) -> tuple[tuple[Pattern, ...], dict[str, str]]:
    """The table and the precision aliases, checked: a bad row fails at import, not on a user's trace."""
    data = json.loads(path.read_text(encoding="utf-8"))
    aliases: dict[str, str] = data["precision_aliases"]
    rows = tuple(Pattern(**row) for row in data["patterns"])
    bad = [a for a in aliases.values() if a not in PRECISIONS]
    for row in rows:
        groups = re.compile(row.regex).groupindex
        template = row.precision and row.precision.startswith("{") and row.precision[1:-1] in groups
        if row.precision is not None and row.precision not in PRECISIONS and not template:
            bad.append(f"{row.regex}: precision {row.precision}")
        if row.engine not in (None, *ENGINES[:3]):
            bad.append(f"{row.regex}: engine {row.engine}")
    if bad:
        raise ValueError(f"{path.name}: {bad}")
    return rows, aliases


PATTERNS, PRECISION_ALIASES = _load(PATTERNS_FILE)
_COMPILED = tuple((re.compile(p.regex), p) for p in PATTERNS)
# Fused attention: one kernel does QK^T, softmax and PV. Every such family's name ends in "-attention".
ATTENTION_FAMILIES: tuple[str, ...] = tuple(
    dict.fromkeys(p.family for p in PATTERNS if p.family and p.family.endswith("-attention"))
)

# Element types as C++ spells them in template arguments and parameters, mangled bf16/fp16 included.
TYPE_PRECISION = {
    **dict.fromkeys(("BFloat16", "bfloat16_t", "__nv_bfloat16", "__hip_bfloat16", "__bf16", "DF16b"), "bf16"),
    **dict.fromkeys(("Half", "half_t", "__half", "_Float16", "DF16_"), "fp16"),
    "float": "fp32",
    "double": "fp64",
    **dict.fromkeys(("Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz", "Float8_e5m2fnuz"), "fp8"),
    **dict.fromkeys(("__nv_fp8_e4m3", "__nv_fp8_e5m2", "float_e4m3_t", "float_e5m2_t"), "fp8"),
}
# Longest first, so `Float8_e4m3fnuz` is not read as `Float8_e4m3fn`; a type is a whole word.
_TYPE = re.compile(
    r"(?<![A-Za-z_])(?:"
    + "|".join(sorted(map(re.escape, TYPE_PRECISION), key=len, reverse=True))
    + r")(?![A-Za-z0-9_])"
)

ARCHITECTURES = {
    "70": "Volta (V100)",
    "75": "Turing (T4)",
    "80": "Ampere (A100)",
    "86": "Ampere (A10G, RTX 30)",
    "89": "Ada (L4, RTX 40)",
    "90": "Hopper (H100, H200)",
    "100": "Blackwell (B200)",
    "120": "Blackwell (RTX 50)",
}
ARCH_PREFIXES = {"volta": "70", "turing": "75", "ampere": "80", "ada": "89", "hopper": "90"}
_ARCH = re.compile(r"(?:\bsm_?|_sm)(?P<sm>\d{2,3})(?![\dx])|^(?:void )?(?P<prefix>volta|turing|ampere|ada|hopper)_")

MAX_DEMANGLED_CHARS = 1024  # libstdc++ refuses longer names itself (GCC PR 87675: its arrays live on the stack)
MAX_BACK_REFERENCES = 10
# Over-counts on purpose: every back-reference (S_, S4_, T_, T0_) ends in an upper-case letter or digit
# then "_"; a pack expansion is Dp (a type) or sp followed by what it expands.
_BACK_REFERENCE = re.compile(r"[0-9A-Z]_")
_PACK_EXPANSION = re.compile(r"Dp|sp(?=[A-Zf])")
DEMANGLER_STACK_BYTES = 4 * 2**20  # 8x the most measured; threads a server makes may have 256 KiB or less
_STACK_SIZE_LOCK = threading.Lock()


def demangle(name: str) -> str:
    """A `_Z...` C++ name as source spells it, through cxxfilt; any other name, or one it cannot read
    safely (see the module docstring) or at all, unchanged. Each distinct name is demangled once."""
    if cxxfilt is None or not name.startswith("_Z") or len(name) > MAX_DEMANGLED_CHARS:
        return name
    if len(_BACK_REFERENCE.findall(name)) > MAX_BACK_REFERENCES or _PACK_EXPANSION.search(name):
        return name
    return _demangled(name)


# Not decode's 4096: bench/mutation.py drops that cache by its text. Each entry holds at most 1 kB + 4 kB.
@functools.lru_cache(maxsize=2048)
def _demangled(name: str) -> str:
    result: list[str] = []

    def run() -> None:
        # InvalidName, a C++ runtime it cannot find, a failed allocation: the name stays as it is.
        with contextlib.suppress(Exception):
            result.append(cxxfilt.demangle(name))

    # The stack size applies to threads started while it is set; other threads started meanwhile get the
    # bigger stack too, which costs them nothing but address space.
    with _STACK_SIZE_LOCK:
        previous = threading.stack_size(DEMANGLER_STACK_BYTES)
        try:
            thread = threading.Thread(target=run, name="demangle", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join()
    # Up to 2^10 times the name (see MAX_BACK_REFERENCES): cut like any name from a trace.
    return cut_name(result[0]) if result and result[0] else name


# Templates that only wrap the kernel, which their first template argument names: `cutlass::Kernel2<
# cutlass_80_tensorop_s1688gemm_...>`, `cutlass::device_kernel<flash::enable_sm90_or_later<...>>`.
WRAPPERS = frozenset({"Kernel", "Kernel2", "device_kernel", "kentry"})
_BRACKET = re.compile(r"[<>()]")
_ANONYMOUS = "(anonymous namespace)"
_LENGTH = re.compile(r"\d{1,5}")  # a source name's length; names are cut to 4,096 characters


def short_name(name: str) -> str:
    """The kernel's own name: no return type, template arguments or parameters, the last `::` component
    (`cunn_SoftMaxForward`, never `std::enable_if` or `at::native::`), after demangling."""
    return decode(name).short_name


def _short_name(text: str) -> str:
    if text.startswith("_Z"):  # not demangled: read the nested name's components off the mangling
        return _mangled_name(text) or text
    for _ in range(3):  # wrappers nest (device_kernel<enable_sm90_or_later<FlashAttnFwdSm90<...>>>)
        base, argument = _cpp_name(text)
        if not base or argument is None or not (base in WRAPPERS or base.startswith("enable_sm")):
            return base or text
        text = argument
    return base


def _cpp_name(text: str) -> tuple[str, str | None]:
    """The function's last name component and the text of its template arguments (None without).

    One pass over the brackets: `<` inside parentheses is a comparison (`enable_if<((8)>(0))...`), the
    first top-level `(` other than `(anonymous namespace)` opens the parameters. A name whose brackets
    do not balance is cut at its first bracket instead."""
    depth: list[str] = []
    spans: list[tuple[int, int]] = []  # top-level template argument lists, brackets included
    end = len(text)
    for match in _BRACKET.finditer(text):
        char, at = match.group(), match.start()
        if not depth:
            if char == "(" and not text.startswith(_ANONYMOUS, at):
                end = at
                break
            if char == "<":
                spans.append((at, -1))
                depth.append(char)
        elif char == "(" or (char == "<" and depth[-1] == "<"):
            depth.append(char)
        elif (char == ")" and depth[-1] == "(") or (char == ">" and depth[-1] == "<"):
            depth.pop()
            if not depth:
                spans[-1] = (spans[-1][0], at)
    if depth:
        cut = min((i for i in (text.find("<"), text.find("(")) if i > 0), default=len(text))
        return _last_component(text[:cut]), None
    head, pieces, start = text[:end], [], 0
    for open_at, close_at in spans:
        pieces.append(head[start:open_at])
        start = close_at + 1
    pieces.append(head[start:])
    skeleton = "".join(pieces)
    if end < len(text) and head.endswith(" "):  # `Memcpy DtoD (Device -> Device)`: no C++ signature
        return skeleton.strip(), None
    argument = text[spans[-1][0] + 1 : spans[-1][1]] if spans and spans[-1][1] == len(head.rstrip()) - 1 else None
    return _last_component(skeleton.split(",")[0]), argument


def _last_component(text: str) -> str:
    """`void at::native::(anonymous namespace)::f` -> `f`: after the return type, the last `::` part; two
    parts where the last says nothing (cuBLAS's `internal::gemvx::kernel` -> `gemvx::kernel`)."""
    parts = text.replace(_ANONYMOUS, "{anonymous}").strip().rsplit(" ", 1)[-1].split("::")
    return "::".join(parts[-2:]) if parts[-1] == "kernel" and len(parts) > 1 else parts[-1]


def _mangled_name(text: str) -> str:
    """The last source name of a mangled `_Z[N]<length><name>...` before its template arguments."""
    at, last = 2, ""
    at += text.startswith("N", at)
    while at < len(text) and text[at] in "rVKRO":  # a member function's qualifiers
        at += 1
    while at < len(text):
        if text.startswith("St", at):
            at += 2
        elif text[at] == "S":  # a substitution names an earlier component: skip it
            close = text.find("_", at)
            at = close + 1 if close > 0 else len(text)
        elif (length := _LENGTH.match(text, at)) is not None:
            at = length.end()
            last, at = text[at : at + int(length.group())], at + int(length.group())
        else:
            break
    return last


@dataclass(frozen=True)
class KernelInfo:
    family: str
    phrases: tuple[str, ...]
    meaning: str  # the phrases joined
    precision: str | None  # one of PRECISIONS, None where the name does not say
    engine: str  # one of ENGINES
    arch: str | None
    short_name: str

    @property
    def tensor_cores(self) -> bool | None:
        """True on tensor (or matrix) cores, False on CUDA cores, None where unknown or not a kernel's work."""
        return {"tensor": True, "simt": False}.get(self.engine)

    @property
    def summary(self) -> str:
        parts = list(self.phrases)
        if self.arch:
            parts.append(f"sm{self.arch}: {ARCHITECTURES.get(self.arch, 'unknown architecture')}")
        return "; ".join(parts)


# One decode at a time: the analysis's two threads ask for the same names (the kernel table, the summary), and two
# misses of one name at once would decode it twice, past the bound on decoding an upload's names (decode_most).
# Decoding holds the GIL throughout, so the lock costs no parallelism.
_DECODING = threading.Lock()


def decode(name: str) -> KernelInfo:
    """What a kernel (or memcpy/memset) name says about the work it does."""
    with _DECODING:
        return _decode(cut_name(name))  # cut before the cache: it holds 4,096 names of at most 4 kB each


@functools.lru_cache(maxsize=4096)
def _decode(name: str) -> KernelInfo:
    """`decode` of a name already cut; cached per name, as a trace repeats its kernels thousands of times."""
    text = demangle(name)
    phrases: list[str] = []
    family, precision, engine = OTHER, None, None
    families: set[str] = set()
    for regex, pattern in _COMPILED:
        if pattern.fallback and pattern.family in families:
            continue
        match = regex.search(text)
        if not match:
            continue
        groups = {k: v or "" for k, v in match.groupdict().items()}
        if pattern.family:
            families.add(pattern.family)
            family = pattern.family if family == OTHER else family
        phrase = pattern.meaning.format(**groups)
        if phrase and phrase not in phrases:
            phrases.append(phrase)
        precision = precision or _precision(pattern.precision, groups)
        engine = engine or pattern.engine
    if precision is None:
        typed = _TYPE.search(text)
        precision = TYPE_PRECISION[typed.group()] if typed else None
    arch_match = _ARCH.search(text)
    arch = None
    if arch_match:
        arch = arch_match.group("sm") or ARCH_PREFIXES[arch_match.group("prefix")]
    return KernelInfo(family, tuple(phrases), "; ".join(phrases), precision, engine or UNKNOWN, arch, _short_name(text))


def _precision(value: str | None, groups: dict[str, str]) -> str | None:
    if value is None or not value.startswith("{"):
        return value
    return PRECISION_ALIASES.get(groups.get(value[1:-1], ""))


# What a name past MAX_NAMES_DECODED reads as: no family, engine or precision is claimed for it.
NOT_DECODED = f"not decoded: past the {MAX_NAMES_DECODED:,} names with the most time"


def undecoded(name: str) -> KernelInfo:
    """A name left undecoded (`decode_most`): family "other", engine unknown, its meaning says why."""
    return KernelInfo(OTHER, (NOT_DECODED,), NOT_DECODED, None, UNKNOWN, None, cut_name(name))


UNDECODED = undecoded("")  # one for every name left out, where the caller has the name itself (`short_name_in`)


def decode_most(names: pd.Series | np.ndarray, dur: pd.Series | np.ndarray) -> dict[str, KernelInfo]:
    """The MAX_NAMES_DECODED distinct names of `names` (one per event, beside its `dur`) with the most time
    (ties: first seen), decoded; a name not here reads as `undecoded` (`info_of`). Decoding costs about 200 µs
    a name, so an upload of 200,000 distinct names would take a minute or more decoded whole; no real trace in
    tests/data or ../shared/traces holds more than 199 kernel names. Nothing is built per name left out."""
    codes, uniques = pd.factorize(names, use_na_sentinel=True)
    named = codes >= 0
    weights = np.nan_to_num(np.asarray(dur, dtype=np.float64)[named])
    time = np.bincount(codes[named], weights=weights, minlength=len(uniques))
    kept = np.sort(np.argsort(-time, kind="stable")[:MAX_NAMES_DECODED])  # in order of first sight
    return {name: decode(name) for name in map(str, np.asarray(uniques, dtype=object)[kept])}


def info_of(infos: dict[str, KernelInfo], name: str) -> KernelInfo:
    """`name`'s entry in `decode_most`'s answer, or `undecoded` where it was left out."""
    info = infos.get(name)
    return undecoded(name) if info is None else info


def short_name_in(infos: dict[str, KernelInfo], name: str) -> str:
    """`name`'s short name where `decode_most` decoded it, else its own text (no object built for it)."""
    info = infos.get(name)
    return name if info is None else info.short_name


def decoded_kernel_time_percent(kernels: pd.DataFrame) -> float | None:
    """Σ dur of the kernels whose family the decoder knows (not "other") ÷ Σ dur of all of them × 100;
    None without kernel time. Each distinct name is decoded once, past MAX_NAMES_DECODED as unknown
    (`decode_most`)."""
    per_name = kernels.groupby("name", sort=False)["dur"].sum()
    total = float(per_name.sum())
    if not total > 0:
        return None
    infos = decode_most(per_name.index.to_numpy(dtype=object), per_name.to_numpy())
    known = per_name.index.isin([name for name, info in infos.items() if info.family != OTHER])
    return 100.0 * float(per_name[known].sum()) / total
