r"""Kernel-name decoder: a regex table kept as data, turning mangled names into meaning.

Each matching row adds one phrase; `{group}` placeholders are filled from the regex's named
groups. Order matters only for the order of the phrases.

Every regex runs in time linear in the name (tests/profiling/test_names.py): names come from
uploads, and one backtracking pattern held the GIL for 28 s on a 100,000-digit name. So no two
quantifiers may trade characters: digit runs are possessive (`\d++`), a run is entered only at its
start (`(?<!\d)`), and a row that needs "A, then later B" commits to the first A of the line or
word (`(?>...)`) instead of retrying B's scan from every later A. Names are also cut to
`MAX_NAME_CHARS` before decoding (profiling/names.py).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from profiling.names import cut_name


@dataclass(frozen=True)
class Pattern:
    regex: str
    family: str
    meaning: str
    tensor_cores: bool | None = None  # True: tensor-core math; False: CUDA cores; None: n/a
    fallback: bool = False  # only when no earlier row of the same family matched


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        # The first prefix of each line, then its first knob: what `prefix.*?_knob_...` finds, in one pass.
        r"(?m:^)(?>.*?cudnn_generated_fort_native_sdpa).*?_knob_(?P<knob>\d++)_(?P<tile>\d++x\d++x\d++)",
        "cudnn-attention",
        "cuDNN generated fused attention (engine knob {knob}, tile {tile})",
        True,
    ),
    Pattern(r"cudnn_generated_fort_native_sdpa", "cudnn-attention", "cuDNN generated fused attention", True, True),
    Pattern(r"flash_fprop", "cudnn-attention", "flash-style forward propagation", True),
    Pattern(
        r"pytorch_flash::|flash_fwd(?!_splitkv)",
        "flash-attention",
        "FlashAttention-2 forward (fused, tiled, online softmax)",
        True,
    ),
    Pattern(r"flash_fwd_splitkv", "flash-attention", "FlashAttention-2 split-KV forward (decode-style)", True),
    Pattern(
        r"fmha_cutlassF_(?P<dtype>bf16|f16|f32)(?P<aligned>_aligned)?_(?P<tile>\d++x\d++)(?P<rf>_rf)?",
        "efficient-attention",
        "xformers/cutlass memory-efficient attention ({dtype}, tile {tile})",
        True,
    ),
    # `fmha_cutlassF_\w*_aligned`, from the first prefix of each word only.
    Pattern(
        r"(?<!\w)(?>\w*?fmha_cutlassF_)\w*_aligned", "efficient-attention", "aligned loads (head_dim a multiple of 8)"
    ),
    Pattern(
        r"(?<!\w)(?>\w*?fmha_cutlassF_)\w*_rf_", "efficient-attention", "rf: output accumulated in the register file"
    ),
    Pattern(r"scudnn", "conv", "FP32 cuDNN convolution (CUDA cores, no tensor cores)", False),
    Pattern(r"(?P<mma>[sh]16816|s1688|h1688|s884|h884)", "gemm", "tensor-core MMA {mma} (bf16/fp16 inputs)", True),
    Pattern(r"wgmma|hgmma|_gmma_", "gemm", "Hopper warpgroup MMA (wgmma) on tensor cores", True),
    Pattern(r"nvjet", "gemm", "cuBLAS nvjet GEMM (Hopper+)", True),
    Pattern(r"tensorop|_hmma|bf16bf16|f16f16", "gemm", "tensor-core GEMM", True),
    Pattern(
        r"sgemm|gemmSN_|gemv2T_kernel|gemv2N_kernel|dot_kernel",
        "gemm",
        "FP32 math on CUDA cores (no tensor cores)",
        False,
    ),
    Pattern(r"splitKreduce", "gemm", "split-K reduction of a GEMM"),
    # A tile starts where its digit run does, as the leftmost match always did; `_ldg\d` finds what `_ldg\d+` did.
    Pattern(
        r"(?<!\d)(?P<tile>\d++x\d++)_ldg\d|_(?P<ctile>\d++x\d++)_\d++x\d++_tn", "gemm", "threadblock tile {tile}{ctile}"
    ),
    Pattern(r"triu_tril_kernel", "mask", "builds a triangular (causal) mask: triu/tril"),
    Pattern(r"softmax_warp_forward", "softmax", "warp-per-row softmax (rows up to 1024 wide)"),
    Pattern(r"cunn_SoftMaxForward", "softmax", "block-per-row softmax"),
    Pattern(r"masked_fill", "elementwise", "masked_fill: write -inf where masked"),
    Pattern(r"FillFunctor", "elementwise", "fill a tensor with one value"),
    Pattern(r"MulFunctor|mul_kernel", "elementwise", "elementwise multiply"),
    Pattern(r"CUDAFunctor_add|AddFunctor", "elementwise", "elementwise add"),
    Pattern(r"where_kernel|where_self", "elementwise", "elementwise select (where)"),
    Pattern(r"copy_kernel|direct_copy", "elementwise", "elementwise copy / dtype cast"),
    Pattern(r"isneginf|\bisinf", "elementwise", "checks for -inf (safe softmax guard)"),
    Pattern(r"reduce_kernel", "reduction", "reduction over a dimension"),
    Pattern(r"vectorized_elementwise_kernel", "elementwise", "vectorized elementwise kernel"),
    Pattern(
        r"unrolled_elementwise_kernel", "elementwise", "unrolled elementwise kernel (non-contiguous or mixed dtype)"
    ),
    Pattern(
        r"(?<!vectorized_)(?<!unrolled_)elementwise_kernel", "elementwise", "generic elementwise kernel", fallback=True
    ),
    Pattern(r"^triton_poi", "triton", "Triton pointwise kernel (torch.compile/Inductor)"),
    Pattern(r"^triton_(red|per)", "triton", "Triton reduction kernel (torch.compile/Inductor)"),
    Pattern(r"^triton_tem", "triton", "Triton template kernel (torch.compile/Inductor)"),
    Pattern(r"^triton_", "triton", "Triton kernel", fallback=True),
    Pattern(r"Memcpy DtoD", "memcpy", "device-to-device copy: an out-of-place op copied a tensor"),
    Pattern(r"Memcpy HtoD", "memcpy", "host-to-device copy"),
    Pattern(r"Memcpy DtoH", "memcpy", "device-to-host copy (often a sync point)"),
    Pattern(r"^Memset", "memset", "device memset"),
    Pattern(r"nccl", "communication", "NCCL collective"),
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
_COMPILED = tuple((re.compile(p.regex), p) for p in PATTERNS)


@dataclass(frozen=True)
class KernelInfo:
    family: str
    phrases: tuple[str, ...]
    tensor_cores: bool | None
    arch: str | None

    @property
    def summary(self) -> str:
        parts = list(self.phrases)
        if self.arch:
            parts.append(f"sm{self.arch}: {ARCHITECTURES.get(self.arch, 'unknown architecture')}")
        return "; ".join(parts)


def decode(name: str) -> KernelInfo:
    """What a kernel (or memcpy/memset) name says about the work it does."""
    return _decode(cut_name(name))  # cut before the cache: it holds 4,096 names of at most 4 kB each


@functools.lru_cache(maxsize=4096)
def _decode(name: str) -> KernelInfo:
    """`decode` of a name already cut; cached per name, as a trace repeats its kernels thousands of times."""
    phrases: list[str] = []
    family = "other"
    tensor_cores: bool | None = None
    families: set[str] = set()
    for regex, pattern in _COMPILED:
        if pattern.fallback and pattern.family in families:
            continue
        match = regex.search(name)
        if not match:
            continue
        families.add(pattern.family)
        groups = {k: v or "" for k, v in match.groupdict().items()}
        phrase = pattern.meaning.format(**groups)
        if phrase not in phrases:
            phrases.append(phrase)
        if family == "other":
            family = pattern.family
        if tensor_cores is None:
            tensor_cores = pattern.tensor_cores
    arch_match = _ARCH.search(name)
    arch = None
    if arch_match:
        arch = arch_match.group("sm") or ARCH_PREFIXES[arch_match.group("prefix")]
    return KernelInfo(family, tuple(phrases), tensor_cores, arch)
