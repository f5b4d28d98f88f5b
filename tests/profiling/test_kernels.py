"""The kernel-name decoder, on the names the blog shows and on real kernels from A100 traces."""

import json
import threading
import time

import pandas as pd
import pytest

from profiling import kernels
from profiling.analysis import analyze
from profiling.kernels import (
    ATTENTION_FAMILIES,
    MAX_BACK_REFERENCES,
    MAX_NAMES_DECODED,
    NOT_DECODED,
    PATTERNS,
    PATTERNS_FILE,
    PRECISIONS,
    decode,
    decode_most,
    decoded_kernel_time_percent,
    demangle,
    info_of,
    short_name,
)
from profiling.trace import load_trace, parse_trace
from tests.conftest import DATA

CASES = [
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x3_tn", "gemm", True, ["tensor-core MMA s16816", "sm80"]),
    ("ampere_sgemm_128x64_tn", "gemm", False, ["FP32 math on CUDA cores", "sm80"]),
    (
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
        "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "efficient-attention",
        True,
        ["memory-efficient attention (bf16, tile 64x64)", "aligned", "register file", "sm80"],
    ),
    (
        "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
        "cutlass::bfloat16_t>, false, true, false, false, false, true, false, false>(pytorch_flash::Flash_fwd_params)",
        "flash-attention",
        True,
        ["FlashAttention-2"],
    ),
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_kernel0_0",
        "cudnn-attention",
        True,
        ["cuDNN generated fused attention (engine knob 7, tile 64x128x64)", "wgmma", "sm90: Hopper"],
    ),
    (
        "void at::native::triu_tril_kernel<bool, long, false, 2>(at::cuda::detail::TensorInfo<bool, long>)",
        "mask",
        False,
        ["tril"],
    ),
    (
        "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false, false>(...)",
        "softmax",
        False,
        ["warp-per-row softmax"],
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
        "elementwise",
        False,
        ["fill"],
    ),
    ("Memcpy DtoD (Device -> Device)", "memcpy", None, ["device-to-device copy"]),
]


@pytest.mark.parametrize(("name", "family", "tensor_cores", "phrases"), CASES)
def test_decodes_the_blogs_kernels(name, family, tensor_cores, phrases):
    info = decode(name)
    assert info.family == family
    assert info.tensor_cores is tensor_cores
    for phrase in phrases:
        assert phrase in info.summary


def test_unknown_names_decode_to_nothing():
    info = decode("my_custom_kernel")
    assert info.family == "other" and info.summary == "" and info.arch is None


def test_every_real_kernel_in_the_a100_traces_gets_a_meaning_or_an_honest_blank():
    names = set()
    for trace in ("a100_simple_add", "sampled_training_rank0", "triton_driver_launch"):
        names |= set(load_trace(DATA / f"{trace}.json.gz").gpu_activity["name"])
    decoded = {n: decode(n) for n in names}
    assert decoded["ampere_sgemm_32x32_sliced1x4_tn"].tensor_cores is False
    assert "Triton pointwise" in decoded["triton_poi_fused_add_cos_sin_0"].summary
    tf32 = next(n for n in names if n.startswith("sm80_xmma_fprop"))
    assert decoded[tf32].arch == "80"
    understood = sum(1 for info in decoded.values() if info.summary)
    assert understood / len(decoded) > 0.5


# -- issue 18: precision, engine, short names, the data file --------------------------------------------

SOFTMAX = (
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, int)"
)
ENABLE_IF = (
    "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
    "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, float, int, int)"
)


@pytest.mark.parametrize(
    ("name", "short"),
    [
        (SOFTMAX, "cunn_SoftMaxForward"),
        (ENABLE_IF, "fused_add_rms_norm_kernel"),
        ("void at::native::elementwise_kernel<128, 2, F>(int)", "elementwise_kernel"),
        (
            "void (anonymous namespace)::softmax_warp_forward<float, float, float, 7, false, false>(float*)",
            "softmax_warp_forward",
        ),
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(X::Params)",
            "cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4",
        ),
        (
            "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<A, B>>>(P)",
            "FlashAttnFwdSm90",
        ),
        ("void cublasGemv(float (*)(int), int)", "cublasGemv"),
        ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"),
        (
            "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256EEEvPT0_",
            "add_rmsnorm_quant_kernel",
        ),  # not demangled here
        ("_Z4siluf", "silu"),
        ("void broken<<(int", "broken"),  # brackets that never close: cut at the first one
        ("attn_fwd", "attn_fwd"),
        ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, float>(P)", "gemvx::kernel"),
    ],
)
def test_short_name_is_the_kernels_own_name(name, short):
    # The return type, template arguments and parameters go; the last `::` component stays.
    assert short_name(name) == short == decode(name).short_name


