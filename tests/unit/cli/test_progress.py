"""The progress figures `srdq run` and `srdq status` print: human durations, this call's rate and ETA."""

from __future__ import annotations

import math

import pytest

from srd_worker.status import RunMeter, eta_seconds, ewma_rate, format_duration

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


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_meter_counts_only_this_calls_work():
    clock = Clock()
    meter = RunMeter(total=100, done_before=40, clock=clock)
    assert meter.eta_s is None  # nothing finished in this call yet: no rate to extrapolate
    clock.t += 10
    meter.update(items_done=40, round_tokens=500)
    assert meter.eta_s is None
    clock.t += 10
    meter.update(items_done=50, round_tokens=1500)
    # 10 items and 2000 tokens in this call's 20 s; the 40 items of an earlier call are not speed
    assert meter.tokens == 2000
    assert meter.tokens_per_s == pytest.approx(2000 / 20)
    assert meter.items_per_s == pytest.approx(10 / 20)
    assert meter.eta_s == pytest.approx(50 / 0.5)
    meter.update(items_done=100, round_tokens=0)
    assert meter.eta_s == 0.0


def test_meter_eta_follows_the_recent_rate_not_the_calls_average():
    """After a slow start the rate moves to the new pace within a few time constants; the call's average
    (what the ETA used to be) would still lag far behind."""
    clock = Clock()
    meter = RunMeter(total=10_000, done_before=0, clock=clock)
    done = 0
    for _ in range(20):  # 20 minutes at 1 item per 10 s
        clock.t += 60
        done += 6
        meter.update(done, 0)
    for _ in range(20):  # then 20 minutes at 1 item/s
        clock.t += 60
        done += 60
        meter.update(done, 0)
    average = done / 2400
    assert average == pytest.approx(0.55)
    assert meter.items_per_s == pytest.approx(1.0, rel=0.02)
    assert meter.eta_s == pytest.approx((10_000 - done) / meter.items_per_s)


def test_ewma_is_exact_for_steady_lumpy_progress():
    # a shard of 16 items every 600 s, the ETA's time constant (300 s) shorter than the gap
    events = [(600.0 * k, 16.0) for k in range(1, 9)]
    assert ewma_rate(events, start=0.0, now=4800.0) == pytest.approx(16 / 600)
    # between two completions the rate holds (the next one is not late before a mean gap has passed)
    assert ewma_rate(events, start=0.0, now=4800.0 + 599) == pytest.approx(16 / 600)
    # a young run's rate is its plain average from the start
    assert ewma_rate([(50.0, 5.0)], start=0.0, now=50.0) == pytest.approx(0.1)
    # a burst (four workers' shards finishing at once) counts as the items of that moment, not as infinity
    burst = [(100.0, 16.0), (100.0, 16.0), (100.0, 16.0), (100.0, 16.0)]
    assert ewma_rate(burst, start=0.0, now=100.0) == pytest.approx(64 / 100)


def test_ewma_origin_and_stalls():
    events = [(100.0, 10.0), (200.0, 10.0)]
    # nothing before the origin counts (a resume starts the clock again) and queue time is not work:
    # the same progress measured from a later start is faster
    assert ewma_rate(events, start=150.0, now=200.0) == pytest.approx(10 / 50)
    assert ewma_rate(events, start=0.0, now=200.0) == pytest.approx(0.1)
    assert ewma_rate([], start=0.0, now=100.0) is None
    assert ewma_rate([(0.0, 5.0)], start=0.0, now=0.0) is None  # no time observed yet
    # a stall: once the silence exceeds the mean gap (100 s), the rate falls, and keeps falling
    steady = ewma_rate(events, start=0.0, now=300.0)
    later = ewma_rate(events, start=0.0, now=600.0)
    much_later = ewma_rate(events, start=0.0, now=3000.0)
    assert steady == pytest.approx(0.1)
    assert steady > later > much_later > 0


def test_eta_seconds():
    assert eta_seconds(0, None) == 0.0
    assert eta_seconds(-3, 0.5) == 0.0
    assert eta_seconds(10, None) is None and eta_seconds(10, 0.0) is None
    assert eta_seconds(30, 0.5) == 60.0


def test_eta_from_tokens_credits_the_items_under_way():
    from srd_worker.status import IN_FLIGHT_FLOOR, eta_from_tokens

    def eta(**kw):
        base = dict(unstarted=0, in_flight=0, in_flight_tokens=0, tokens_per_item=50.0, tokens_per_s=5.0)
        return eta_from_tokens(**(base | kw))

    assert eta() == 0.0  # nothing left
    assert eta(unstarted=4) == pytest.approx(4 * 50 / 5)
    # four items under way holding 180 of their 200 expected tokens: 20 left, beside two unstarted
    assert eta(unstarted=2, in_flight=4, in_flight_tokens=180) == pytest.approx((100 + 20) / 5)
    # holding more than their share: still a tenth of it left, never 0 while they run
    assert eta(in_flight=4, in_flight_tokens=900) == pytest.approx(IN_FLIGHT_FLOOR * 200 / 5)
    assert eta(unstarted=1, tokens_per_item=None) is None and eta(unstarted=1, tokens_per_s=None) is None
    assert eta(unstarted=1, tokens_per_item=0.0) is None and eta(unstarted=1, tokens_per_s=0.0) is None
