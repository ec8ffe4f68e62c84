"""The lockstep bookkeeping of the twin and its commander (ROS-free); over DDS:
tests/captain_ros/ros/test_execution.py."""

from __future__ import annotations

import threading

import pytest

from captain_ros.twin.lockstep import Commander, Grants

MS = 1_000_000


def _waiter(grants: Grants, next_ns: int, stop: threading.Event, alive=lambda: {"a"}):
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(waited=grants.wait(next_ns, stop, alive, recheck_s=0.01)))
    thread.start()
    return thread, out


def test_a_twin_nobody_grants_runs_freely():
    assert Grants().wait(10**12, threading.Event(), set) is False


def test_the_twin_waits_for_the_smallest_grant_of_its_commanders():
    grants, stop = Grants(), threading.Event()
    grants.grant("a", 50 * MS)
    grants.grant("b", 20 * MS)
    assert grants.wait(20 * MS, stop, lambda: {"a", "b"}) is False
    thread, out = _waiter(grants, 30 * MS, stop, alive=lambda: {"a", "b"})
    grants.grant("b", 40 * MS)
    thread.join()
    assert out["waited"] is True


def test_a_commander_that_has_gone_no_longer_holds_the_twin():
    grants, stop = Grants(), threading.Event()
    grants.grant("gone", 10 * MS)
    grants.grant("here", 100 * MS)
    thread, out = _waiter(grants, 50 * MS, stop, alive=lambda: {"here"})
    thread.join()
    assert out["waited"] is True  # it waited until it found "gone" gone


def test_a_twin_that_must_wait_first_says_where_it_stopped_outside_the_lock():
    grants, stop = Grants(), threading.Event()
    grants.grant("a", 20 * MS)
    held = []

    def on_hold():  # the twin publishes its state here; the commander's answer may come at once
        held.append(True)
        grants.grant("a", 50 * MS)  # would deadlock if called under the lock

    assert grants.wait(20 * MS, stop, lambda: {"a"}, on_hold=on_hold) is False  # granted: no state needed
    assert held == []
    assert grants.wait(30 * MS, stop, lambda: {"a"}, on_hold=on_hold) is True
    assert held == [True]


def test_a_twin_says_where_it_stopped_once_per_wait():
    grants, stop, held = Grants(), threading.Event(), []
    grants.grant("a", 20 * MS)
    out: dict = {}
    thread = threading.Thread(
        target=lambda: out.update(
            waited=grants.wait(30 * MS, stop, lambda: {"a"}, recheck_s=0.01, on_hold=lambda: held.append(True))
        )
    )
    thread.start()
    for until in (22, 24, 26):  # grants that do not reach the next step yet
        grants.grant("a", until * MS)
    grants.grant("a", 30 * MS)
    thread.join()
    assert out["waited"] is True and held == [True]


def test_stop_ends_a_wait():
    grants, stop = Grants(), threading.Event()
    grants.grant("a", 0)
    thread, _ = _waiter(grants, 10 * MS, stop)
    stop.set()
    grants.wake()
    thread.join()


def test_a_reset_clock_lowers_the_grant():
    grants = Grants()
    grants.grant("a", 5_000 * MS)
    grants.grant("a", 20 * MS)  # the twin's clock started again at 0
    thread, out = _waiter(grants, 30 * MS, threading.Event())
    grants.grant("a", 40 * MS)
    thread.join()
    assert out["waited"] is True


def test_a_commander_grants_a_horizon_past_each_state_once_the_twin_follows():
    c = Commander(horizon_s=0.02)
    assert c.on_state(0) is None  # the twin has not said it follows grants
    assert c.begin() is None  # nor are commands stamped for it
    c.on_taken(0)
    assert c.on_state(10 * MS) == 30 * MS
    assert c.on_state(20 * MS) == 40 * MS


def test_the_horizon_covers_two_state_intervals():
    c = Commander(horizon_s=0.02)
    c.on_taken(0)
    c.on_state(0)
    assert c.on_state(100 * MS) == 300 * MS  # 10 Hz states: a 20 ms horizon would stall the twin


