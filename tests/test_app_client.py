"""The app through a real Gradio server and a real gradio_client."""

import gzip
import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from profiling.summary import ANALYZE_KEYS, SUMMARY_KEYS
from profiling.trace import load_trace
from tests.conftest import DATA
from tests.timing_slack import slack

SMALL = dict(batch=1, heads=2, seq_len=64, head_dim=32, dtype="float32", device="cpu", compile=False)


def profile(client, variant, backend="auto", **overrides):
    return client.predict(variant=variant, backend=backend, **{**SMALL, **overrides}, api_name="/profile")


@pytest.fixture(scope="module")
def profiled(client):
    return {
        name: profile(client, variant, backend)
        for name, (variant, backend) in {
            "naive": ("naive", "auto"),
            "inplace": ("inplace", "auto"),
            "math": ("sdpa", "math"),
            "auto": ("sdpa", "auto"),
        }.items()
    }


@pytest.mark.parametrize("name", ["naive", "inplace", "math", "auto"])
def test_profile_returns_every_key_a_trace_and_a_figure(profiled, name):
    summary, op_table, figure, trace_path, kernel_table, table_path, insights = profiled[name]
    assert set(SUMMARY_KEYS) <= set(summary)
    assert (summary["seq_len"], summary["device"]) == (64, "cpu")
    trace = load_trace(trace_path)
    assert (trace.complete["name"] == "attn_fwd").sum() == 3
    assert op_table["headers"][:3] == ["name", "calls", "self cpu (us)"] and op_table["data"]
    plot = json.loads(figure["plot"])
    # The CPU lanes carry the names the trace's own metadata gives its threads, read here by a plain loop.
    raw = json.loads(Path(trace_path).read_text())["traceEvents"]
    thread_names = {e["args"]["name"].strip() for e in raw if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert thread_names & set(plot["layout"]["yaxis"]["ticktext"]), (thread_names, plot["layout"]["yaxis"]["ticktext"])
    assert kernel_table["headers"][0] == "kernel" and kernel_table["data"] == []  # CPU: no GPU kernels
    assert "aten::" in Path(table_path).read_text()


def test_naive_has_exactly_one_more_kernel_than_inplace(profiled):
    assert profiled["naive"][0]["kernels_per_forward"] == profiled["inplace"][0]["kernels_per_forward"] + 1
    assert "- **Hidden copy**: aten\\:\\:clone" in profiled["naive"][6]  # title in bold, the rest escaped


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(batch=0), "batch"),
        (dict(heads=-1), "heads"),
        (dict(seq_len=2.5), "seq_len"),
        (dict(head_dim=100000), "head_dim"),
        (dict(dtype="float8"), "dtype"),
        (dict(device="tpu"), "device"),
        (dict(batch=512, heads=256, seq_len=65536), "seq_len"),  # would not fit in memory
    ],
)
def test_bad_input_is_an_app_error_naming_the_field(client, overrides, field):
    with pytest.raises(AppError, match=f"^{field}:"):
        profile(client, "naive", **overrides)


def test_unknown_variant_and_cpu_only_backends(client):
    with pytest.raises(AppError, match="^variant: 'fast' is not one of"):
        profile(client, "fast")
    with pytest.raises(AppError, match="^backend: the cuDNN SDPA backend runs only on CUDA"):
        profile(client, "sdpa", "cudnn")


def test_cuda_without_cuda(client):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(AppError, match="^device: cuda was asked for"):
        profile(client, "naive", device="cuda")


