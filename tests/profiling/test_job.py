"""A whole job: a generated 4-rank job with a known straggler and the two shared real ranks, checked against
plain loops over their raw events (tests/job_oracle.py); rank numbering, duplicates, missing and bad ranks;
the process pool and Dask giving the same answer."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench import make_ranks
from profiling import kernels
from profiling.job.distributed import collective_table
from profiling.job.rank_summary import RankSummary, summarize_rank
from profiling.job.ranks import DuplicateRankError, JobError, assign_ranks
from profiling.job.run import JobResult, analyze_job, job_files
from tests import job_oracle
from tests.conftest import ROOT
from tests.gpu_oracle import is_collective, load
from tests.test_layering import imports

REAL_RANKS = ROOT.parent / "shared" / "traces" / "hta_ranks"
SOURCE = REAL_RANKS / "sampled_rank-0.json.gz"
STRAGGLER = 2
needs_real = pytest.mark.skipif(not SOURCE.exists(), reason=f"{REAL_RANKS} (the shared HTA ranks) is absent")


def generate(out: Path, ranks: int = 4, *extra: str) -> list[Path]:
    args = [str(SOURCE), str(out), "--ranks", str(ranks), "--straggler", str(STRAGGLER), "--factor", "1.5", *extra]
    return make_ranks.main(args)


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SOURCE.exists():
        pytest.skip(f"{REAL_RANKS} (the shared HTA ranks) is absent")
    out = tmp_path_factory.mktemp("job")
    generate(out)
    return out


@pytest.fixture(scope="module")
def job(job_dir: Path) -> JobResult:
    return analyze_job(job_files(str(job_dir)))


def assert_matches_oracle(result: JobResult, paths: dict[int, Path]) -> None:
    """Per step parts and sync wait equal to the plain loops', rank by rank."""
    raws = {rank: load(path) for rank, path in paths.items()}
    for rank, raw in raws.items():
        ours = result.view.per_step[result.view.per_step["rank"] == rank].drop(columns="rank").to_dict("records")
        expected = job_oracle.step_parts(raw)
        assert [r["step"] for r in ours] == [r["step"] for r in expected]
        for mine, theirs in zip(ours, expected, strict=True):
            for part in ("step_us", "computation", "communication", "overlap", "other"):
                assert mine[part] == pytest.approx(theirs[part], rel=1e-9, abs=1e-3), (rank, part)
    wait = job_oracle.sync_wait({rank: job_oracle.collective_durations(raw) for rank, raw in raws.items()})
    got = result.view.sync.set_index("rank")["wait_us"].to_dict()
    assert got == pytest.approx(wait, abs=1e-3)


def test_generated_job_matches_plain_loops(job: JobResult, job_dir: Path) -> None:
    assert job.errors == {} and job.ranks.world_size == 4 and job.ranks.missing == []
    assert [r.source for r in job.ranks.ranks] == ["distributedInfo"] * 4
    assert_matches_oracle(job, {r: job_dir / f"job_rank-{r}.json.gz" for r in range(4)})


def test_straggler_found_as_the_plain_loop_finds_it(job: JobResult, job_dir: Path) -> None:
    means = {}
    for rank in range(4):
        steps = job_oracle.step_parts(load(job_dir / f"job_rank-{rank}.json.gz"))
        means[rank] = sum(s["step_us"] for s in steps) / len(steps)
    assert job_oracle.stragglers(means) == [STRAGGLER]
    found = [f for f in job.view.findings if f.title.endswith("is a straggler")]
    assert [f.evidence["rank"] for f in found] == [STRAGGLER]
    assert found[0].evidence["cause"] == "computation"  # the generator stretched its compute kernels
    assert found[0].evidence["step_us"] == pytest.approx(means[STRAGGLER])


def test_collectives_table_counts_every_rank(job: JobResult, job_dir: Path) -> None:
    calls = sum(len(job_oracle.collective_durations(load(p))) for p in sorted(job_dir.iterdir()))
    assert job.view.collectives["calls"].sum() == calls
    total = sum(sum(job_oracle.collective_durations(load(p))) for p in sorted(job_dir.iterdir()))
    assert job.view.collectives["total_us"].sum() == pytest.approx(total)
    assert job.view.collectives["bytes"].isna().all()  # these NCCL kernels carry no message size: unknown, not 0


