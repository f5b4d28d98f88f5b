"""The kernel decoder on the seven real GPU traces of tests/data/gpu, and the demangler on hostile names.

Every share is checked against a plain loop over the raw events (`json.load(gzip.open(path))`), and
the tensor-core share also against the README's reference table (±10 points) and against a
classifier written here from the README's definition: GEMM and attention kernels that run on tensor
or matrix cores, by their names.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from profiling.gpu_metrics import gpu_metrics
from profiling.kernels import ATTENTION_FAMILIES, decode, decoded_kernel_time_percent, demangle, short_name
from profiling.tables import KERNEL_COLUMNS, kernel_table, short_kernel_name
from profiling.trace import load_trace
from tests.conftest import DATA, ROOT
from tests.timing_slack import slack

GPU = DATA / "gpu"
# README.md of tests/data/gpu: (tensor-core %, fused attention %) read from the raw events by name.
README = {
    "h100_bert-small_sdpa-flash": (76.5, 12.2),
    "h100_qwen1.5-0.5b_prefill": (36.6, 8.5),
    "b200_vllm_gpt-oss_eager_rank0": (59.7, 4.5),
    "mi300x_qwen1.5-0.5b_prefill": (52.4, 13.2),
    "mi300x_sglang_qwen3-8b_decode": (79.2, 21.8),  # with the paged-attention reduce kernel
    "h100_nn-mha_fp32": (59.8, 0.0),
    "h100_owlv2_eager-attn": (46.8, 0.0),
}
TENSOR_POINTS, ATTENTION_POINTS = 10.0, 3.0  # the README's tolerances
# The README's definition, by name: cuBLAS xmma/nvjet, CUTLASS tensorop, TRT-LLM bmm, Tensile MFMA
# instructions, and FlashAttention, TRT-LLM fmha, AOTriton and ROCm paged attention (not its reduce).
TENSOR_NAMES = re.compile(r"xmma|tensorop|nvjet|^bmm_|_MI\d+x\d+x\d+_|flash_fwd|fmhaSm|^attn_fwd$|_mfma\d")


def _raw_kernels(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel")]


@pytest.fixture(scope="module")
def traces() -> dict:
    """Each trace once: the loaded trace and its raw kernel events."""
    return {name: (load_trace(GPU / f"{name}.json.gz"), _raw_kernels(GPU / f"{name}.json.gz")) for name in README}


def _share(kernels: list[dict], counted) -> float:
    total = sum(e["dur"] for e in kernels)
    return 100.0 * sum(e["dur"] for e in kernels if counted(e["name"])) / total


@pytest.mark.parametrize("name", list(README))
def test_decoded_kernel_time_is_at_least_95_percent(traces, name):
    trace, raw = traces[name]
    plain = _share(raw, lambda n: decode(n).family != "other")
    assert decoded_kernel_time_percent(trace.kernels) == pytest.approx(plain, abs=1e-9)
    assert plain >= 95


@pytest.mark.parametrize("name", list(README))
def test_tensor_core_share_matches_the_readme_and_a_plain_loop(traces, name):
    trace, raw = traces[name]
    metrics = gpu_metrics(trace)
    by_names_here = _share(raw, lambda n: TENSOR_NAMES.search(n) is not None)
    assert metrics["tensor_core_time_percent"] == pytest.approx(by_names_here, abs=1e-6)
    assert abs(metrics["tensor_core_time_percent"] - README[name][0]) <= TENSOR_POINTS
    unknown = _share(raw, lambda n: decode(n).engine == "unknown")
    assert metrics["tensor_core_unknown_percent"] == pytest.approx(unknown, abs=1e-6)
    for gpu in metrics["gpus"]:  # one GPU per trace: its entry carries both shares too
        assert gpu["tensor_core_time_percent"] == pytest.approx(by_names_here, abs=1e-6)
        assert gpu["tensor_core_unknown_percent"] == pytest.approx(unknown, abs=1e-6)


@pytest.mark.parametrize("name", list(README))
def test_fused_attention_families_hold_the_readmes_attention_share(traces, name):
    _, raw = traces[name]
    fused = _share(raw, lambda n: decode(n).family in ATTENTION_FAMILIES)
    assert abs(fused - README[name][1]) <= ATTENTION_POINTS


@pytest.mark.parametrize("name", ["b200_vllm_gpt-oss_eager_rank0", "mi300x_qwen1.5-0.5b_prefill", "h100_nn-mha_fp32"])
def test_kernel_table_columns_agree_with_the_decoder(traces, name):
    trace, raw = traces[name]
    table = kernel_table(trace)
    assert KERNEL_COLUMNS[-3:] == ["family", "engine", "precision"] and list(table.columns) == KERNEL_COLUMNS
    calls = defaultdict(int)
    for e in raw:
        calls[e["name"]] += 1
    for row in table.to_dict("records"):
        info = decode(row["name"])
        assert (row["family"], row["engine"], row["kernel"]) == (
            info.family,
            info.engine,
            short_kernel_name(row["name"]),
        )
        assert info.short_name.startswith(row["kernel"].removesuffix("…"))
        assert row["precision"] == info.precision or (info.precision is None and pd.isna(row["precision"]))
        if row["kind"] == "kernel":
            assert row["count"] == calls[row["name"]]
            assert row["tensor cores"] == {"tensor": "yes", "simt": "no"}.get(info.engine, "unknown")


def _names(raw: list[dict], pattern: str) -> list[str]:
    found = sorted({e["name"] for e in raw if re.search(pattern, e["name"])})
    assert found, pattern
    return found


def test_what_the_issue_names_reads_right(traces):
    b200, mi300x = traces["b200_vllm_gpt-oss_eager_rank0"][1], traces["mi300x_qwen1.5-0.5b_prefill"][1]
    sglang, mha = traces["mi300x_sglang_qwen3-8b_decode"][1], traces["h100_nn-mha_fp32"][1]
    for n in _names(b200, "multimem_all_reduce_kernel"):
        assert decode(n).family == "communication" and "reduction over a dimension" not in decode(n).meaning
    for n in _names(mha, "cutlass_80_tensorop_s1688gemm") + _names(mha, "sm90_xmma_gemm_f32f32_tf32f32"):
        assert (decode(n).precision, decode(n).engine) == ("tf32", "tensor") and "bf16/fp16" not in decode(n).meaning
    for n in _names(b200, "^bmm_MxE4m3_MxE2m1"):
        assert (decode(n).precision, decode(n).engine) == ("fp4", "tensor") and "MXFP4" in decode(n).meaning
    for n in _names(mi300x, "^Cijk_.*MI16x16x1") + _names(sglang, "^Cijk_.*MI16x16x1"):
        assert (decode(n).family, decode(n).engine) == ("gemm", "tensor")
    assert decode("attn_fwd").family == "aotriton-attention" and _names(mi300x, "^attn_fwd$")
    for n in _names(b200, "^fmhaSm100a"):
        assert decode(n).family == "trtllm-attention" and decode(n).precision == "fp8"
    for n in _names(sglang, "paged_attention_ll4mi"):
        assert decode(n).family == "paged-attention"
    assert {decode(n).family for n in _names(sglang, "paged_attention_ll4mi")} <= set(ATTENTION_FAMILIES)


def test_short_names_of_real_kernels(traces):
    b200, owlv2 = traces["b200_vllm_gpt-oss_eager_rank0"][1], traces["h100_owlv2_eager-attn"][1]
    (rms,) = _names(b200, r"^std::enable_if<.*fused_add_rms_norm_kernel")
    assert short_name(rms) == "fused_add_rms_norm_kernel"
    (softmax,) = _names(owlv2, r"^void at::native::\(anonymous namespace\)::cunn_SoftMaxForward")
    assert short_name(softmax) == "cunn_SoftMaxForward"
    for _, raw in traces.values():
        for n in {e["name"] for e in raw}:
            assert not short_name(n).startswith(("std::", "at::", "void ")) and "<" not in short_name(n)


# -- hostile mangled names, each in a fresh process: a crash there fails the test, not the run --------


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=slack(timeout)
    )


def _doubling(steps: int) -> str:
    """f<A, B<A,A>, A<B,B>, ...>: each template argument refers back to the previous one twice."""

    def ref(i: int) -> str:
        digits, j, out = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", i - 1, ""
        while True:
            out, j = digits[j % 36] + out, j // 36
            if j == 0:
                return "S" + out + "_"

    return "_Z1fI1A1BIS_S_E" + "".join("S0_I" + ref(i + 1) * 2 + "E" for i in range(1, steps)) + "Evv"


def test_a_doubling_name_is_refused_before_the_demangler_sees_it():
    cxxfilt = pytest.importorskip("cxxfilt")

    name = _doubling(40)  # 455 characters
    assert len(cxxfilt.demangle(name)) > 10**7  # unguarded: 27 MB of text (60 steps: never finishes)
    start = time.perf_counter()
    assert demangle(name) == name and decode(name).family == "other"
    assert time.perf_counter() - start < slack(1.0)


def test_hostile_names_neither_crash_nor_take_long():
    """The crafted names of the module docstring, from a thread with a 128 KiB stack (the demangler
    needs about 512 KiB at the deepest nesting libstdc++ allows), in a process of their own."""
    result = _run(
        f"""
        import threading, time
        from profiling.kernels import decode, demangle
        names = [
            "_Z1f" + "P" * 1019 + "i",  # the deepest pointer nesting libstdc++ accepts
            "_Z1fI" + "1AI" * 253 + "i" + "E" * 253 + "Evv",  # nested templates
            "_Z1f" + "PFv" * 1364 + "i",  # 4,096 characters of nested function types
            "_Z" + "N1AI" * 1023 + "i",  # 4,096 characters of nested names and templates
            {_doubling(60)!r},  # 675 characters: never finished unguarded
            "_Z1fIJ" + "i" * 300 + "EJ" + "c" * 300 + "EJ" + "s" * 300 + "EEvDpPFT_DpPFT0_DpT1_EE",  # 190 MB unguarded
        ]
        out = []
        def run():
            for name in names:
                start = time.perf_counter()
                out.append((len(demangle(name)), decode(name).family, time.perf_counter() - start))
        threading.stack_size(128 * 1024)
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        print(out)
        """
    )
    assert result.returncode == 0, result.stderr
    out = ast.literal_eval(result.stdout)
    assert len(out) == 6 and all(seconds < slack(2.0) for _, _, seconds in out)
    assert out[0][0] == len("f(int" + "*" * 1019 + ")")  # demangled, on the demangler's own stack


def test_unguarded_the_deepest_name_crashes_a_small_stack():
    """The evidence for running the demangler on a thread of its own: cxxfilt called directly from a
    256 KiB thread dies on the deepest name libstdc++ accepts."""
    pytest.importorskip("cxxfilt")
    result = _run(
        """
        import threading, cxxfilt
        threading.stack_size(256 * 1024)
        thread = threading.Thread(target=lambda: cxxfilt.demangle("_Z1f" + "P" * 1019 + "i"))
        thread.start()
        thread.join()
        """
    )
    assert result.returncode != 0


def test_random_mangled_names_finish_quickly():
    result = _run(
        """
        import random, time
        from profiling.kernels import decode, demangle
        rng = random.Random(18)
        alphabet = ["1A", "1B", "S_", "S0_", "T_", "I", "E", "P", "K", "R", "F", "v", "i", "N", "Li1E", "Dp", "St"]
        start = time.perf_counter()
        for _ in range(2000):
            name = "_Z" + "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 400)))
            demangle(name), decode(name)
        print(time.perf_counter() - start)
        """
    )
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) < slack(30.0)


def test_without_cxxfilt_names_stay_as_written_and_still_decode():
    result = _run(
        """
        import sys
        sys.modules["cxxfilt"] = None  # as on a bare torch image: the import fails
        from profiling.kernels import decode, demangle
        name = "_ZN5aiter24add_rmsnorm_quant_kernelIffLi256EEEvPT0_PT_"
        print(demangle("_Z4siluf"), decode(name).short_name, decode(name).family)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["_Z4siluf", "add_rmsnorm_quant_kernel", "norm"]
