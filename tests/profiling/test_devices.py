"""Which deviceProperties entry names each GPU, and what the GPU is (issue 18, item 7: ROCm first-class).

Expected values come from the raw JSON (a plain loop over `traceEvents` and `deviceProperties`) or are
worked out by hand in the comments; never from the code under test.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from profiling import devices
from profiling.analysis import analyze
from profiling.gpu_metrics import DEVICE_FIELDS, gpu_metrics
from profiling.markdown import gpu_card
from profiling.trace import load_trace, parse_trace
from tests.conftest import DATA

GPU = DATA / "gpu"
AMD_TRACES = ("mi300x_qwen1.5-0.5b_prefill", "mi300x_sglang_qwen3-8b_decode")
NVIDIA_TRACES = ("h100_bert-small_sdpa-flash", "h100_nn-mha_fp32", "b200_vllm_gpt-oss_eager_rank0")


def raw(name: str) -> dict[str, Any]:
    with gzip.open(GPU / f"{name}.json.gz") as f:
        return json.load(f)


def kernel_devices(document: dict[str, Any]) -> list[int]:
    """The distinct `args.device` of the kernels, ascending: a plain loop."""
    found = set()
    for e in document["traceEvents"]:
        if e.get("cat") == "kernel" and e.get("ph") == "X":
            found.add(e["args"]["device"])
    return sorted(found)


def kernel(device: int, ts: float = 0, name: str = "k") -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "ts": ts,
        "dur": 1,
        "pid": device,
        "tid": 7,
        "args": {"device": device},
    }


def trace_of(kernels: list[dict[str, Any]], properties: list[dict[str, Any]] | None = None) -> Any:
    document: dict[str, Any] = {"traceEvents": kernels}
    if properties is not None:
        document["deviceProperties"] = properties
    return parse_trace(json.dumps(document).encode())


# --- real traces ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=AMD_TRACES)
def amd(request: pytest.FixtureRequest) -> tuple[dict[str, Any], Any]:
    return raw(request.param), analyze(load_trace(GPU / f"{request.param}.json.gz"))


def test_rocm_kernels_on_device_2_or_9_are_named_by_the_one_entry(amd):
    document, analysis = amd
    (entry,) = document["deviceProperties"]  # the one GPU the process saw, id 0
    (device,) = kernel_devices(document)  # 2 (prefill) or 9 (SGLang): never 0
    assert device != entry["id"]
    summary = analysis.summary
    (gpu,) = summary["gpus"]
    assert gpu["device"] == device
    assert gpu["device_mapping"] == {"kernel_device": device, "properties_id": entry["id"], "rule": "ascending order"}
    for described in (gpu, summary):
        assert described["gpu_name"] == entry["name"] and entry["name"].startswith("AMD Instinct MI300X")
        assert described["gpu_memory_bytes"] == entry["totalGlobalMem"]
        assert described["sm_count"] == entry["numSms"] == 304  # compute units
        assert described["gpu_arch"] == "gfx942"  # from the name: Kineto's ROCm entry has no gcnArchName
        assert "gcnArchName" not in entry
        # HIP's major.minor is 9.4 here: no CUDA compute capability, never Hopper's 9.x.
        assert (entry["computeMajor"], entry["computeMinor"]) == (9, 4) and described["compute_capability"] is None
    assert summary["devices"] == [entry["name"]]
    assert not any(name.startswith("device ") for name in summary["devices"])


def test_the_gpu_card_names_the_amd_gpu_and_says_what_rocm_lacks(amd):
    document, analysis = amd
    (entry,) = document["deviceProperties"]
    card = gpu_card(dict(analysis.summary))
    assert "304 CUs" in card and "gfx942" in card and "compute capability" not in card
    assert "n/a (ROCm traces carry no occupancy estimate)" in card
    assert "Tensor-core use unknown" in card  # beside the tensor-core share: unknown never reads as "no"
    assert entry["name"] in card.replace("\\", "")  # the name, escaped as Markdown


def test_the_gpu_card_of_an_nvidia_trace_gives_capability_and_arch():
    summary = gpu_metrics(load_trace(GPU / "h100_bert-small_sdpa-flash.json.gz"))
    card = gpu_card(summary)
    assert "132 SMs" in card and "compute capability 9\\.0" in card and "sm\\_90" in card  # escaped Markdown


@pytest.mark.parametrize("name", NVIDIA_TRACES)
def test_cuda_kernels_keep_the_entry_with_their_own_id(name):
    document = raw(name)
    got = gpu_metrics(load_trace(GPU / f"{name}.json.gz"))
    entries = {e["id"]: e for e in document["deviceProperties"]}  # 1 (bert) or 8 (mha, B200) entries
    for gpu, device in zip(got["gpus"], kernel_devices(document), strict=True):
        entry = entries[device]
        assert gpu["device_mapping"] == {"kernel_device": device, "properties_id": device, "rule": "same id"}
        assert gpu["gpu_name"] == entry["name"] and gpu["sm_count"] == entry["numSms"]
        assert gpu["compute_capability"] == f"{entry['computeMajor']}.{entry['computeMinor']}"
        assert gpu["gpu_arch"] == f"sm_{entry['computeMajor']}{entry['computeMinor']}"  # sm_90, sm_100
    assert got["gpu_arch"] == got["gpus"][0]["gpu_arch"]


# --- the mapping's rules, on small traces ---------------------------------------------------------


def test_every_kernel_device_with_an_entry_of_its_id_keeps_it():
    properties = [{"id": i, "name": f"gpu {i}"} for i in range(8)]
    got = gpu_metrics(trace_of([kernel(0), kernel(3)], properties))
    assert [(g["gpu_name"], g["device_mapping"]["rule"]) for g in got["gpus"]] == [
        ("gpu 0", "same id"),
        ("gpu 3", "same id"),
    ]


def test_as_many_devices_as_entries_map_in_ascending_order():
    # Kernels on 7 and 4, entries 1 and 0: the smallest device takes the smallest id.
    properties = [{"id": 1, "name": "second"}, {"id": 0, "name": "first"}]
    t = trace_of([kernel(7), kernel(4, ts=5)], properties)
    got = gpu_metrics(t)
    assert [(g["device"], g["gpu_name"], g["device_mapping"]["properties_id"]) for g in got["gpus"]] == [
        (4, "first", 0),
        (7, "second", 1),
    ]
    assert t.devices == ["first", "second"]


def test_a_device_that_matches_an_id_by_chance_follows_the_order_too():
    # Devices 1 and 5 on entries 0 and 1: 1 has an entry of its own id, 5 has none, so the trace's ids are
    # not the entries' (ROCm numbers all the node's GPUs), and both map in order: 1 -> 0, 5 -> 1.
    properties = [{"id": 0, "name": "visible 0"}, {"id": 1, "name": "visible 1"}]
    got = gpu_metrics(trace_of([kernel(1), kernel(5)], properties))
    assert [(g["device"], g["gpu_name"]) for g in got["gpus"]] == [(1, "visible 0"), (5, "visible 1")]
    assert {g["device_mapping"]["rule"] for g in got["gpus"]} == {"ascending order"}


def test_more_devices_than_entries_describe_only_their_own_id():
    t = trace_of([kernel(0), kernel(3)], [{"id": 0, "name": "gpu 0", "numSms": 10}])
    got = gpu_metrics(t)
    assert [g["device_mapping"] for g in got["gpus"]] == [
        {"kernel_device": 0, "properties_id": 0, "rule": "same id"},
        {"kernel_device": 3, "properties_id": None, "rule": "unmatched"},
    ]
    assert got["gpus"][1]["gpu_name"] is None and got["gpus"][1]["sm_count"] is None  # no guess from gpu 0
    assert t.devices == ["gpu 0", "device 3"]


def test_no_device_properties_describe_nothing():
    t = trace_of([kernel(2)])
    got = gpu_metrics(t)
    assert got["gpus"][0]["device_mapping"] == {"kernel_device": 2, "properties_id": None, "rule": "unmatched"}
    assert {key: got[key] for key in DEVICE_FIELDS} == dict.fromkeys(DEVICE_FIELDS)
    assert t.devices == ["device 2"]


def test_2021_entries_without_ids_are_read_by_position():
    t = trace_of([kernel(1)], [{"name": "p0"}, {"name": "p1"}])
    assert gpu_metrics(t)["gpus"][0]["gpu_name"] == "p1" and t.devices == ["p1"]


def test_devices_without_gpu_activity_are_those_described_else_cpu():
    cpu = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1, "pid": 1, "tid": 1}
    assert trace_of([cpu], [{"id": 0, "name": "A"}, {"id": 1, "name": "A"}, {"id": 2}]).devices == ["A", "device 2"]
    assert trace_of([cpu]).devices == ["cpu"]


def test_device_numbers_that_are_no_index_name_nothing():
    # -1 and 1.5 are no device index: the pid (here also unusable) stands in, then nothing.
    odd = [{**kernel(0), "pid": "gpu", "args": {"device": d}} for d in (-1, 1.5)]
    assert trace_of(odd, [{"id": 0, "name": "only"}]).devices == ["only"]


# --- what a GPU is ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "arch"),
    [
        ({"name": "AMD Instinct MI250X", "gcnArchName": "gfx90a:sramecc+:xnack-", "computeMajor": 9}, "gfx90a"),
        ({"name": "AMD Instinct MI250", "computeMajor": 9, "computeMinor": 0}, "gfx90a"),  # HIP writes 9.0
        ({"name": "AMD Instinct MI210"}, "gfx90a"),
        ({"name": "AMD Instinct MI100"}, "gfx908"),
        ({"name": "AMD Instinct MI300X VF"}, "gfx942"),
        ({"name": "AMD Instinct MI325X"}, "gfx942"),
        ({"name": "AMD Instinct MI355X"}, "gfx950"),
        ({"name": "AMD Radeon Graphics", "gcnArchName": "gfx1100"}, "gfx1100"),
        ({"name": "AMD Radeon Graphics"}, None),  # an unknown product: no guess
        ({"warpSize": 64, "computeMajor": 9, "computeMinor": 4}, None),  # 64-wide wavefronts: AMD, not Hopper
    ],
)
def test_amd_gets_an_architecture_and_no_compute_capability(entry, arch):
    described = devices.describe(entry)
    assert described["gpu_arch"] == arch and described["compute_capability"] is None


def test_nvidia_gets_sm_arch_and_compute_capability():
    b200 = {"name": "NVIDIA B200", "computeMajor": 10, "computeMinor": 0, "warpSize": 32}
    assert devices.describe(b200) == {
        "gpu_name": "NVIDIA B200",
        "gpu_memory_bytes": None,
        "compute_capability": "10.0",
        "sm_count": None,
        "gpu_arch": "sm_100",
    }


def test_hostile_names_and_arch_fields_are_data():
    long_name = "x" * 1_000_000 + " AMD Instinct MI300X"  # the product past the part read: no guess
    assert devices.describe({"name": long_name})["gpu_arch"] is None
    assert devices.describe({"name": "AMD", "gcnArchName": ["gfx942"]})["gpu_arch"] is None  # not text
    assert devices.describe({"name": "AMD", "gcnArchName": "sm_90"})["gpu_arch"] is None  # no gfx name
    assert devices.describe({"name": 7, "computeMajor": True, "computeMinor": 0})["compute_capability"] is None
