"""The read's decode helper (profiling/reader_pool.py): batches shared between a forked process and this one,
the blocks in the batches' order whoever decoded them, an error raised in its batch's turn, and nothing left
running after a read, a failed read, a stopped read or a killed parent."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import profiling.reader as reader
import profiling.reader_pool as pool
from profiling.column_store import Columns
from profiling.reader import Limits, TraceError, decode_batch, read_text
from profiling.reader_pool import IN_FLIGHT, DecodeHelper
from tests.conftest import DATA
from tests.profiling.test_reader_typed import _same_read
from tests.timing_slack import TIMING_SLACK


@pytest.fixture
def helper_always(monkeypatch):
    """The decode helper from the first batch, on any machine."""
    monkeypatch.setattr(reader, "START_AFTER_BYTES", 0)
    monkeypatch.setattr(reader, "helper_wanted", lambda: True)


def _children() -> set[str]:
    return {c for task in Path("/proc/self/task").iterdir() for c in (task / "children").read_text().split()}


def _helper_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("trace-reader-")]


def _many_batches(copies: int = 3) -> bytes:
    events = json.loads(gzip.decompress((DATA / "sampled_training_rank0.json.gz").read_bytes()))["traceEvents"]
    return json.dumps({"traceEvents": events * copies}).encode()


def _batch(index: int) -> bytes:
    """Batch `index`: index + 1 events named after it, so each block says which batch it was."""
    return json.dumps([{"ph": "X", "name": f"b{index}", "ts": t, "dur": 1} for t in range(index + 1)]).encode()


def _wait_for(gate: Path) -> None:  # pragma: no cover - in the helper
    """Until the file `gate` exists, or 10 s (times the slack) pass: a test that never opens it fails, not hangs."""
    for _ in range(int(2000 * TIMING_SLACK)):
        if gate.exists():
            return
        time.sleep(0.005)


class Gated:
    """A decode that, in the helper, waits until the file `gate` exists, and raises for the batches `failing`;
    the batches it decodes in this process are recorded in `here`."""

    def __init__(self, gate: Path, failing: frozenset[int] = frozenset()) -> None:
        self.gate, self.failing, self.parent, self.here = gate, failing, os.getpid(), []

    def __call__(self, text: bytes, base: int) -> Any:
        index = len(json.loads(text)) - 1
        if os.getpid() == self.parent:
            self.here.append(index)
        else:  # pragma: no cover - in the helper
            _wait_for(self.gate)
        if index in self.failing:
            raise ValueError(f"batch {index} is bad")
        return decode_batch(text, base)


def test_blocks_come_back_in_the_batches_order_whoever_decoded_them(tmp_path):
    decode = Gated(tmp_path / "open")
    helper = DecodeHelper(decode)
    count = 3 * IN_FLIGHT
    try:
        done = [block for index in range(2 * IN_FLIGHT) for block in helper.submit(_batch(index), 0)]
        assert done == []  # the oldest batch is at the helper, which waits: nothing may come back before it
        # The helper took the first IN_FLIGHT, then was that far behind: this process decoded the next ones.
        assert decode.here == list(range(IN_FLIGHT, 2 * IN_FLIGHT))
        (tmp_path / "open").touch()
        # One more batch would leave more than 2 * IN_FLIGHT waiting: the oldest is waited for, and comes back.
        done += helper.submit(_batch(2 * IN_FLIGHT), 0)
        assert done
        for index in range(2 * IN_FLIGHT + 1, count):
            done += helper.submit(_batch(index), 0)
        done += helper.finish()
    finally:
        helper.close()
    assert [block.rows for block in done] == [index + 1 for index in range(count)]
    assert [block.texts["name"][1][0] for block in done] == [f"b{index}" for index in range(count)]


def test_an_error_is_raised_in_its_batchs_turn(tmp_path):
    # Batch 1 fails at the helper, later; batches decoded here fail first in time, but come after it.
    decode = Gated(tmp_path / "open", failing=frozenset(range(1, 3 * IN_FLIGHT)))
    helper = DecodeHelper(decode)
    try:
        for index in range(2 * IN_FLIGHT):
            assert list(helper.submit(_batch(index), 0)) == []
        assert decode.here and min(decode.here) > 1  # those failed here, first
        (tmp_path / "open").touch()
        with pytest.raises(ValueError, match="^batch 1 is bad$"):
            list(helper.finish())
    finally:
        helper.close()


@pytest.mark.timeout(120)
def test_a_helper_that_dies_is_reported_and_asking_again_does_not_wait(tmp_path):
    def die_in_the_helper(text: bytes, base: int) -> Any:
        if os.getpid() != parent:
            os._exit(3)
        return decode_batch(text, base)

    parent = os.getpid()
    helper = DecodeHelper(die_in_the_helper)
    try:
        list(helper.submit(_batch(0), 0))
        list(helper.submit(_batch(1), 0))
        with pytest.raises(RuntimeError, match="decode helper died"):
            list(helper.finish())
        # The second batch was out at the dead helper too: its turn raises again, and does not wait forever.
        with pytest.raises(RuntimeError, match="decode helper died"):
            list(helper.finish())
    finally:
        helper.close()
    helper.close()  # twice is harmless: the helper is reaped once
    assert not _helper_threads()


def test_a_helper_whose_threads_cannot_start_is_reaped(monkeypatch):
    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    before = _children()
    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        DecodeHelper(decode_batch)
    assert _children() == before


def test_a_cap_on_one_block_is_raised_before_a_later_batchs_error(helper_always):
    # Blocks are handed over one at a time: the cap that a block breaks is raised before a later batch's
    # outcome (here, not JSON) is taken, as in a read by one process.
    events = [{"ph": "X", "name": "x" * 40, "ts": t, "dur": 1, "pid": 1, "tid": 1} for t in range(200_000)]
    good = json.dumps({"traceEvents": events}).encode()
    at = good.rfind(b"}, {", 0, len(good) - len(good) // 40)  # bad JSON in the last 2.5% of the events
    bad = good[:at] + b"@" + good[at:]
    limits = Limits(events=180_000)  # broken by the block that holds the 90%
    with pytest.raises(TraceError) as one_process:
        read_text(bad, limits, typed=False)
    assert "events" in str(one_process.value) and "JSON" not in str(one_process.value)
    with pytest.raises(TraceError) as with_helper:
        read_text(bad, limits)
    assert str(with_helper.value) == str(one_process.value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("in_flight", [1, IN_FLIGHT])
def test_the_helper_process_reads_what_one_process_reads(helper_always, monkeypatch, tmp_path, in_flight):
    # The helper waits until this process has decoded a batch itself (which it does once IN_FLIGHT batches
    # are out), so both sides decode some, whatever the machine's speed; the blocks still merge in order.
    monkeypatch.setattr(pool, "IN_FLIGHT", in_flight)
    gate, parent, here = tmp_path / "open", os.getpid(), []

    def decode_after_one_here(
        text: bytes, base: int, source: str = "trace", typed: bool = True, native: bool = False
    ) -> Any:
        if os.getpid() == parent:
            here.append(len(text))
            gate.touch()
        else:  # pragma: no cover - in the helper
            _wait_for(gate)
        return decode_batch(text, base, source, typed, native)

    monkeypatch.setattr(reader, "decode_batch", decode_after_one_here)
    data = _many_batches(4)
    before = _children()
    read = read_text(data)
    assert here  # this process decoded some batches...
    assert sum(here) < len(data)  # ...and the helper the others
    _same_read(read, read_text(data, typed=False))
    assert _children() == before  # the helper was reaped
    assert not _helper_threads()  # and the threads that fed it are gone


def test_an_error_in_a_helper_batch_is_raised_and_the_helper_reaped(helper_always):
    good = _many_batches(2)
    bad = good[: len(good) // 2] + b"}}{" + good[len(good) // 2 :]  # valid structure to the scan, not JSON
    before = _children()
    with pytest.raises(TraceError):
        read_text(bad)
    assert _children() == before
    assert not _helper_threads()


def test_a_helper_stops_when_the_reader_is_stopped(helper_always):
    # The time limit and a leaving client stop a read by raising from the progress callback, between chunks.
    data = _many_batches()
    seen: list[set[str]] = []

    def chunks() -> Any:
        for at in range(0, len(data), 1 << 20):
            if at > 2 << 20:
                seen.append(_children())
                raise TimeoutError("time limit")
            yield data[at : at + (1 << 20)]

    before = _children()
    with pytest.raises(TimeoutError):
        reader._read(chunks(), Limits(), "trace")
    assert seen and seen[0] - before  # a helper ran...
    assert _children() == before  # ...and is gone
    assert not _helper_threads()


def test_a_helper_exits_when_its_parent_is_killed():
    code = (
        "import os\n"
        "import profiling.reader_pool as pool\n"
        "h = pool.DecodeHelper(lambda text, base: None)\n"
        "print(h.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=DATA.parents[1])
    pid = int(done.stdout.split()[0])
    for _ in range(int(100 * TIMING_SLACK)):  # the orphan is reparented; it must leave once its socket closes
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the helper outlived its parent")


def test_a_block_travels_without_its_parsed_values_and_reads_the_same():
    # Object args that repeat (a shape, a type list) and ones only a later batch holds, a float, non-ASCII text.
    shapes = [[[2, 3], []], [[4]], [[2, 3], []], [["ñ", 1.5e-7]]]

    def op(i: int, dims: Any) -> dict[str, Any]:
        return {"ph": "X", "name": "op", "ts": i, "dur": 1, "args": {"Input Dims": dims}}

    batches = [json.dumps([op(i, d) for i, d in enumerate(part)]) for part in (shapes[:2], shapes[2:], [[[4]], None])]
    blocks = [decode_batch(text.encode(), 0) for text in batches]
    sent = [pickle.loads(pickle.dumps(block, protocol=5)) for block in blocks]
    assert all(values is None for block in sent for _, _, values in block.objects.values())
    codes, keys, _ = sent[0].objects["input_dims"]
    assert codes.tolist() == blocks[0].objects["input_dims"][0].tolist() and keys == blocks[0].objects["input_dims"][1]
    direct, travelled = Columns(Limits()), Columns(Limits())
    for block, wire in zip(blocks, sent, strict=True):
        direct.append(block, 1000)
        travelled.append(wire, 1000)
    expected, got = direct.arrays()["input_dims"], travelled.arrays()["input_dims"]
    assert list(got) == list(expected) == [[[2, 3], []], [[4]], [[2, 3], []], [["ñ", 1.5e-7]], [[4]], None]
    assert got[0] is got[2]  # equal values stay one object


def test_a_real_traces_blocks_travel_in_fewer_bytes_and_read_the_same():
    # Numbers missing in every row travel as None and codes as int32; the columns built from them are the same.
    splitter = reader.Splitter(Limits())
    data = gzip.decompress((DATA / "sampled_training_rank0.json.gz").read_bytes())
    batches = [batch for chunk in _chunks(data) for batch in splitter.feed(chunk)]
    blocks = [decode_batch(batch, 0) for batch in batches]
    sent = [pickle.loads(pickle.dumps(block, protocol=5)) for block in blocks]
    empty = {name for block in sent for name, values in block.numbers.items() if values is None}
    assert {"addr", "python_id"} <= empty and "ts" not in empty  # a training trace without memory or Python events
    assert all(codes.dtype.itemsize == 4 for block in sent for codes, _ in block.texts.values())
    direct, travelled = Columns(Limits()), Columns(Limits())
    for block, wire in zip(blocks, sent, strict=True):
        direct.append(block, 10**6)
        travelled.append(wire, 10**6)
    expected, got = direct.arrays(), travelled.arrays()
    assert expected.keys() == got.keys()
    for name, column in expected.items():
        assert got[name].dtype == column.dtype, name
        assert pd.Series(got[name]).equals(pd.Series(column)), name


def _chunks(data: bytes, size: int = 256 * 1024) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]
