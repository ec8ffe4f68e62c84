"""franka_hardware's own settings, made at configure through its services (franka_ros2 v3.4.0).

franka_hardware serves `~/set_force_torque_collision_behavior` and `~/set_load` on its `service_server` node
(franka_param_service_server.cpp), and refuses them while a motion runs. The motion node calls both once the graph
check found them and before it moves anything: the contact and collision-reflex thresholds the profile declares
(`interfaces.franka`), then the payload (`payload`: what the arm carries beyond the hand Desk knows of). Both matter
to the wrench this stack guards with: franka_hardware estimates it from the joint torques and its model, so a
payload it was not told of reads as a constant force, and the arm's own reflex fires at the upper thresholds
whatever this stack's limits say.

The arm's state and its recovery (franka_ros2 v3.4.0 with ros2_control): franka_robot_state_broadcaster publishes
the robot state (`~/robot_state`, SystemDefaultsQoS, 1 kHz) with libfranka's robot mode. `FrankaStateWatch` keeps
the latest, and `refusal()` says why the arm may not move: no state yet, a state older than the link limit, or a mode
other than IDLE or MOVE (REFLEX, USER_STOPPED, GUIDING, AUTOMATIC_ERROR_RECOVERY, OTHER). A silent state is what a
reflex looks like from ROS: libfranka's control loop throws, franka_hardware's read() returns ERROR, and the
controller_manager leaves its hardware component unconfigured and deactivates every controller that uses it
(ros2_control's ControllerManager::read: the trajectory controller aborts its goal, "Current goal cancelled during
deactivate transition.", and both broadcasters fall silent). `FrankaRecovery.run()` undoes that, each step bounded by
the profile's `recovery_step_timeout_s` and each failure a BackendError that names the step and what to do: 1.
franka_hardware's `error_recovery` action (empty goal: libfranka's automaticErrorRecovery()), 2. the hardware
component back to active (controller_manager's set_hardware_component_state: configure, then activate), 3. the
profile's trajectory controller and broadcasters that are not active, activated in one STRICT switch_controller, 4.
list_controllers confirms each is active.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from action_msgs.msg import GoalStatus
from builtin_interfaces.msg import Duration
from controller_manager_msgs.srv import ListControllers, SetHardwareComponentState, SwitchController
from franka_msgs.action import ErrorRecovery
from franka_msgs.msg import Errors, FrankaRobotState
from franka_msgs.srv import SetForceTorqueCollisionBehavior, SetLoad
from lifecycle_msgs.msg import State
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message

from captain_ros.core.robot import FrankaSettings, Payload
from captain_ros.harness.backend import BackendError
from captain_ros.ros.frames import stamp_ns
from captain_ros.ros.spin import SideNode, SpunActionClient

SET_LOAD_TYPE = "franka_msgs/srv/SetLoad"
COLLISION_BEHAVIOR_TYPE = "franka_msgs/srv/SetForceTorqueCollisionBehavior"
ROBOT_STATE_TYPE = "franka_msgs/msg/FrankaRobotState"
ERROR_RECOVERY_TYPE = "franka_msgs/action/ErrorRecovery"
CONTROLLER_MANAGER_SERVICES = {  # controller_manager's "~/<name>" services the recovery calls, and their types
    "set_hardware_component_state": (
        SetHardwareComponentState,
        "controller_manager_msgs/srv/SetHardwareComponentState",
    ),
    "switch_controller": (SwitchController, "controller_manager_msgs/srv/SwitchController"),
    "list_controllers": (ListControllers, "controller_manager_msgs/srv/ListControllers"),
}
ROBOT_MODES = {
    getattr(FrankaRobotState, k): k.removeprefix("ROBOT_MODE_")
    for k in vars(type(FrankaRobotState))
    if k.startswith("ROBOT_MODE_")
}
MOVING_MODES = (FrankaRobotState.ROBOT_MODE_IDLE, FrankaRobotState.ROBOT_MODE_MOVE)  # libfranka: no motion / one runs
MODE_HINTS = {
    FrankaRobotState.ROBOT_MODE_REFLEX: "the arm stopped itself (a collision over its thresholds, or a limit): find "
    "what it hit, then call recover (franka_hardware's error recovery, then its controllers again)",
    FrankaRobotState.ROBOT_MODE_USER_STOPPED: "the external activation device (the enabling/stop button) is pressed: "
    "release it, then call recover",
    FrankaRobotState.ROBOT_MODE_AUTOMATIC_ERROR_RECOVERY: "the arm is running its error recovery: wait, then call "
    "again",
    FrankaRobotState.ROBOT_MODE_GUIDING: "someone is guiding the arm by hand: let go of the guiding buttons",
    FrankaRobotState.ROBOT_MODE_OTHER: "the brakes are locked or FCI is not active: open the brakes and activate FCI "
    "in Desk, then call recover",
}
ERROR_FIELDS = tuple(Errors.get_fields_and_field_types())
STEPS = 4  # the recovery's steps (FrankaRecovery.run)
MODE_READ_PERIOD_S = 0.02  # FrankaStateWatch takes the newest robot state this often (see its docstring)


def refusal(mode: int | None, errors: tuple[str, ...], age_s: float, limit_s: float, topic: str) -> str:
    """Why the FR3 may not move ('' = it may), from its latest robot state: `mode` (None = none heard yet), the
    libfranka errors it reported (names), how old it is and how old it may be (`limit_s`, the link limit)."""
    if mode is None:
        return (
            f"no robot state on {topic} yet: motions are refused until franka_robot_state_broadcaster publishes it "
            "(is it active? `ros2 control list_controllers`)"
        )
    if age_s > limit_s:
        return (
            f"the FR3's robot state on {topic} is {age_s:.2f} s old (limit {limit_s:g} s): franka_hardware stops its "
            "controllers after a reflex or a user stop (or the broadcaster was deactivated); the arm holds; call "
            "recover (franka_hardware's error recovery, then the hardware and controllers back), or look at Desk"
        )
    if mode in MOVING_MODES:
        return ""
    listed = f", errors: {', '.join(errors)}" if errors else ""
    name = ROBOT_MODES.get(mode, str(mode))
    return f"the FR3's robot mode is {name}{listed}: {MODE_HINTS.get(mode, 'see Desk')}"


def _error_names(msg: FrankaRobotState) -> tuple[str, ...]:
    """The libfranka errors a robot state reports: the current ones, else those that ended the last motion."""
    for errors in (msg.current_errors, msg.last_motion_errors):
        names = tuple(f for f in ERROR_FIELDS if getattr(errors, f))
        if names:
            return names
    return ()


class FrankaModeTracker:
    """The latest robot mode of franka_robot_state_broadcaster's `topic` and when a state last came (`clock`);
    `on_change` is called when the mode changes (the backend wakes its motion loop with it). A state that stops
    coming is caught by `refusal(limit_s)`: motion fails closed on a silent broadcaster. (No ROS here:
    FrankaStateWatch feeds it.)"""

    def __init__(self, topic: str, on_change: Callable[[], None], clock=time.monotonic):
        self.topic, self._clock, self._on_change = topic, clock, on_change
        self._lock = threading.Lock()
        self.mode: int | None = None
        self.errors: tuple[str, ...] = ()
        self._wall = 0.0  # when the latest state was taken (clock)
        self._after = 0.0  # it came after this (clock): when it was taken, or the poll before that one
        # the latest state's stamp, and the smallest (taken - stamp) seen: a state delivered late (a loaded host
        # queues it past a reflex) is as old as its stamp says, the smallest delay taking in the clocks' offset
        self._stamp_s: float | None = None
        self._min_delay_s = math.inf

    def update(self, msg: FrankaRobotState, came_after: float | None = None) -> None:
        """The latest state, taken now; it came after `came_after` (default: now)."""
        mode = msg.robot_mode
        errors = () if mode in MOVING_MODES else _error_names(msg)  # read the errors only when they matter
        now = self._clock()
        stamp_s = stamp_ns(msg.header.stamp) * 1e-9 or None  # 0: unstamped
        with self._lock:
            changed = mode != self.mode or errors != self.errors
            self.mode, self.errors, self._wall, self._stamp_s = mode, errors, now, stamp_s
            if stamp_s is not None:
                self._min_delay_s = min(self._min_delay_s, now - stamp_s)
            self._after = now if came_after is None else came_after
        if changed:
            self._on_change()

    def heard_since(self, wall: float) -> bool:
        """Whether a state is known to have come after `wall` (the clock's time)."""
        with self._lock:
            return self.mode is not None and self._after > wall

    def refusal(self, limit_s: float) -> str:
        with self._lock:
            now = self._clock()
            age = now - self._wall
            if self._stamp_s is not None:  # by its stamp: taken just now, it may still be old
                age = max(age, now - (self._stamp_s + self._min_delay_s))
            mode, errors = self.mode, self.errors
        return refusal(mode, errors, age, limit_s, self.topic)


class FrankaStateWatch(FrankaModeTracker):
    """FrankaModeTracker on the robot state `topic` (resolved), polled every MODE_READ_PERIOD_S by a timer of `node`.

    The state comes at 1 kHz and is big (2.8 kB: four JointStates, eleven stamped poses, wrenches and inertias).
    Measured on a loaded 2-core host (a 1 kHz publisher in another process, 6 s): a subscriber that took each one in
    an rclpy callback used a whole core and fell behind (839 of 1000 a second; 0.9 ms to deserialize one, a
    JointState 0.03 ms), and one that took each as bytes and read one in ten still 44 % of a core (the executor's
    work per message). So no executor sees this subscription: it lives on a node of its own that nothing spins and
    keeps only the newest state (depth 1); the timer takes that one, if one came since the last poll, and reads it:
    12 % of a core at this period (7 % at 0.05 s, 21 % at 0.01 s, 3 % for DDS's receiving alone). A mode change is
    seen within a poll; a state older than the link limit means none came for that long."""

    def __init__(self, node, topic: str, group, on_change: Callable[[], None], clock=time.monotonic):
        super().__init__(topic, on_change, clock)
        self._reader = Node(
            f"{node.get_name()}_franka_state",
            context=node.context,
            use_global_arguments=False,  # `topic` is resolved already
            start_parameter_services=False,
        )
        qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)  # the broadcaster's SystemDefaultsQoS
        self._subscription = self._reader.create_subscription(FrankaRobotState, topic, lambda _m: None, qos, raw=True)
        self._polled = 0.0  # when the last poll took what had come (clock)
        self._timer = node.create_timer(MODE_READ_PERIOD_S, self.poll, callback_group=group)

    def poll(self) -> None:
        """Read the newest state, if one came since the last poll (so it came after that poll)."""
        data, handle = None, self._subscription.handle
        with handle:
            polled, self._polled = self._polled, self._clock()
            while (taken := handle.take_message(FrankaRobotState, True)) is not None:
                data = taken[0]
        if data is not None:
            self.update(deserialize_message(data, FrankaRobotState), came_after=polled)

    def close(self) -> None:
        self._timer.cancel()
        self._reader.destroy_node()


