"""`python -m profiling diff A B [--json]` on the CPU pair (tests/data/cpu_pair), checked against the raw JSON."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from profiling.__main__ import main
from tests.conftest import ROOT

PAIR = ROOT / "tests" / "data" / "cpu_pair"
BEFORE, AFTER = PAIR / "before.json.gz", PAIR / "after.json.gz"
ESCAPE = "\x1b]0;pwned\x07"


def _op_calls(path: Path) -> Counter[str]:
    with gzip.open(path) as raw:
        events = json.load(raw)["traceEvents"]
    return Counter(e["name"] for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X")


def test_json_has_every_row_with_its_delta(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(BEFORE), str(AFTER), "--json"]) == 0
    diff = json.loads(capsys.readouterr().out)
    a, b = _op_calls(BEFORE), _op_calls(AFTER)
    rows = {row["name"]: row for row in diff["ops"]}
    assert {n for n, r in rows.items() if r["status"] == "removed"} == set(a) - set(b)
    assert {n for n, r in rows.items() if r["status"] == "added"} == set(b) - set(a)
    for name in set(a) | set(b):
        if name in rows:
            assert rows[name]["Δ calls"] == b[name] - a[name], name
    assert {"steps", "gpu_metrics", "regressions", "counts", "kernels"} <= set(diff)


def test_text_is_a_table_within_120_columns() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "profiling", "diff", str(BEFORE), str(AFTER)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120
    assert any(line.split()[:2] == ["removed", "aten::masked_fill"] for line in lines)
    assert any(line.strip().startswith("step time (us)") for line in lines)


def test_bad_inputs_exit_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(tmp_path), str(AFTER)]) == 2
    assert "before:" in capsys.readouterr().err
    assert main(["diff", str(BEFORE), str(tmp_path)]) == 2
    assert "after:" in capsys.readouterr().err
    assert main(["diff", str(BEFORE), str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("error: after: cannot read missing.json")
    (tmp_path / "bad.json").write_text('{"traceEvents": 5}')
    assert main(["diff", str(tmp_path / "bad.json"), str(AFTER)]) == 2
    assert capsys.readouterr().err.startswith("error: before: ")


def test_names_reach_the_terminal_without_escapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An op name carrying a terminal escape (a retitle) is printed without it, in the table and in --json."""
    with gzip.open(AFTER) as raw:
        events = json.load(raw)["traceEvents"]
    for event in events:
        if event.get("name") == "aten::bmm":
            event["name"] = f"aten::bmm{ESCAPE}"
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps({"traceEvents": events}))
    for flags in ([], ["--json"]):
        assert main(["diff", str(BEFORE), str(hostile), *flags]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and "pwned" not in out  # the whole OSC string dropped
        assert "aten::bmm" in out
