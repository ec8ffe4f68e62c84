"""Lockstep between the MuJoCo twin and the backend that commands its arm (ROS-free; twin_node and the
ros2_control backend carry it over two topics).

Why: a command computed from a joint state reaches the arm's controller some time later. A real controller
runs in real time and that time is a few milliseconds. The twin's physics runs on a host that may be busy: a
command could reach it half a second of sim time after its stamp, and a controller that honours stamps (as
joint_trajectory_controller does) then begins it part-way along: a goal jumps ahead on its path, a stop ramp
starts part-way down, and the arm feels the step as a jolt (its force sensing as a contact). Those delays are the
host's, not the arm's, so the twin takes them out.

How: the commander grants the twin sim time. On every joint state it receives it publishes "run up to this
state's stamp plus a horizon" on GRANT_TOPIC; the twin steps only within the smallest grant of the commanders
alive (none alive: it runs freely). A command pauses the grants: it is stamped at the grant already given (a
time the twin cannot yet have passed, and never the previous command's stamp), and grants resume once the twin
has echoed that stamp on TAKEN_TOPIC, which it does when it has taken the command up. Every goal and every stop
ramp therefore starts at its stamp, exactly as computed, however late the host delivers it: on a busy host the
twin runs slower than real time instead. A real arm has no lockstep.

Liveness rests on two rules. The twin publishes its state whenever it stops to wait for a grant (the commander
then has seen where it stopped, and grants past it; a twin waiting one step short of its next scheduled state
would otherwise wait for a grant that only that state could bring). The commander publishes its grants in the
order it computes them (a grant computed from an older state and published after a newer one would take the
twin's grant back, the twin taking each commander's latest grant so that a reset can lower it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

GRANT_TOPIC = "/twin/lockstep/grant"  # std_msgs/Header: stamp = the sim time granted, frame_id = who grants it
TAKEN_TOPIC = "/twin/lockstep/taken"  # std_msgs/Header: stamp = the stamp of the arm command the twin last took up
TAKEN_DEPTH = 10  # echoes kept (reliable, transient local: a commander that joins late learns the twin follows grants)
HORIZON_S = 0.02  # how far past the newest joint state a commander lets the twin run (at least 2 state intervals)
RECHECK_S = 0.1  # a twin waiting for a grant checks this often whether its commanders are still there


class Grants:
    """The twin's side: the sim time each commander (by name) has granted."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._until_ns: dict[str, int] = {}

    def grant(self, commander: str, until_ns: int) -> None:
        """`commander` lets the twin run up to `until_ns` (its latest grant counts: after a reset the twin's
        clock, and so the grants, start again from zero)."""
        with self._cond:
            self._until_ns[commander] = int(until_ns)
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait(
        self,
        next_ns: int,
        stop: threading.Event,
        alive: Callable[[], Collection[str]],
        recheck_s: float = RECHECK_S,
        on_hold: Callable[[], None] | None = None,
    ) -> bool:
        """Block until the twin may step to `next_ns` (granted, nobody grants, or `stop` is set). `on_hold` is
        called once, outside the lock, before it first blocks (the twin publishes its state there). While it waits,
        every `recheck_s` the commanders no longer `alive` are forgotten. Returns whether it had to wait."""
        waited = False
        with self._cond:
            while not stop.is_set():
                limit = min(self._until_ns.values(), default=None)
                if limit is None or limit >= next_ns:
                    return waited
                if not waited and on_hold is not None:
                    waited = True
                    self._cond.release()
                    try:
                        on_hold()
                    finally:
                        self._cond.acquire()
                    continue  # a grant may have come meanwhile
                waited = True
                if not self._cond.wait(recheck_s):
                    names = alive()
                    for commander in set(self._until_ns) - set(names):
                        del self._until_ns[commander]
        return waited