def test_compare_rows_insights_and_speed(client):
    rows, table, chart = client.predict(**{**SMALL, "seq_len": 512}, api_name="/compare")
    by_run = {(r["variant"], r["backend"]): r for r in rows}
    assert {("naive", "auto"), ("inplace", "auto"), ("sdpa", "math"), ("sdpa", "flash")} <= set(by_run)
    assert "error" in by_run[("sdpa", "efficient")] and "error" in by_run[("sdpa", "cudnn")]
    assert any("Hidden copy" in i for i in by_run[("naive", "auto")]["insights"])
    math = " ".join(by_run[("sdpa", "math")]["insights"])
    assert "Mask rebuilt" in math and "Safe softmax" in math
    naive, flash = by_run[("naive", "auto")], by_run[("sdpa", "flash")]
    # Speed is this machine's to decide (and noisy under load); the speed-up must be the rows' own ratio.
    expected = naive["forward_unprofiled_ms"] / flash["forward_unprofiled_ms"]
    assert flash["speedup_vs_naive"] == pytest.approx(expected, abs=1e-3) and naive["speedup_vs_naive"] == 1.0
    assert flash["peak_memory_bytes"] < naive["peak_memory_bytes"] / 4  # no score matrix
    assert table["headers"][0] == "run" and json.loads(chart["plot"])["data"]
    # The spread reaches the client: each ran row has its samples, and a speed-up has its interval and status.
    for row in (r for r in rows if "error" not in r):
        stats = row["forward_ms_stats"]
        assert stats["n"] == len(stats["samples"]) >= 1
        assert stats["median"] == pytest.approx(row["forward_unprofiled_ms"], abs=1e-4)  # the key is rounded
        assert row["speedup_status"] in ("faster", "slower", "within noise", "no samples")
        if row["speedup_ci"] is not None:
            lo, hi = row["speedup_ci"]
            assert lo <= hi and (row["speedup_status"] == "within noise") == (lo <= 1 <= hi)


def test_diff_endpoint(client, profiled):
    rows = client.predict(profiled["naive"][0], profiled["inplace"][0], api_name="/diff")
    clone = next(r for r in rows if r["name"] == "aten::clone" and r["kind"] == "op")
    assert clone["change"] == -1 and clone["status"] == "removed"
    time = next(r for r in rows if r["name"] == "forward time (ms)")
    assert time["status"] in ("same", "changed", "within noise", "no samples")
    assert {"change %", "p value", "before p25–p75", "after p25–p75"} <= set(time)
    if time["status"] in ("changed", "within noise"):  # both runs kept >= 5 samples: the test was made
        assert 0 <= time["p value"] <= 1
        changed = time["p value"] < 0.01 and abs(time["change %"]) >= 5
        assert (time["status"] == "changed") == changed
    with pytest.raises(AppError, match="^before:"):
        client.predict({"not": "a summary"}, profiled["inplace"][0], api_name="/diff")


def test_sweep_endpoint(client):
    rows, chart = client.predict(
        ["inplace", "sdpa-flash"], "32,64", 1, 2, 32, "float32", "cpu", False, api_name="/sweep"
    )
    assert [(r["run"], r["seq_len"], r["status"]) for r in rows] == [
        ("inplace", 32, "ok"),
        ("inplace", 64, "ok"),
        ("sdpa-flash", 32, "ok"),
        ("sdpa-flash", 64, "ok"),
    ]
    assert json.loads(chart["plot"])["layout"]["xaxis"]["type"] == "log"
    for point in rows:  # each point's median with its interquartile range, and whether it is noisy
        assert point["forward_ms_p25"] <= point["forward_ms"] <= point["forward_ms_p75"]
        assert isinstance(point["noisy"], bool)
    with pytest.raises(AppError, match="^seq_lens:"):
        client.predict(["naive"], "64,abc", 1, 2, 32, "float32", "cpu", False, api_name="/sweep")
    with pytest.raises(AppError, match="^seq_lens: give at least one"):
        client.predict(["naive"], " , ", 1, 2, 32, "float32", "cpu", False, api_name="/sweep")
    with pytest.raises(AppError, match="^seq_len: must be from 1"):
        client.predict(["naive"], "0,64", 1, 2, 32, "float32", "cpu", False, api_name="/sweep")
    with pytest.raises(AppError, match="^variants:"):
        client.predict([], "64", 1, 2, 32, "float32", "cpu", False, api_name="/sweep")


@pytest.mark.parametrize(
    "name",
    ["a100_simple_add", "sampled_training_rank0", "triton_driver_launch", "cupti_counters_no_kernels", "cpu_only"],
)
def test_analyze_real_traces_exactly(client, name):
    raw = [e for e in json.loads(gzip.decompress((DATA / f"{name}.json.gz").read_bytes()))["traceEvents"]]
    kernels = [e for e in raw if e.get("cat") == "kernel" and e.get("ph") == "X"]
    summary, ops, kernel_table, figure, steps, annotations, insights, steps_chart = client.predict(
        handle_file(str(DATA / f"{name}.json.gz")), api_name="/analyze"
    )
    assert set(ANALYZE_KEYS) <= set(summary)
    assert summary["events"] == len(raw)
    assert summary["kernel_events"] == len(kernels)
    assert summary["kernel_time_us"] == pytest.approx(sum(e["dur"] for e in kernels))
    count = kernel_table["headers"].index("count")
    kind = kernel_table["headers"].index("kind")
    assert sum(r[count] for r in kernel_table["data"] if r[kind] == "kernel") == len(kernels)
    assert len(figure["plot"]) < 5_000_000
    assert len(steps["data"]) == summary["profiler_steps"] and json.loads(steps_chart["plot"])["layout"]
    if not kernels and name != "cpu_only":
        assert "No kernels recorded" in insights


