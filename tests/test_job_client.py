"""/analyze_job through a real Gradio server and gradio_client: a generated 4-rank job uploaded as files and as
one zip gives the CLI's view (`analyze_job` over the same files); hostile zips write nothing outside their
temporary folder and are refused naming `traces`; one bad rank is listed while the others are analysed; no
temporary file is left behind."""

from __future__ import annotations

import gzip
import json
import tempfile
import zipfile
from pathlib import Path

import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from bench import make_ranks
from profiling.cli_job import job_record
from profiling.job.run import analyze_job
from tests.conftest import ROOT

SOURCE = ROOT.parent / "shared" / "traces" / "hta_ranks" / "sampled_rank-0.json.gz"
STRAGGLER = 2
COMPARED = ("world_size", "missing_ranks", "per_rank", "per_step", "sync_wait", "sync_refused", "collectives")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    if not SOURCE.exists():
        pytest.skip(f"{SOURCE} (the shared HTA rank) is absent")
    out = tmp_path_factory.mktemp("job")
    return make_ranks.main([str(SOURCE), str(out), "--ranks", "4", "--straggler", str(STRAGGLER), "--factor", "1.5"])


@pytest.fixture(scope="module")
def cli_view(ranks: list[Path]) -> dict:
    return job_record(analyze_job(ranks))


def zipped(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(zipfile.ZipInfo(name), data)  # ZipInfo keeps the name as given, `..` and all
    return path


def job_temp_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("attention-profiler-job-*"))


def analyze(client, *paths: Path) -> tuple:
    return client.predict([handle_file(str(p)) for p in paths], api_name="/analyze_job")


def assert_same_view(summary: dict, cli: dict) -> None:
    for key in COMPARED:
        assert summary[key] == cli[key], key
    assert [f["title"] for f in summary["findings"]] == [f["title"] for f in cli["findings"]]
    assert summary["errors"] == {}


def test_files_and_zip_give_the_cli_view(client, ranks, cli_view, tmp_path):
    before = job_temp_folders()
    summary, per_rank, collectives, breakdown, steps, findings = analyze(client, *ranks)
    assert_same_view(summary, cli_view)
    assert [r["file"] for r in summary["ranks"]] == [p.name for p in ranks]  # names, never server paths
    assert [row[0] for row in per_rank["data"]] == [0, 1, 2, 3] and len(collectives["data"]) >= 1
    bars = json.loads(breakdown["plot"])["data"]
    assert [t["name"] for t in bars] == ["computation", "communication not overlapped", "overlap", "other"]
    assert len(json.loads(steps["plot"])["data"]) == 4  # one line per rank

    archive = zipped(tmp_path / "job.zip", {p.name: p.read_bytes() for p in ranks})
    from_zip, *_ = analyze(client, archive)
    assert_same_view(from_zip, cli_view)
    assert [r["file"] for r in from_zip["ranks"]] == [f"rank-entry-{i:02d}.json.gz" for i in range(4)]
    assert job_temp_folders() <= before  # the zip's files are gone


def test_the_straggler_is_found(client, ranks):
    summary, *_, findings = analyze(client, *ranks)
    stragglers = [f for f in summary["findings"] if f["title"].endswith("is a straggler")]
    assert [f["evidence"]["rank"] for f in stragglers] == [STRAGGLER]
    assert stragglers[0]["evidence"]["cause"] == "computation"
    assert f"Rank {STRAGGLER} is a straggler" in findings


def test_zip_slip_writes_nothing_outside(client, ranks, tmp_path):
    escaped = Path(tempfile.gettempdir()) / "evil.json"
    absolute = tmp_path / "absolute-evil.json"
    assert not escaped.exists() and not absolute.exists()
    archive = zipped(
        tmp_path / "slip.zip",
        {"../evil.json": ranks[0].read_bytes(), str(absolute): ranks[1].read_bytes(), "folder/": b""},
    )
    assert [i.filename for i in zipfile.ZipFile(archive).infolist()][:2] == ["../evil.json", str(absolute)]
    before = job_temp_folders()
    summary, *_ = analyze(client, archive)
    assert not escaped.exists() and not absolute.exists()
    assert [r["rank"] for r in summary["ranks"]] == [0, 1] and summary["errors"] == {}
    assert job_temp_folders() <= before