def test_demangle_reads_mangled_names_once_and_leaves_others_alone():
    assert demangle("_Z4siluf") == "silu(float)"
    assert demangle("sm90_xmma_gemm") == "sm90_xmma_gemm"  # not mangled
    assert demangle("_Znot_a_name") == "_Znot_a_name"  # cxxfilt refuses it: the raw name stays
    assert demangle("_Z" + "1a" * 600) == "_Z" + "1a" * 600  # over MAX_DEMANGLED_CHARS: never handed over
    # Back-references past the bound, or a pack expansion: never handed over either.
    assert demangle("_Z1fIJiiEEvDpT_") == "_Z1fIJiiEEvDpT_"
    many = "_Z1f1A" + "S_" * (MAX_BACK_REFERENCES + 1)
    assert demangle(many) == many
    decode("_Z4siluf")
    assert decode("_Z4siluf").short_name == "silu" and decode("_Z4siluf").precision == "fp32"


@pytest.mark.parametrize(
    ("name", "precision", "engine"),
    [
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_16x6_tn_align4>(P)", "tf32", "tensor"),
        ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_tn_align1>(P)", "bf16", "tensor"),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x64x32_warpgroupsize1x1x1", "tf32", "tensor"),
        ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_sm100f", "fp4", "tensor"),
        ("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_ISA942", "bf16", "tensor"),
        ("Cijk_Ailk_Bljk_S_B_Bias_MT16x16x128_MI16x16x1", "fp32", "tensor"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>(int)",
            "bf16",
            "simt",
        ),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)", "fp32", "simt"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::Half>>(int)", "fp16", "simt"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>(int)", None, "simt"),
        ("Memcpy DtoD (Device -> Device)", None, "copy"),
        ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", None, "tensor"),  # the name says no dtype: none guessed
        ("my_custom_kernel", None, "unknown"),
    ],
)
def test_precision_and_engine_from_the_name(name, precision, engine):
    info = decode(name)
    assert (info.precision, info.engine) == (precision, engine)
    assert info.tensor_cores is {"tensor": True, "simt": False}.get(engine)


def test_the_pattern_file_is_checked_and_names_every_fused_attention_family():
    rows = json.loads(PATTERNS_FILE.read_text())["patterns"]
    assert [r["regex"] for r in rows] == [p.regex for p in PATTERNS]
    assert {r["precision"] for r in rows} - {None} <= set(PRECISIONS) | {
        r["precision"] for r in rows if "{" in str(r["precision"])
    }
    assert {r["engine"] for r in rows} <= {None, "tensor", "simt", "copy"}
    assert set(ATTENTION_FAMILIES) >= {
        "flash-attention", "efficient-attention", "cudnn-attention", "aotriton-attention", "ck-attention",
        "aiter-attention", "trtllm-attention", "flashinfer-attention", "paged-attention",
    }  # fmt: skip
    assert all(f.endswith("-attention") for f in ATTENTION_FAMILIES)
    for name, family in [
        ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)", "communication"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("void vllm::cross_device_reduce_1stage<half, 8>(P)", "communication"),
        ("void paged_attention_ll4mi_reduce_kernel<__hip_bfloat16, 128>(P)", "paged-attention"),
        ("_ZN7ck_tile6kentryILi1ENS_13FmhaFwdKernelINS_1XEEEJNS2_5KargsEEEEvDpT1_", "ck-attention"),
        ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<P>(P)", "flashinfer-attention"),
        ("triton_red_fused__to_copy_mean_pow_0", "triton"),
    ]:
        assert decode(name).family == family, name
    assert decode(
        "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)"
    ).phrases == ("all-reduce through NVLink multimem (symmetric memory)",)  # not "reduction over a dimension"
    assert "fuses _to_copy_mean_pow" in decode("triton_red_fused__to_copy_mean_pow_0").phrases


def _kernels(*rows: tuple[str, float]) -> pd.DataFrame:
    return pd.DataFrame({"name": [n for n, _ in rows], "dur": [d for _, d in rows]})


def test_decoded_kernel_time_percent_counts_kernels_with_a_family():
    frame = _kernels(("ampere_sgemm_128x64_tn", 30.0), ("my_custom_kernel", 10.0), ("ampere_sgemm_128x64_tn", 10.0))
    assert decoded_kernel_time_percent(frame) == pytest.approx(100 * 40 / 50)
    assert decoded_kernel_time_percent(_kernels(("my_custom_kernel", 5.0))) == 0.0
    assert decoded_kernel_time_percent(_kernels()) is None  # no kernel time: unknown, not 0 or 100
    assert decoded_kernel_time_percent(_kernels(("ampere_sgemm_128x64_tn", 0.0))) is None


def test_fbgemm_is_a_library_not_a_gemm():
    # fbgemm_gpu's embedding and conversion kernels carry "fbgemm" in their names; only the word gemm means a GEMM.
    embedding = "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<c10::Half>(int)"
    convert = "void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8_gpu(at::Tensor)>(int)"
    assert decode(embedding).family != "gemm" and decode(convert).family != "gemm"
    assert decode("void gemmk1_kernel<float, 256, 5>(int)").family == "gemm"