def _call(node: SideNode, srv_type, name: str, request, timeout_s: float):
    client = node.create_client(srv_type, name)
    try:
        if not client.wait_for_service(timeout_sec=timeout_s):
            raise BackendError(f"{name} did not answer within {timeout_s:g} s (is franka_hardware running?)")
        done = threading.Event()
        future = client.call_async(request)
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout_s):
            future.cancel()
            raise BackendError(f"{name} did not reply within {timeout_s:g} s")
        reply = future.result()
    finally:
        node.destroy_client(client)
    if not reply.success:
        why = reply.error or "no reason given"
        raise BackendError(f"{name} refused: {why} (franka_hardware refuses these while the arm moves)")
    return reply


def apply_settings(host, settings: FrankaSettings, payload: Payload, timeout_s: float) -> str:
    """Set the collision behaviour, then the payload, through franka_hardware's services (names resolved in
    `host`'s namespace). Returns what was set, for the log; BackendError names the service that failed and why."""
    node = SideNode(host, "franka_settings")
    node.start()
    try:
        behavior = SetForceTorqueCollisionBehavior.Request(
            lower_torque_thresholds_nominal=list(settings.lower_torque_thresholds_nm),
            upper_torque_thresholds_nominal=list(settings.upper_torque_thresholds_nm),
            lower_force_thresholds_nominal=list(settings.lower_force_thresholds_n),
            upper_force_thresholds_nominal=list(settings.upper_force_thresholds_n),
        )
        name = host.resolve_service_name(settings.collision_behavior_service)
        _call(node, SetForceTorqueCollisionBehavior, name, behavior, timeout_s)
        com = list(payload.center_of_mass_m)
        load = SetLoad.Request(mass=payload.mass_kg, center_of_mass=com, load_inertia=[0.0] * 9)  # a point mass
        _call(node, SetLoad, host.resolve_service_name(settings.set_load_service), load, timeout_s)
    finally:
        node.close()
    force, torque = settings.upper_force_thresholds_n[:3], settings.upper_torque_thresholds_nm
    return (
        f"franka_hardware: collision reflex at {min(force):g}-{max(force):g} N and {min(torque):g}-{max(torque):g} "
        f"N m per joint, payload {payload.mass_kg:g} kg at {list(payload.center_of_mass_m)} m (flange frame)"
    )