def test_more_than_64_traces_refused(client, tmp_path):
    archive = zipped(tmp_path / "many.zip", {f"rank-{i}.json": b'{"traceEvents": []}' for i in range(65)})
    with pytest.raises(AppError, match="^traces: the zip holds 65 traces; a job takes at most 64 ranks"):
        analyze(client, archive)


def test_too_much_json_in_all_refused(client, ranks, tmp_path, monkeypatch):
    """The 4 GiB cap on the job's JSON, lowered to 1 MiB (a rank here holds ~2 MiB): refused as the zip's
    entries stream out, and for files as they are counted; nothing left behind."""
    from profiling.job import uploads

    monkeypatch.setattr(uploads, "MAX_JOB_INFLATED_BYTES", 1024**2)
    before = job_temp_folders()
    archive = zipped(tmp_path / "big.zip", {p.name: p.read_bytes() for p in ranks})
    for given in ([archive], ranks):
        with pytest.raises(AppError, match="^traces: the job's traces hold more than 1 MiB of JSON in all"):
            analyze(client, *given)
    assert job_temp_folders() <= before


def test_gzip_bomb_entry_refused(client, tmp_path, monkeypatch):
    """A zip entry inflating past the cap: streamed through the reader's inflate step, which stops there."""
    from profiling.job import uploads

    monkeypatch.setattr(uploads, "MAX_JOB_INFLATED_BYTES", 8 * 1024**2)
    bomb = gzip.compress(b" " * (64 * 1024**2), compresslevel=9)  # 64 MiB of JSON whitespace in ~64 kB
    archive = zipped(tmp_path / "bomb.zip", {"rank-0.json.gz": bomb})
    with pytest.raises(AppError, match="^traces: the job's traces hold more than 8 MiB of JSON"):
        analyze(client, archive)


def test_one_bad_rank_listed_while_the_others_are_analysed(client, ranks, tmp_path):
    bad = tmp_path / "broken_rank-3.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X", "name": ')
    summary, per_rank, *_, findings = analyze(client, *ranks[:3], bad)
    assert list(summary["errors"]) == ["3"] and summary["errors"]["3"].startswith("trace:")
    assert [row[0] for row in per_rank["data"]] == [0, 1, 2]
    assert "Rank 3 failed" in findings
    assert [r["file"] for r in summary["ranks"]][3] == "broken_rank-3.json"


def test_no_trace_refused_naming_traces(client, tmp_path):
    archive = zipped(tmp_path / "empty.zip", {"notes.txt": b"hello", "folder/": b""})
    with pytest.raises(AppError, match=r"^traces: the zip holds no \.json or \.json\.gz trace \(2 other entries"):
        analyze(client, archive)


def test_a_rank_claimed_twice_refused_naming_traces(client, ranks):
    with pytest.raises(AppError, match="^traces: rank 0 is claimed by 2 files"):
        analyze(client, ranks[0], ranks[0])


def test_no_file_refused_naming_traces(client):
    with pytest.raises(AppError, match="^traces: upload"):
        client.predict([], api_name="/analyze_job")


def test_the_time_limit_bounds_the_whole_job_not_each_rank(ranks):
    """Each rank gets what is left of the job's limit; the ranks it leaves no time for carry that as their error.
    The clock is injected: the first rank starts at 0 s, and by the second 100 s have passed of a 60 s limit."""
    from profiling.job.uploads import analyze_job_uploads

    readings = iter([0.0, 0.0, 100.0, 100.0, 100.0])
    result = analyze_job_uploads(ranks, time_limit_s=60, clock=lambda: next(readings))
    analysed = [rank for rank, s in result.summaries.items() if s.error is None]
    assert len(analysed) == 1 and len(result.errors) == len(ranks) - 1
    assert all(error.startswith("time limit: the job's 60 s") for error in result.errors.values())
