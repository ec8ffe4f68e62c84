from captain_ros.core.clock import ForwardClock


def test_forward_clock_counts_forward_steps_and_ignores_a_reset_to_zero():
    readings = iter([100.0, 101.5, 103.0, 0.0, 0.5, 2.0])  # the twin resets between 103 and 0
    clock = ForwardClock(lambda: next(readings))
    assert [clock() for _ in range(5)] == [1.5, 3.0, 3.0, 3.5, 5.0]