class Commander:
    """The commanding backend's side: the grants to publish, and the stamps of its commands.

    Lockstep is on once the twin has said it follows grants (its first echo on TAKEN_TOPIC, published latched at
    its start); until then, and against a real arm, `begin` returns None and commands are stamped as usual.

    `publish` sends a grant to the twin; it is called under the commander's lock, so grants computed on the
    joint-state thread and on the commanding thread go out in the order they were computed."""

    def __init__(self, horizon_s: float = HORIZON_S, publish: Callable[[int], None] | None = None) -> None:
        if not horizon_s > 0:
            raise ValueError(f"the lockstep horizon must be > 0 s, got {horizon_s}")
        self._horizon_ns = round(horizon_s * 1e9)
        self._publish = publish
        self._cond = threading.Condition()
        self.enabled = False
        self._paused = False
        self._state_ns: int | None = None  # the newest joint state's stamp
        self._interval_ns = 0  # between the last two joint states
        self._granted_ns: int | None = None
        self._cap_ns: int | None = None  # no grant goes past it (see cap)
        self._last_command_ns: int | None = None
        self._awaited_ns: int | None = None  # the stamp of the command in flight
        self._arrived = False  # whether the twin has echoed it

    @property
    def horizon_ns(self) -> int:
        """The horizon, at least two joint state intervals (a twin that publishes its state more rarely than
        the horizon would otherwise wait for a grant that only its next state can bring)."""
        return max(self._horizon_ns, 2 * self._interval_ns)

    def _granting(self, until_ns: int) -> int:
        """Grant up to `until_ns`, or up to the cap (under the lock)."""
        if self._cap_ns is not None:
            until_ns = min(until_ns, self._cap_ns)
        self._granted_ns = until_ns
        if self._publish is not None:
            self._publish(until_ns)
        return until_ns

    def on_state(self, stamp_ns: int) -> int | None:
        """A joint state came: the grant it brings, published (None: lockstep is off or a command is in flight)."""
        with self._cond:
            if self._state_ns is not None:
                if stamp_ns < self._state_ns:  # the twin's clock started again (a reset): so do command stamps
                    self._last_command_ns = None
                elif stamp_ns > self._state_ns:
                    self._interval_ns = stamp_ns - self._state_ns
            self._state_ns = stamp_ns
            if not self.enabled or self._paused:
                return None
            return self._granting(stamp_ns + self.horizon_ns)

    def cap(self, until_ns: int | None) -> None:
        """Grant no further than `until_ns` (None: no cap) until told otherwise: the commanding thread's own pace,
        where the twin must not run ahead of it (a sweep given to the controller a short horizon at a time, whose
        next piece that thread sends: a thread the host starves would otherwise let the twin reach the horizon and
        stop, as the real arm does only when its commander is gone). A cap set while a command is in flight
        applies from that command's `end`; otherwise the grant is renewed at once (a twin waiting at the old cap
        has already published the state it stopped at, and would wait for ever)."""
        with self._cond:
            self._cap_ns = None if until_ns is None else int(until_ns)
            if self.enabled and not self._paused and self._state_ns is not None:
                self._granting(self._state_ns + self.horizon_ns)

    def on_taken(self, stamp_ns: int) -> None:
        """The twin echoed the stamp of an arm command it took up (its first echo turns lockstep on). Echoes of
        other commands (an unstamped hold taken up after, say) may come in between: only the awaited one counts."""
        with self._cond:
            self.enabled = True
            if stamp_ns == self._awaited_ns:
                self._arrived = True
            self._cond.notify_all()

    def wait_enabled(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.enabled, max(0.0, timeout_s))

    def begin(self) -> int | None:
        """A command is about to go out: pause the grants and return its stamp (the grant already given, which
        the twin cannot have passed; one nanosecond past the previous command's when no grant came between), or
        None when lockstep is off (nothing is paused; stamp the command as without lockstep)."""
        with self._cond:
            if not self.enabled or self._granted_ns is None or self._paused:
                return None
            self._paused = True
            stamp = self._granted_ns
            if self._last_command_ns is not None and stamp <= self._last_command_ns:
                stamp = self._last_command_ns + 1
            self._last_command_ns = self._awaited_ns = stamp
            self._arrived = False
            return stamp

    def end(self, stamp_ns: int, sent: bool, timeout_s: float) -> tuple[bool, int | None]:
        """The command stamped `stamp_ns` is out (`sent`; False: it never left): wait until the twin has taken it
        up (at most `timeout_s`), then resume the grants. Returns whether the twin took it up, and the grant
        published now (the twin waits at the paused grant until one comes; None before any joint state)."""
        with self._cond:
            taken = sent and self._cond.wait_for(lambda: self._arrived, timeout_s)
            self._paused, self._awaited_ns = False, None
            if self._state_ns is None:
                return taken, None
            return taken, self._granting(max(self._state_ns + self.horizon_ns, stamp_ns))