def test_analyze_our_own_cpu_trace(client, profiled):
    summary, *_ = client.predict(handle_file(profiled["naive"][3]), api_name="/analyze")
    assert summary["forwards"] == 3
    assert summary["kernels_per_forward"] == profiled["naive"][0]["kernels_per_forward"]
    assert summary["ops_per_forward"] == profiled["naive"][0]["ops_per_forward"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"this is not json", "not valid JSON"),
        (b'{"hello": []}', "no `traceEvents`"),
        (b'{"traceEvents": 5}', "must be a list"),
    ],
)
def test_bad_uploads_are_clear_and_the_app_keeps_serving(client, tmp_path, content, message, profiled):
    bad = tmp_path / "upload.json"
    bad.write_bytes(content)
    with pytest.raises(AppError, match=message):
        client.predict(handle_file(str(bad)), api_name="/analyze")
    summary, *_ = client.predict(handle_file(str(DATA / "cpu_only.json.gz")), api_name="/analyze")
    assert summary["events"] == 30


def test_truncated_uploads(client, tmp_path):
    # Gzip bombs of every kind are in test_hostile_uploads.py.
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes((DATA / "a100_simple_add.json.gz").read_bytes()[:4000])
    with pytest.raises(AppError, match="truncated"):
        client.predict(handle_file(str(cut)), api_name="/analyze")


def test_share_without_token_or_repo(client, profiled):
    trace = handle_file(profiled["naive"][3])
    with pytest.raises(AppError, match="^token:"):
        client.predict(trace, "alice/traces", "", api_name="/share")
    with pytest.raises(AppError, match="^repo_id:"):
        client.predict(trace, "not a repo", "hf_x", api_name="/share")


def test_parallel_clients_get_their_own_runs(app_url):
    from gradio_client import Client

    seq_lens = [16, 24, 32, 40, 48, 56]

    def one(seq_len):
        return Client(app_url, verbose=False).predict(
            "inplace", "auto", 1, 2, seq_len, 16, "float32", "cpu", False, api_name="/profile"
        )

    with ThreadPoolExecutor(len(seq_lens)) as pool:
        results = list(pool.map(one, seq_lens))
    assert len({r[3] for r in results}) == len(seq_lens)  # one trace each
    spans = []
    for seq_len, (summary, _, _, trace_path, *_rest) in zip(seq_lens, results, strict=True):
        assert summary["seq_len"] == seq_len
        trace = load_trace(trace_path)
        dims = trace.events.query("name == 'aten::bmm'")["input_dims"]
        assert {d[0][1] for d in dims} == {seq_len}  # the recorded shapes are this request's
        forwards = trace.complete.query("name == 'attn_fwd'")
        spans.append((forwards["ts"].min(), forwards["end"].max()))
    spans.sort()
    # One device, one run at a time: no request's forwards overlap another's (same process clock).
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))


def test_endpoints_are_mcp_tools(app_url):
    import urllib.request

    with urllib.request.urlopen(app_url + "gradio_api/mcp/schema", timeout=slack(30)) as response:
        tools = {tool["name"]: tool for tool in json.loads(response.read())}
    assert {"profile", "compare", "sweep", "analyze", "analyze_job", "diff", "diff_traces", "trace_views"} <= set(tools)
    assert {"variant", "backend", "seq_len", "dtype"} <= set(tools["profile"]["inputSchema"]["properties"])


def test_share_never_shows_the_token(client, profiled, caplog, capfd):
    import logging

    caplog.set_level(logging.DEBUG)
    token = "hf_ClientSideSecret0123456789"
    with pytest.raises(AppError) as err:  # no machine here reaches the Hub; the failure path is what is tested
        client.predict(handle_file(profiled["naive"][3]), "alice/attention-traces", token, api_name="/share")
    assert str(err.value).startswith(("share:", "token:", "repo_id:"))
    out, errors = capfd.readouterr()
    for text in (str(err.value), caplog.text, out, errors):
        assert token not in text


