"""`relative_times` (profiling/timestamps.py): a batch's `ts` read from their own texts relative to a base, against
the route it replaces, `rebased` text parsed by msgspec, and against exact decimals (`Decimal`)."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiling import decode
from profiling.reader import read_text
from profiling.timestamps import REBASE_MARGIN_US, rebased, relative_times

BASE = 1_700_000_000_000_000 - REBASE_MARGIN_US  # as `Rebase` decides it for a 2023 epoch trace


def _parsed_after_rewrite(texts: list[bytes], base: int) -> list[float]:
    """What the reader read before: the batch's text rewritten by `rebased`, then parsed."""
    batch = b"[" + b",".join(b'{"ts":' + t + b"}" if t else b"{}" for t in texts) + b"]"
    events = msgspec.json.decode(rebased(batch, base))
    return [e.get("ts", math.nan) for e in events]


def _same(have: list[float] | None, want: list[float]) -> bool:
    if have is None or len(have) != len(want):
        return False
    return all(h == w or (math.isnan(h) and math.isnan(w)) for h, w in zip(have, want, strict=True))


# Kineto's `%d.%03d` and its relatives: whole µs at or past the base, then 0 to 6 fraction digits.
_time = st.builds(
    lambda whole, digits, fraction: (b"%d" % whole) + (b".%0*d" % (digits, fraction % 10**digits) if digits else b""),
    st.integers(BASE, 10**17 - 1),
    st.integers(0, 6),
    st.integers(0, 10**6),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_time, st.just(b"")), max_size=40))
def test_equals_the_rewritten_text_parsed(texts):
    have, want = relative_times(texts, BASE), _parsed_after_rewrite(texts, BASE)
    if have is None:  # refused only where a scaled value passes 2**53: the caller rewrites the text then
        assert any(t and int(t.split(b".")[0]) - BASE >= 2**53 // 10 ** len(t.partition(b".")[2]) for t in texts)
    else:
        assert _same(have, want)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**12), st.integers(0, 999))
def test_a_kineto_time_is_the_exact_decimal_rounded_once(offset, ns):
    text = b"%d.%03d" % (BASE + offset, ns)
    exact = Decimal(text.decode()) - BASE
    assert relative_times([text], BASE) == [float(exact)]  # float(Decimal) rounds correctly, once


@pytest.mark.parametrize(
    "texts",
    [
        [b"1700000000000001.5e3"],  # an exponent
        [b"-1700000000000001.5"],  # a minus sign
        [b'"1700000000000001.5"'],  # text
        [b"null"],
        [b"1698999999999999.5"],  # before the base
        [b"123456789012345678.5"],  # 18 whole digits: past MAX_TIME_US
        [b"1700000000000001." + b"1" * 16],  # 16 fraction digits
        [b"1700000000000001.5", b"1700000000000001.5x"],  # one odd value among plain ones
        [b"17000000000000.012", b"1700000000000.0123"],  # one length, the point moves
        [b"01700000000000001.5"],  # a leading zero: not JSON
        [b"1700000000000001."],  # a point without digits after it: not JSON
        [b"17:0000000000001.5"],  # the byte after "9"
        [b"1700000000000001.5", b"1700000000000001:5"],  # the point's place holds another byte in one value
        [b"1700000000000001.0000000000000001"],  # 16 fraction digits
    ],
)
def test_what_is_not_written_alike_is_left_to_the_rewrite(texts):
    assert relative_times(texts, BASE) is None


@pytest.mark.parametrize(
    ("texts", "want"),
    [
        ([b"0", b"7"], [0.0, 7.0]),  # one digit, a zero too
        ([b"0.5"], [0.5]),
        ([b"05"], None),  # a leading zero: not JSON
        ([b".5"], None),  # no whole digits: not JSON
        ([b"-5"], None),
    ],
)
def test_small_values_on_a_zero_base(texts, want):
    assert relative_times(texts, 0) == want


_SPAN = 2**53  # the values read exactly: a whole number of 10**-scale µs below it