class FrankaRecovery:
    """franka_hardware's error recovery and the controller_manager's services, as clients of `node` (spun by its
    owner) named as the host resolves them (`topic`, `service`); `run()` brings the arm back after a reflex."""

    def __init__(
        self, node, settings: FrankaSettings, topic: Callable[[str], str], service: Callable[[str], str], group
    ):
        self.settings = settings
        self._action_name = topic(settings.error_recovery_action)
        self._action = SpunActionClient(node, ErrorRecovery, self._action_name, callback_group=group)
        manager = settings.controller_manager.rstrip("/")
        self._services = {
            key: (name := service(f"{manager}/{key}"), node.create_client(srv_type, name, callback_group=group))
            for key, (srv_type, _) in CONTROLLER_MANAGER_SERVICES.items()
        }

    def controllers(self) -> tuple[str, ...]:
        """The controllers the recovery brings back: the trajectory controller and the broadcasters."""
        return (self.settings.trajectory_controller, *self.settings.broadcasters)

    def not_active(self) -> list[str]:
        """'<controller> is <state>' for each controller the recovery brings back that is not active now (a reflex
        deactivates them at once; the robot state is judged silent only after the link limit)."""
        step = f"check ({', '.join(self.controllers())}"
        states = self._list(step, self.settings.recovery_step_timeout_s)
        return [f"{c} is {states[c]}" for c in self.controllers() if states[c] != "active"]

    def run(self) -> list[str]:
        """Steps 1 to 4 (the module's docstring), in order; returns what each did, for the receipt. A step that
        fails raises BackendError naming it and what the operator does next; the steps after it are not tried."""
        s, limit = self.settings, self.settings.recovery_step_timeout_s
        done = [self._error_recovery(limit)]
        step = f"step 2 of {STEPS} (hardware component {s.hardware_component} to active"
        request = SetHardwareComponentState.Request(
            name=s.hardware_component, target_state=State(id=State.PRIMARY_STATE_ACTIVE, label="active")
        )
        reply = self._call("set_hardware_component_state", request, step, limit)
        if not reply.ok:
            state = reply.state.label or f"state id {reply.state.id}"
            raise BackendError(
                f"Franka recovery {step}, {self._services['set_hardware_component_state'][0]}): the controller_manager "
                f"did not activate it (it is {state}); the arm holds. Read ros2_control_node's log (a component left "
                "finalized needs the bring-up restarted), then call recover again"
            )
        done.append(f"{s.hardware_component} active")
        step = f"step 3 of {STEPS} (activate {', '.join(self.controllers())}"
        states = self._list(step, limit)
        inactive = [c for c in self.controllers() if states[c] != "active"]
        if inactive:
            request = SwitchController.Request(
                activate_controllers=inactive,
                strictness=SwitchController.Request.STRICT,
                timeout=Duration(sec=int(limit), nanosec=int((limit % 1) * 1e9)),
            )
            reply = self._call("switch_controller", request, step, limit)
            if not reply.ok:
                raise BackendError(
                    f"Franka recovery {step}, {self._services['switch_controller'][0]}, strict): the "
                    f"controller_manager refused: {reply.message or 'no message'}; the arm holds. `ros2 control "
                    "list_controllers` shows which is not active: activate it by hand (`ros2 control "
                    "switch_controllers --activate ...`) or restart the bring-up, then call recover again"
                )
            done.append(f"activated {', '.join(inactive)}")
        step = f"step 4 of {STEPS} (confirm {', '.join(self.controllers())} active"
        states = self._list(step, limit)
        still = [f"{c} is {states[c]}" for c in self.controllers() if states[c] != "active"]
        if still:
            raise BackendError(
                f"Franka recovery {step}, {self._services['list_controllers'][0]}): {'; '.join(still)}; the arm holds. "
                "Activate them by hand (`ros2 control switch_controllers --activate ...`), then call recover again"
            )
        done.append("controllers confirmed active")
        return done

    def _error_recovery(self, limit: float) -> str:
        step = f"Franka recovery step 1 of {STEPS} (franka_hardware's error recovery, {self._action_name})"
        if not self._action.wait_for_server(timeout_sec=limit):
            raise BackendError(
                f"{step}: no action server within {limit:g} s (is franka_hardware's ros2_control_node running?); "
                "the arm holds. Recover in Desk, then call recover again"
            )
        handle = self._wait(self._action.send_goal_async(ErrorRecovery.Goal()), limit, step, "accept the goal")
        if handle is None or not handle.accepted:
            raise BackendError(
                f"{step}: the goal was rejected; the arm holds. Recover in Desk, then call recover again"
            )
        response = self._wait(handle.get_result_async(), limit, step, "finish", cancel=handle)
        if response is None or response.status != GoalStatus.STATUS_SUCCEEDED:
            status = {GoalStatus.STATUS_ABORTED: "aborted", GoalStatus.STATUS_CANCELED: "canceled"}.get(
                getattr(response, "status", None), "ended without success"
            )
            raise BackendError(
                f"{step}: {status}: libfranka could not recover the arm (the stop button still pressed, or a joint "
                "at its limit: franka_hardware's log says why); the arm holds. Release the button, or guide the arm "
                "out of the limit by hand, then call recover again"
            )
        return "error recovery done"

    def _list(self, step: str, limit: float) -> dict[str, str]:
        """Each controller the recovery needs -> its state ('active', 'inactive', ...); BackendError for one the
        controller_manager has not loaded."""
        reply = self._call("list_controllers", ListControllers.Request(), step, limit)
        states = {c.name: c.state for c in reply.controller}
        missing = [c for c in self.controllers() if c not in states]
        if missing:
            raise BackendError(
                f"Franka recovery {step}): {', '.join(missing)} not loaded in {self.settings.controller_manager} "
                f"(it has {', '.join(sorted(states)) or 'none'}); the arm holds. Spawn them (`ros2 run "
                "controller_manager spawner <name>`), then call recover again"
            )
        return states

    def _call(self, key: str, request, step: str, limit: float):
        name, client = self._services[key]
        if not client.wait_for_service(timeout_sec=limit):
            raise BackendError(
                f"Franka recovery {step}): {name} is not available within {limit:g} s (is the controller_manager "
                "running?); the arm holds"
            )
        return self._wait(client.call_async(request), limit, f"Franka recovery {step}), {name}", "answer")

    @staticmethod
    def _wait(future, limit: float, step: str, what: str, cancel=None):
        done = threading.Event()
        future.add_done_callback(lambda _f: done.set())
        if not done.wait(limit):
            future.cancel()
            if cancel is not None:
                cancel.cancel_goal_async()
            raise BackendError(f"{step}: did not {what} within {limit:g} s; the arm holds. Call recover again")
        return future.result()