def test_practitioner_parameters_through_the_client(client):
    """mode, kv_heads, q_len and mask, appended after the old parameters, with neutral defaults."""
    # GQA (4 query heads share 2 KV heads) copies K and V; MQA with one KV head would not: a stride-0
    # head dimension reshapes as a view and bmm reads it in place.
    summary, *_, insights = profile(client, "naive", mode="training", heads=4, kv_heads=2, seq_len=64)
    assert (summary["mode"], summary["kv_heads"], summary["q_len"]) == ("training", 2, 64)
    assert summary["kernels_per_backward"] > 0 and summary["saved_for_backward_bytes"] > 0
    assert "GQA copy" in insights and "Backward memory" in insights
    decode, *_ = profile(client, "sdpa", q_len=1, seq_len=256)
    assert decode["q_len"] == 1 and decode["backend_used"] == "flash"
    assert any(i.startswith("Decode is bandwidth-bound") for i in decode["insights"])
    window, *_ = profile(client, "sdpa", mask="sliding_window", window=16)
    assert window["window"] == 16 and window["mask"] == "sliding_window"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(mode="train"), "^mode: 'train' is not one of"),
        (dict(heads=4, kv_heads=3), r"^kv_heads: must divide heads \(4\)"),
        (dict(q_len=65), "^q_len: must be from 0 to 64"),
        (dict(mask="sliding_window", window=0), "^window: sliding_window needs a window"),
        (dict(mask="padding", valid_len="1,2,3"), "^valid_len: padding needs one length"),
    ],
)
def test_practitioner_parameters_are_validated_by_name(client, overrides, message):
    with pytest.raises(AppError, match=message):
        profile(client, "naive", **overrides)


def test_flex_training_is_refused_on_cpu_with_the_reason(client):
    with pytest.raises(AppError, match="^mode: "):
        profile(client, "flex", mode="training")


def test_compare_takes_the_new_parameters_and_shows_the_backend(client):
    rows, table, _ = client.predict(**{**SMALL, "q_len": 1}, api_name="/compare")
    flash = next(r for r in rows if (r["variant"], r["backend"]) == ("sdpa", "flash"))
    assert flash["q_len"] == 1 and flash["backend_used"] == "flash"
    assert "backend used" in table["headers"] and "backends that refuse this call" in table["headers"]


def test_decode_sweep_follows_q_len(client):
    rows, chart = client.predict(
        ["sdpa-flash"], "64,128", 1, 2, 32, "float32", "cpu", False, "inference", 0, 1, api_name="/sweep"
    )
    assert [(r["seq_len"], r["q_len"], r["status"]) for r in rows] == [(64, 1, "ok"), (128, 1, "ok")]
    guide = next(t for t in json.loads(chart["plot"])["data"] if str(t.get("name", "")).startswith("O("))
    assert guide["name"].startswith("O(q_len·S)")


def test_diff_traces_endpoint(client, tmp_path):
    """Two uploads of one job (naive, then in-place): the copy the change removed is in the diff, by name."""
    pair = DATA / "cpu_pair"
    found, text = client.predict(
        handle_file(str(pair / "before.json.gz")), handle_file(str(pair / "after.json.gz")), api_name="/diff_traces"
    )

    def calls(path: Path) -> dict[str, int]:  # a plain count of each cpu_op name in the raw JSON
        counts: dict[str, int] = {}
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
        for e in events:
            if e.get("cat") == "cpu_op" and e.get("ph") == "X":
                counts[e["name"]] = counts.get(e["name"], 0) + 1
        return counts

    before, after = calls(pair / "before.json.gz"), calls(pair / "after.json.gz")
    removed = {name for name in before if name not in after}
    assert removed and "aten::clone" in removed
    rows = {row["name"]: row for row in found["ops"]}
    assert {name for name, row in rows.items() if row["status"] == "removed"} == removed
    for name, row in rows.items():
        assert (row["calls before"], row["calls after"]) == (before.get(name, 0), after.get(name, 0)), name
    assert "aten::clone" in text and all(len(line) <= 120 for line in text.splitlines())
    assert json.dumps(found, allow_nan=False)  # JSON-native all through
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(AppError, match="^after:"):
        client.predict(handle_file(str(pair / "before.json.gz")), handle_file(str(bad)), api_name="/diff_traces")