@pytest.mark.parametrize(
    ("text", "exact"),
    [
        (b"%d" % (BASE + _SPAN - 1), True),  # 17 whole digits, the largest whole number read
        (b"%d" % (BASE + _SPAN), False),
        (b"%d.999" % (BASE + _SPAN // 1000 - 1), True),  # the largest read with three fraction digits
        (b"%d.000" % (BASE + _SPAN // 1000), False),
        (b"%d.%s" % (BASE, b"9" * 15), True),  # 15 fraction digits
        (b"%d.5" % (BASE + 2**64), False),  # 20 whole digits, which int64 would wrap back to the base
        (b"%d.%s" % (BASE, b"0" * 16), False),  # 16 fraction digits: 10**16 alone passes 2**53
    ],
)
def test_read_exactly_up_to_2_53_and_refused_past_it(text: bytes, exact: bool) -> None:
    have = relative_times([text], BASE)
    if exact:
        assert have == [float(Decimal(text.decode()) - BASE)]
    else:
        assert have is None


def test_past_max_time_us_is_left_to_the_rewrite_which_reads_it_as_missing():
    base = 10**17 - REBASE_MARGIN_US  # a first time just under MAX_TIME_US gives this base
    value = b"100000000000000000.5"  # 18 whole digits, half a µs past MAX_TIME_US
    assert relative_times([value], base) is None
    assert json.loads(rebased(b'[{"ts":' + value + b"}]", base)) == [{"ts": None}]


def test_missing_times_are_nan_and_no_values_no_rows():
    assert relative_times([], BASE) == []
    assert _same(relative_times([b"", b""], BASE), [math.nan, math.nan])
    assert _same(relative_times([b"1700000000000001.250", b""], BASE), [1_000_000_000_001.25, math.nan])


def _kineto_2023(events: int, ts_in_args: bool = False) -> bytes:
    rows = [
        {"ph": "X", "name": f"op{k}", "ts": "@", "dur": 1.5, "pid": 1, "tid": 1, "args": {"External id": k}}
        for k in range(events)
    ]
    if ts_in_args:
        rows[0]["args"]["Concrete Inputs"] = {"ts": 1700000000000000.5}
    text = json.dumps({"traceEvents": rows})
    for k in range(events):  # each time as Kineto wrote it, ns digits that float64 cannot hold
        text = text.replace('"@"', f"1700000000{k * 7:06d}.{k % 1000:03d}", 1)
    return text.encode()


def test_a_kineto_2023_batch_takes_the_fast_route_and_reads_as_the_reference():
    data = _kineto_2023(50)
    batch = data[data.index(b"[") : data.rindex(b"]") + 1]
    assert decode._rows_rebased(batch, BASE) is not None
    have, want = read_text(data), read_text(data, typed=False)
    assert have.ts_base_us == want.ts_base_us == BASE
    assert have.columns["ts"].tolist() == want.columns["ts"].tolist()
    assert have.columns["ts"][1] == 7 + REBASE_MARGIN_US + 0.001


def test_a_ts_key_inside_args_sends_the_batch_to_the_rewrite_which_rewrites_it_too():
    data = _kineto_2023(5, ts_in_args=True)
    batch = data[data.index(b"[") : data.rindex(b"]") + 1]
    assert decode._rows_rebased(batch, BASE) is None
    have, want = read_text(data), read_text(data, typed=False)
    assert have.columns["ts"].tolist() == want.columns["ts"].tolist()
    assert have.columns["concrete_inputs"].tolist() == want.columns["concrete_inputs"].tolist()


@pytest.mark.parametrize(
    "text",
    [
        b"1.7e15",  # an exponent
        b"-5.5",
        b"1698000000000000.25",  # before the base: the fraction is subtracted too
        b"1700000000000000",  # whole: stays whole
        b"1e18",  # past MAX_TIME_US: null
        b"%d.5" % BASE,  # at the base
        b"%d.0000001e0" % BASE,  # a tenth of a ns past the base: written out, not as 1E-7
        b"17E14",  # an exponent, capital
        b"17e14",  # an exponent without a point
        b"100000000000000000",  # MAX_TIME_US itself: still a time
    ],
)
def test_the_rewrite_of_any_other_value_is_exact(text):
    """`rebased`, where `relative_times` refuses: every value of the batch, the plain one beside it too, as
    the exact decimal minus the base, a whole number kept whole, null past MAX_TIME_US."""
    plain = b"1700000000000001.125"
    batch = b'[{"ts":' + plain + b'},{"ts": ' + text + b"}]"
    have = [e["ts"] for e in json.loads(rebased(batch, BASE), parse_float=Decimal)]
    value = Decimal(text.decode())
    want = None if abs(value) > Decimal(10**17) else value - BASE
    if want is not None and not any(mark in text for mark in b".eE"):  # a fraction or an exponent: a float
        want = int(want)
    assert have == [Decimal(plain.decode()) - BASE, want]
    assert type(have[1]) is type(want)