def test_a_command_is_stamped_at_the_grant_and_pauses_grants_until_the_twin_takes_it():
    c = Commander(horizon_s=0.02)
    c.on_taken(0)
    c.on_state(10 * MS)
    stamp = c.begin()
    assert stamp == 30 * MS  # the twin cannot have passed it
    assert c.on_state(20 * MS) is None  # paused: the twin stays at or before the stamp
    threading.Timer(0.01, c.on_taken, args=(stamp,)).start()
    taken, grant = c.end(stamp, sent=True, timeout_s=30)
    assert taken and grant == 40 * MS  # resumed from the newest state
    assert c.on_state(30 * MS) == 50 * MS


def test_commands_without_a_grant_between_get_distinct_stamps():
    c = Commander(horizon_s=0.02)
    c.on_taken(0)
    c.on_state(10 * MS)
    first = c.begin()
    c.end(first, sent=False, timeout_s=0)
    second = c.begin()
    assert second == first + 1  # the echo of one is never taken for the other


def test_a_command_that_never_left_does_not_wait_and_an_unanswered_one_resumes_anyway():
    c = Commander(horizon_s=0.02)
    c.on_taken(0)
    c.on_state(10 * MS)
    assert c.end(c.begin(), sent=False, timeout_s=30) == (False, 30 * MS)
    taken, grant = c.end(c.begin(), sent=True, timeout_s=0.0)
    assert not taken and grant is not None


def test_a_reset_clock_restarts_command_stamps():
    c = Commander(horizon_s=0.02)
    c.on_taken(0)
    c.on_state(5_000 * MS)
    c.end(c.begin(), sent=False, timeout_s=0)
    c.on_state(10 * MS)  # a new episode
    assert c.begin() == 30 * MS


def test_a_horizon_must_be_positive():
    with pytest.raises(ValueError, match="horizon"):
        Commander(horizon_s=0.0)


def test_an_echo_of_another_command_coming_after_does_not_hide_the_awaited_one():
    c = Commander(horizon_s=0.02)
    c.on_taken(0)
    c.on_state(10 * MS)
    stamp = c.begin()
    c.on_taken(stamp)
    c.on_taken(0)  # an unstamped hold, taken up just after
    assert c.end(stamp, sent=True, timeout_s=30)[0] is True


def test_grants_are_published_in_the_order_they_are_computed():
    """The joint-state thread and the commanding thread both grant: a grant computed from an older state and
    published after a newer one would take the twin's grant back (it takes each commander's latest)."""
    published: list[int] = []
    racer: list[threading.Thread] = []

    def publish(until_ns: int) -> None:
        if not racer:  # the resumed grant: a newer state comes in on the other thread meanwhile
            racer.append(threading.Thread(target=c.on_state, args=(20 * MS,)))
            racer[0].start()
            racer[0].join(0.05)  # it must not get its grant out before this one
        published.append(until_ns)

    c = Commander(horizon_s=0.02)
    c.on_taken(0)
    c.on_state(10 * MS)
    stamp = c.begin()
    c._publish = publish
    c.end(stamp, sent=False, timeout_s=0)
    racer[0].join()
    assert published == [30 * MS, 40 * MS]


def test_a_cap_holds_the_grants_back_and_lifting_it_grants_at_once():
    published = []
    c = Commander(horizon_s=0.02, publish=published.append)
    c.on_taken(0)
    c.on_state(10 * MS)
    c.cap(35 * MS)
    assert published[-1] == 30 * MS  # under the cap: granted again as before
    assert c.on_state(20 * MS) == 35 * MS  # the cap, not the horizon
    stamp = c.begin()
    c.cap(80 * MS)  # set while a command is in flight: nothing goes out until it ends
    assert published[-1] == 35 * MS
    threading.Timer(0.01, c.on_taken, args=(stamp,)).start()
    assert c.end(stamp, sent=True, timeout_s=30) == (True, 40 * MS)
    for ms in range(30, 80, 10):
        c.on_state(ms * MS)
    assert published[-1] == 80 * MS
    c.cap(None)  # a twin waiting at the cap is released at once, without a new state
    assert published[-1] == 90 * MS
