"""Per-request directories, bounded by count and age; only our files are ours."""

import os
import time

from profiling.storage import RunStore


def test_count_limit_bounds_disk(tmp_path):
    store = RunStore(tmp_path, max_runs=3)
    for _ in range(7):
        run = store.new_dir()
        (run / "trace.json").write_bytes(b"x" * 1000)
    assert len(store.runs()) == 3
    assert store.disk_bytes() == 3000


def test_age_limit(tmp_path):
    store = RunStore(tmp_path, max_runs=10, max_age_s=60)
    old = store.new_dir()
    past = time.time() - 120
    os.utime(old, (past, past))
    fresh = store.new_dir()
    assert old not in store.runs() and fresh in store.runs()


def test_only_files_inside_runs_are_owned(tmp_path):
    store = RunStore(tmp_path / "store")
    run = store.new_dir()
    (run / "t.json").write_text("{}")
    (tmp_path / "outside.json").write_text("{}")
    assert store.owns(run / "t.json")
    assert not store.owns(run / ".." / ".." / "outside.json")
    assert not store.owns("/etc/passwd")
    assert not store.owns(run)  # a directory is not a file to serve


def test_prune_leaves_foreign_directories_alone(tmp_path):
    (tmp_path / "keep-me").mkdir()
    store = RunStore(tmp_path, max_runs=1)
    store.new_dir(), store.new_dir()
    assert (tmp_path / "keep-me").is_dir() and len(store.runs()) == 1