@needs_real
def test_real_ranks_match_plain_loops() -> None:
    paths = {0: SOURCE, 1: REAL_RANKS / "sampled_rank-1.json.gz"}
    result = analyze_job(job_files(str(REAL_RANKS)))
    assert result.ranks.world_size == 128 and result.ranks.missing == list(range(2, 128))
    assert_matches_oracle(result, paths)
    raw = load(SOURCE)
    comm = job_oracle.union((k["ts"], job_oracle.end(k)) for k in raw.kernels if job_oracle.is_collective(k["name"]))
    comp = job_oracle.union((k["ts"], job_oracle.end(k)) for k in raw.kernels if job_oracle.is_computation(k["name"]))
    hta = 100 * job_oracle.intersection(comm, comp) / job_oracle.length(comm)
    assert result.summaries[0].overlap_percent == pytest.approx(hta)


def test_duplicate_ranks_are_refused_naming_the_files(job_dir: Path, tmp_path: Path) -> None:
    shutil.copy(job_dir / "job_rank-1.json.gz", tmp_path / "a.json.gz")
    shutil.copy(job_dir / "job_rank-1.json.gz", tmp_path / "b.json.gz")
    with pytest.raises(DuplicateRankError, match=r"rank 1 .*a\.json\.gz.*b\.json\.gz"):
        analyze_job(job_files(str(tmp_path)))


def test_missing_ranks_are_listed(job_dir: Path, tmp_path: Path) -> None:
    for rank in (0, 2, 3):
        shutil.copy(job_dir / f"job_rank-{rank}.json.gz", tmp_path)
    result = analyze_job(job_files(str(tmp_path / "*.json.gz")))
    assert result.ranks.missing == [1] and sorted(result.summaries) == [0, 2, 3]


def test_ranks_from_names_then_from_order() -> None:
    by_name = assign_ranks(["x/trace_rank_7.json", "x/rank-3.json"], [None, None])
    assert [(r.rank, r.source) for r in by_name.ranks] == [(3, "file name"), (7, "file name")]
    by_order = assign_ranks(["b.json", "a.json"], [None, {"rank": True}])  # a bool is no rank
    assert [(r.path, r.rank, r.source) for r in by_order.ranks] == [("a.json", 0, "order"), ("b.json", 1, "order")]
    mixed = assign_ranks(["c.json", "b.json", "a.json"], [{"rank": 0}, None, None])
    assert [(r.path, r.rank, r.source) for r in mixed.ranks] == [
        ("c.json", 0, "distributedInfo"),
        ("a.json", 1, "order"),
        ("b.json", 2, "order"),
    ]
    hostile = assign_ranks(["r0.json"], [{"rank": 0, "world_size": 10**12}])
    assert hostile.world_size is None and hostile.missing == []
    with pytest.raises(JobError, match="at most 64"):
        assign_ranks([f"r{i}.json" for i in range(65)], [None] * 65)


