"""The progress figures `srdq run` and `srdq status` print: human durations, this call's rate and ETA."""

from __future__ import annotations

import math

import pytest

from srd_worker.status import RunMeter, format_duration

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (44.6, "45s"),
        (60, "1m 00s"),
        (185, "3m 05s"),
        (3599.4, "59m 59s"),
        (3600, "1h 00m"),
        (7620, "2h 07m"),
        (86400 + 4 * 3600 + 59, "1d 04h"),
        (None, "n/a"),
        (math.inf, "n/a"),
        (math.nan, "n/a"),
        (-1, "n/a"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_meter_counts_only_this_calls_work():
    meter = RunMeter(total=100, done_before=40, started=0.0)
    assert meter.eta_s is None  # nothing finished in this call yet: no rate to extrapolate
    meter.update(items_done=40, round_tokens=500)
    assert meter.eta_s is None
    meter.update(items_done=50, round_tokens=1500)
    # 10 items and 2000 tokens in this call; the 40 items of an earlier call are not speed
    elapsed = meter.elapsed
    assert meter.tokens == 2000
    assert meter.tokens_per_s == pytest.approx(2000 / elapsed)
    assert meter.eta_s == pytest.approx(50 * elapsed / 10, rel=1e-3)
    meter.update(items_done=100, round_tokens=0)
    assert meter.eta_s == 0.0
