"""Repeated warnings (every learn request while Redis is down) are said once per interval."""

import logging

import pytest

from service import log_throttle
from service.log_throttle import Throttled


def test_a_repeated_warning_is_said_once_per_interval_with_the_count_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    clock = [100.0]
    monkeypatch.setattr(log_throttle.time, "monotonic", lambda: clock[0])
    throttled = Throttled(logging.getLogger("test.throttle"), interval_s=10)
    with caplog.at_level(logging.WARNING, logger="test.throttle"):
        for second in range(25):  # 40 failures a second for 25 s, of one model
            clock[0] = 100.0 + second
            for _ in range(40):
                throttled.warning("learn m", "learn failed for model %r: %s", "m", "down")
        throttled.warning("learn other", "learn failed for model %r: %s", "other", "down")
    assert [r.getMessage() for r in caplog.records] == [
        "learn failed for model 'm': down",
        "learn failed for model 'm': down (and 399 more like it in the last 10 s)",
        "learn failed for model 'm': down (and 399 more like it in the last 10 s)",
        "learn failed for model 'other': down",  # another key is said at once
    ]
