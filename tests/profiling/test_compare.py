"""Compare, diff and sweep on real CPU runs."""

import pytest

from attention import AttentionSpec, SpecError
from profiling.compare import compare, compare_table
from profiling.diff import diff_summaries
from profiling.sweep import sweep


def test_compare_runs_every_variant_and_explains_the_missing(tmp_path):
    rows = compare(AttentionSpec(seq_len=128, device="cpu"), tmp_path)
    by_name = {(r["variant"], r["backend"]): r for r in rows}
    assert ("naive", "auto") in by_name and ("sdpa", "flash") in by_name
    assert "only on CUDA" in by_name[("sdpa", "efficient")]["error"]
    assert len(list(tmp_path.glob("*.json"))) == len([r for r in rows if "error" not in r])
    assert by_name[("naive", "auto")]["speedup_vs_naive"] == 1.0
    table = compare_table(rows)
    assert table.loc[table["run"] == "sdpa-cudnn", "what the trace revealed"].iloc[0].startswith("unavailable: ")
    assert "forward device (ms)" not in table  # a CPU run has no device time to show
    assert table.loc[table["run"] == "naive", "kernels/forward"].iloc[0] == 6


def test_diff_naive_to_inplace_is_one_clone_and_its_bytes(cpu_runs):
    diff = diff_summaries(cpu_runs["naive"].summary, cpu_runs["inplace"].summary)
    clone = diff[(diff["kind"] == "op") & (diff["name"] == "aten::clone")].iloc[0]
    assert (clone["change"], clone["status"]) == (-1, "removed")
    copies = diff[diff["name"] == "copied bytes per forward"].iloc[0]
    assert copies["change"] == -(1 * 4 * 256 * 256 * 4)
    kernels = diff[diff["name"] == "kernels per forward"].iloc[0]
    assert kernels["change"] == -1


def test_diff_math_to_flash_removes_the_mask(cpu_runs):
    diff = diff_summaries(cpu_runs["math"].summary, cpu_runs["flash"].summary)
    removed = set(diff[diff["status"] == "removed"]["name"])
    assert {"aten::tril", "aten::_safe_softmax"} <= removed
    added = set(diff[diff["status"] == "added"]["name"])
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in added


def test_sweep_stops_a_variant_before_the_guard_would_refuse_it(tmp_path):
    base = AttentionSpec(heads=2, head_dim=32, device="cpu")
    naive_512 = base.replace(seq_len=512).estimated_bytes()
    flash_512 = base.replace(variant="sdpa", backend="flash", seq_len=512).estimated_bytes()
    budget = (naive_512 + flash_512) // 2  # naive outgrows it at 512, the fused kernel does not
    rows = sweep(base, [("naive", "auto"), ("sdpa", "flash")], [64, 256, 512], tmp_path, budget_bytes=budget)
    naive = [r for r in rows if r["run"] == "naive"]
    assert [(r["seq_len"], r["status"]) for r in naive] == [(64, "ok"), (256, "ok"), (512, "stopped")]
    assert "over the" in naive[-1]["reason"]
    flash = [r for r in rows if r["run"] == "sdpa-flash"]
    assert [r["status"] for r in flash] == ["ok", "ok", "ok"]  # fused: no score matrix to outgrow
    assert all(r["forward_ms"] > 0 for r in rows if r["status"] == "ok")


def test_sweep_refuses_too_many_points(tmp_path):
    with pytest.raises(SpecError, match="^seq_lens:"):
        sweep(AttentionSpec(device="cpu"), [("naive", "auto")], list(range(1, 200)), tmp_path)


def test_compare_and_sweep_share_one_time_limit(tmp_path):
    """A comparison holds the device for one limit in all, not one per run."""
    rows = compare(AttentionSpec(seq_len=64, device="cpu"), tmp_path, time_limit_s=0.0)
    assert rows and all("time limit" in r["error"] for r in rows if "error" in r)
    assert not list(tmp_path.glob("*.json"))
    points = sweep(AttentionSpec(device="cpu"), [("naive", "auto")], [32, 64], tmp_path, time_limit_s=0.0)
    assert [p["status"] for p in points] == ["stopped"] and "time limit" in points[0]["reason"]


def test_sweep_names_its_limits(tmp_path):
    with pytest.raises(SpecError, match=r"^seq_lens: give 1 to 32 seq_len values for 2 variant\(s\)"):
        sweep(AttentionSpec(device="cpu"), [("naive", "auto"), ("inplace", "auto")], list(range(1, 40)), tmp_path)
    with pytest.raises(SpecError, match="^variants: give at least one"):
        sweep(AttentionSpec(device="cpu"), [], [64], tmp_path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("per_forward_ops", {"aten::mm": float("nan")}), ("per_forward_ops", ["x"]), ("peak_memory_bytes", "big")],
)
def test_diff_refuses_wrong_typed_fields_by_name(cpu_runs, field, value):
    from profiling.diff import DiffError

    bad = {**cpu_runs["naive"].summary, field: value}
    with pytest.raises(DiffError, match=f"^after: {field}"):
        diff_summaries(cpu_runs["naive"].summary, bad)
