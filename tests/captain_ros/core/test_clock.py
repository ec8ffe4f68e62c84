import pytest

from captain_ros.core.clock import ForwardClock, StampedHistory


def test_forward_clock_counts_forward_steps_and_ignores_a_reset_to_zero():
    readings = iter([100.0, 101.5, 103.0, 0.0, 0.5, 2.0])  # the twin resets between 103 and 0
    clock = ForwardClock(lambda: next(readings))
    assert [clock() for _ in range(5)] == [1.5, 3.0, 3.0, 3.5, 5.0]


def test_stamped_history_keeps_a_time_window_whatever_the_rate():
    """Two seconds of stamps: 200 messages at 100 Hz, 2,000 at 1 kHz (a Franka's joint states)."""
    for rate_hz in (100, 1000):
        history = StampedHistory(2.0, stamp_of=lambda m: m[0])
        for i in range(5 * rate_hz):  # five seconds of messages
            history.append((i / rate_hz, i))
        assert len(history) == 2 * rate_hz + 1  # stamps 3.0 .. 5.0 - 1/rate, both ends within 2 s
        assert history[-1][1] == 5 * rate_hz - 1 and history[-1][0] - history[0][0] <= 2.0


def test_stamped_history_forgets_across_a_clock_reset_and_bounds_equal_stamps():
    history = StampedHistory(1.0, stamp_of=lambda m: m)
    for stamp in (10.0, 10.5, 11.0, 0.1):  # the twin reset: its clock restarts near 0
        history.append(stamp)
    assert list(history) == [0.1]
    bounded = StampedHistory(1.0, stamp_of=lambda m: 0.0, max_items=3)  # a publisher that stamps nothing
    for _ in range(10):
        bounded.append(object())
    assert len(bounded) == 3
    with pytest.raises(ValueError, match="window_s > 0"):
        StampedHistory(0.0, stamp_of=float)