def test_a_split_k_reduction_is_no_fp32_gemm():
    from profiling.trace import parse_trace
    from profiling.upcasts import cuda_core_gemms

    kernel = {"ph": "X", "cat": "kernel", "ts": 0, "dur": 5, "pid": 0, "tid": 7, "args": {"device": 0}}
    names = ("void splitKreduce_kernel<float, float, float, float, true>(int)", "ampere_sgemm_32x128_tn")
    events = [{**kernel, "name": name, "ts": 10 * i} for i, name in enumerate(names)]
    trace = parse_trace(json.dumps({"traceEvents": events}).encode())
    assert cuda_core_gemms(trace.gpu_activity)["name"].tolist() == ["ampere_sgemm_32x128_tn"]


def test_decode_most_decodes_the_names_with_the_most_time_and_leaves_the_rest_unclaimed():
    gemm, fill, custom = "ampere_sgemm_128x64_tn", "void at::native::FillFunctor<float>(int)", "my_kernel"
    names = [f"{gemm}_{i}" for i in range(MAX_NAMES_DECODED - 1)] + [fill, fill, custom, None]
    dur = [10.0] * (MAX_NAMES_DECODED - 1) + [0.5, 0.5, 1.0, 99.0]
    infos = decode_most(pd.Series(names, dtype="category"), pd.Series(dur))
    assert len(infos) == MAX_NAMES_DECODED and custom not in infos  # a missing name is none
    assert infos[fill] == decode(fill) and infos[fill].engine == "simt"  # 1.0 µs in all: kept, by its sum
    left = info_of(infos, custom)  # the same 1.0 µs, seen later: the tie goes to the first seen
    assert (left.family, left.engine, left.precision, left.meaning, left.short_name) == (
        "other",
        "unknown",
        None,
        NOT_DECODED,
        custom,
    )
    assert all(info_of(infos, n) == decode(n) for n in names[: MAX_NAMES_DECODED - 1])
    assert list(infos)[-1] == fill  # in order of first sight


def test_an_upload_of_many_kernel_names_decodes_only_the_most_timed():
    # 300 names past the cap, each kernel a distinct duration: the names kept are those with the most time.
    count, events = MAX_NAMES_DECODED + 300, []
    for i in range(count):
        args = {"correlation": i, "stream": 7, "device": 0}
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"sgemm_{i}",
                "pid": 0,
                "tid": 7,
                "ts": 10 * i,
                "dur": 1 + i % 997 + i / count,
                "args": args,
            }
        )
    kernels._decode.cache_clear()
    analysis = analyze(parse_trace(json.dumps({"traceEvents": events}).encode()))
    table, summary = analysis.kernel_table, analysis.summary
    assert kernels._decode.cache_info().misses <= MAX_NAMES_DECODED  # however many rules and tables ask
    by_time = sorted(events, key=lambda e: -e["dur"])
    left = {e["name"] for e in by_time[MAX_NAMES_DECODED:]}
    assert set(table.loc[table["meaning"] == NOT_DECODED, "name"]) == left
    undecoded_rows = table[table["name"].isin(left)]
    assert (undecoded_rows["kernel"] == undecoded_rows["name"]).all()  # its own name, no decoder's short name
    assert set(undecoded_rows["engine"]) == {"unknown"} and undecoded_rows["precision"].isna().all()
    # Every decoded sgemm runs on CUDA cores: the time of the names left out is the unknown-engine share.
    total, unknown = sum(e["dur"] for e in events), sum(e["dur"] for e in by_time[MAX_NAMES_DECODED:])
    assert summary["tensor_core_unknown_percent"] == pytest.approx(100 * unknown / total)
    assert summary["decoded_kernel_time_percent"] == pytest.approx(100 * (total - unknown) / total)
    assert set(table.loc[table["family"] == "gemm", "name"]) == {e["name"] for e in by_time[:MAX_NAMES_DECODED]}


def test_two_threads_asking_for_one_name_decode_it_once(monkeypatch):
    # The analysis's two threads ask for the same names: the second waits for the first's decode and reads it,
    # rather than decoding it again (which would pass the bound on an upload's decodes).
    plain = kernels.demangle

    def slowly(name: str) -> str:
        time.sleep(0.2)  # both threads are asking meanwhile
        return plain(name)

    monkeypatch.setattr(kernels, "demangle", slowly)
    kernels._decode.cache_clear()
    together = threading.Barrier(2)
    found: list[object] = []

    def ask() -> None:
        together.wait()
        found.append(decode("ampere_sgemm_128x64_nn"))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert kernels._decode.cache_info().misses == 1 and found[0] == found[1]