def test_a_bad_rank_is_listed_and_the_job_goes_on(job_dir: Path, tmp_path: Path) -> None:
    for rank in (0, 1, 2):
        shutil.copy(job_dir / f"job_rank-{rank}.json.gz", tmp_path)
    (tmp_path / "job_rank-3.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [1, 2'))
    seen: list[float] = []
    result = analyze_job(job_files(str(tmp_path)), progress=lambda fraction, _: seen.append(fraction))
    assert list(result.errors) == [3] and "JSON" in result.errors[3]
    assert sorted(result.view.per_rank["rank"]) == [0, 1, 2]
    assert sorted(seen) == [0.25, 0.5, 0.75, 1.0]


def test_process_pool_and_dask_agree(job: JobResult, job_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("dask.distributed")
    assert job.engine == "dask"
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import fails: the process pool runs
    pool = analyze_job(job_files(str(job_dir)))
    assert pool.engine == "process pool"
    for name in ("per_step", "per_rank", "sync", "collectives"):
        pd.testing.assert_frame_equal(getattr(pool.view, name), getattr(job.view, name))
    assert pool.view.findings == job.view.findings
    assert json.dumps([s.record() for s in pool.summaries.values()]) == json.dumps(
        [s.record() for s in job.summaries.values()]
    )


def test_sync_wait_is_refused_when_counts_differ(job_dir: Path, tmp_path: Path) -> None:
    shutil.copy(job_dir / "job_rank-0.json.gz", tmp_path)
    data = json.loads(gzip.decompress((job_dir / "job_rank-1.json.gz").read_bytes()))
    kernels = [e for e in data["traceEvents"] if str(e.get("name", "")).startswith("ncclKernel")]
    data["traceEvents"].remove(kernels[-1])  # rank 1 now ran one collective fewer
    (tmp_path / "job_rank-1.json").write_text(json.dumps(data))
    result = analyze_job(job_files(str(tmp_path)))
    assert result.view.sync is None and "different numbers of collectives" in result.view.sync_refused


def test_message_bytes_as_the_kernels_args_give_them() -> None:
    """The B200 rank's NCCL kernels carry In/Out msg nelems and dtype: bytes = the larger message × item size."""
    path = ROOT / "tests" / "data" / "gpu" / "b200_vllm_gpt-oss_eager_rank0.json.gz"
    itemsize = {"BFloat16": 2, "Float": 4, "Half": 2, "Long": 8, "Int": 4}
    expected = []
    for k in sorted(load(path).kernels, key=lambda k: k["ts"]):
        args = k["args"]
        if "In msg nelems" in args and "Out msg nelems" in args and args.get("dtype") in itemsize:
            expected.append(max(args["In msg nelems"], args["Out msg nelems"]) * itemsize[args["dtype"]])
    summary = summarize_rank(path)
    assert expected and [c["bytes"] for c in summary.collectives if c["bytes"] is not None] == expected
    oracle = [k for k in load(path).kernels if is_collective(k["name"])]
    assert len(summary.collectives) == len(oracle)
    table = collective_table({0: summary})
    assert table["bytes"].sum() == sum(expected)
    assert {"multimem_all_reduce_kernel", "ncclDevKernel_AllGather_RING_LL"} <= set(table["op"])
    gather = table.set_index("op").loc["ncclDevKernel_AllGather_RING_LL"]
    sizes = [c["bytes"] for c in summary.collectives if c["name"].startswith("ncclDevKernel_AllGather_RING_LL(")]
    durations = [c["dur_us"] for c in summary.collectives if c["name"].startswith("ncclDevKernel_AllGather_RING_LL(")]
    assert gather["algbw_GBps"] == pytest.approx(sum(sizes) / sum(durations) / 1e3)  # bytes/µs -> GB/s


def test_job_package_imports_no_ui() -> None:
    """profiling/job reads traces on workers with nothing but the analysis: never gradio, plotly or the app."""
    allowed = {"numpy", "pandas", "profiling", "attention", "dask", "distributed"}
    for path in (ROOT / "profiling" / "job").glob("*.py"):
        assert imports(path) - set(sys.stdlib_module_names) <= allowed, path.name


def test_generated_ranks_keep_every_event_and_link(job_dir: Path) -> None:
    """The generator moves time and ids, never events: each rank has the source's events, its ids offset
    (launch and kernel still share a correlation id), and its events in their original time order."""
    source = json.loads(gzip.decompress(SOURCE.read_bytes()))["traceEvents"]
    rank = json.loads(gzip.decompress((job_dir / "job_rank-3.json.gz").read_bytes()))
    events = rank["traceEvents"]
    assert rank["distributedInfo"] == {"backend": "nccl", "rank": 3, "world_size": 4}
    assert [e.get("name") for e in events] == [e.get("name") for e in source]
    launched = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert all(k["args"]["correlation"] in launched for k in kernels)
    assert min(k["args"]["correlation"] for k in kernels) >= 3 * make_ranks.ID_STRIDE
    timed = sorted((i for i, e in enumerate(source) if "ts" in e), key=lambda i: source[i]["ts"])
    moved = [events[i]["ts"] for i in timed]
    assert moved == sorted(moved)  # one clock, stretched: whatever came first still does


def test_a_job_of_many_collective_names_decodes_only_those_with_the_most_time() -> None:
    """A crafted job may name every collective call apart: the table decodes the 1,000 with the most time."""
    names = [f"ncclDevKernel_AllReduce_{i}(int, float*)" for i in range(kernels.MAX_NAMES_DECODED + 5)]
    calls = [{"name": name, "dur_us": 1.0 + i, "bytes": None} for i, name in enumerate(names)]
    kernels._decode.cache_clear()
    table = collective_table(
        {0: RankSummary(path="a", collectives=calls[:600]), 1: RankSummary(path="b", collectives=calls[600:])}
    )
    assert kernels._decode.cache_info().misses <= kernels.MAX_NAMES_DECODED
    least = set(names[:5])  # the five calls with the least time keep their whole name; the rest lose the parameters
    assert set(table["op"]) == least | {name.split("(")[0] for name in names[5:]}
    assert table["calls"].sum() == len(calls) and table["total_us"].sum() == sum(c["dur_us"] for c in calls)
