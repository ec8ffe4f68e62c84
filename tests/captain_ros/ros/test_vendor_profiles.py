"""Every shipped real-arm profile against a fake of its vendor's bring-up, over DDS, through the real motion node.

One motion_node process (`autostart:=false`) is driven as an operator drives it on a robot: set `robot_profile`,
`ros2 lifecycle set /motion configure`, `activate`, then MoveTo goals. Each test starts a `VendorGraph`
(tests/captain_ros/ros/fake_vendor.py) that serves the vendor's names (docs/vendor_interfaces.md) for franka_fr3
(franka_ros2 v3.4.0), ur5e (ur_robot_driver jazzy + PickNik's Hand-E controller) and ros2_control_demo (example 7 with a
JTC and an F/T broadcaster added); the twins are covered by test_backends.py and test_motion_*.py.

Checked for each profile: configure finds every interface and warns about nothing; without any one interface,
configure fails naming exactly that one; a small move_to runs through the vendor's trajectory action with the
vendor's joint names; open and close go through the vendor's gripper action with the profile's effort, and the
receipt reports the opening the gripper measured, not the command.

The graphs are the vendors' as shipped (Franka's best-effort wrench, UR's wrench in tool0_controller known from /tf,
UR's speed scaling in percent), and so are the descriptions: stand-ins with the vendors' link and joint names and
no camera links (cameras come from /tf), the Hand-E's links without inertials as in its xacro.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
from action_msgs.msg import GoalStatus  # noqa: E402
from control_msgs.action import ParallelGripperCommand  # noqa: E402
from franka_msgs.action import Grasp, Move  # noqa: E402
from lifecycle_msgs.msg import State, Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402

from captain_interfaces.action import MoveTo  # noqa: E402
from captain_interfaces.msg import CallResult as CallResultMsg  # noqa: E402
from captain_interfaces.srv import HarnessCall  # noqa: E402
from captain_ros.core import robot  # noqa: E402
from captain_ros.core.moveit_scene import SceneBox  # noqa: E402
from captain_ros.ros.spin import SpunActionClient  # noqa: E402

from .fake_move_group import FakeMoveGroup  # noqa: E402
from .fake_vendor import CONTROLLER_MANAGER_SERVICES, VENDORS, VendorGraph, VendorSpec, read_urdf  # noqa: E402
from .helpers import (  # noqa: E402
    LOADED_MACHINE_SWEEP_HORIZON_S,
    launch_motion_node,
    node_processes,
    result_of,
    set_parameters,
    wait_for,
)

pytestmark = [pytest.mark.ros, pytest.mark.slow]

CONNECT_TIMEOUT_S = 60.0  # configure with everything there: a starved machine may take a while to discover it
# configure with one interface missing waits this long before naming it (a configure that also names one still being
# discovered is tried again: the barrier below is this process's view of the graph, not the motion node's)
MISSING_TIMEOUT_S = 3.0
DEADLINE_S = 60.0
TWINS = {"panda_twin", "ur5e_twin"}  # test_backends.py, test_motion_node.py, test_motion_lifecycle.py
LABELS = {
    State.PRIMARY_STATE_UNCONFIGURED: "unconfigured",
    State.PRIMARY_STATE_INACTIVE: "inactive",
    State.PRIMARY_STATE_ACTIVE: "active",
}
DOWN = {"active": Transition.TRANSITION_DEACTIVATE, "inactive": Transition.TRANSITION_CLEANUP}
NOT_READY = (
    "nothing behind",
    "motions are refused until force sensing works",
    "no speed scaling on",
    "configure failed",
)

# The graphs the main tests run: the vendors' as shipped (Franka's best-effort wrench in fr3_hand_tcp, UR's wrench in
# tool0_controller with /tf from robot_state_publisher and tcp_pose_broadcaster, speed scaling at 100 %), on the
# vendors' descriptions as they are (no camera links; the Hand-E's massless links).
MAIN_GRAPHS = {
    "franka_fr3": {},
    "ur5e": {"publish_tf": True},
    "ros2_control_demo": {},
}
PROFILES = [
    pytest.param("franka_fr3"),
    pytest.param("ur5e"),
    pytest.param("ros2_control_demo"),
]
MOVE = np.array([0.02, 0.02, -0.02])  # a small move from where the arm stands, m


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def motion_node():
    """The real motion node, unconfigured, waiting for an operator (its services exist from the start)."""
    with node_processes() as started:
        started["motion"] = launch_motion_node(
            ("autostart", False),
            ("robot_profile", "franka_fr3"),
            ("sweep_horizon_s", LOADED_MACHINE_SWEEP_HORIZON_S),
            ("watchdog", False),
        )
        yield started["motion"][1]


@dataclass
class Operator:
    """The test as operator and agent: lifecycle and parameter services, the harness call and MoveTo."""

    node: object
    lines: list[str]  # the motion node's console output
    move: SpunActionClient
    clients: dict = field(default_factory=dict)
    receipts: list[CallResultMsg] = field(default_factory=list)

    def state(self) -> str:
        reply = result_of(self.clients["get_state"].call_async(GetState.Request()), 30)
        return LABELS.get(reply.current_state.id, reply.current_state.label)

    def change(self, transition: int) -> bool:
        request = ChangeState.Request(transition=Transition(id=transition))
        return result_of(self.clients["change_state"].call_async(request), 180).success

    def unconfigure(self) -> None:
        state = self.state()
        while state != "unconfigured":
            assert self.change(DOWN[state]), f"{DOWN[state]} failed from {state}"
            state = self.state()

    def configure(self, profile: str, timeout_s: float, *, waive: bool | None = None) -> tuple[bool, str]:
        """`robot_profile:=<profile>`, then configure; returns whether it succeeded and, if not, the log line that
        says why. `waive` (default: where the stand-in's meshes are not installed here) sets
        allow_unchecked_self_collision."""
        spec = VENDORS.get(profile)  # a profile given by path: a copy of the FR3's (primitive geometry)
        waive = (spec is not None and spec.meshes_elsewhere) if waive is None else waive
        set_parameters(
            self.clients["set_parameters"],
            robot_profile=profile,
            connect_timeout_s=timeout_s,
            allow_unchecked_self_collision=waive,
        )
        start = len(self.lines)
        if self.change(Transition.TRANSITION_CONFIGURE):
            return True, ""
        wait_for(lambda: self._failure(start), 30, "the configure failure in the motion node's log")
        return False, self._failure(start)

    def _failure(self, start: int) -> str:
        return next((line for line in self.lines[start:] if "configure failed" in line), "")

    def bring_up(self, profile: str, *, waive: bool | None = None) -> str:
        """Configure (`waive`: as configure's) and activate; returns the log from configure until the harness was
        ready (so every warning the transitions gave is in it: the log keeps its order)."""
        start = len(self.lines)
        ok, failure = self.configure(profile, CONNECT_TIMEOUT_S, waive=waive)
        assert ok, failure or "".join(self.lines[start:])
        assert self.change(Transition.TRANSITION_ACTIVATE), "".join(self.lines[start:])
        wait_for(lambda: any("harness ready on" in line for line in self.lines[start:]), 30, "the harness")
        log = self.lines[start:]
        return "".join(log[: next(i for i, line in enumerate(log) if "harness ready on" in line) + 1])

    def call(self, capability: str, **kwargs) -> CallResultMsg:
        request = HarnessCall.Request(capability=capability, args_json=json.dumps(kwargs))
        return result_of(self.clients["call"].call_async(request), 120).result

    def run(self, goal: MoveTo.Goal) -> tuple[int, CallResultMsg]:
        handle = result_of(self.move.send_goal_async(goal), 30)
        assert handle.accepted, f"goal {goal.call_id} was rejected"
        wrapped = result_of(handle.get_result_async(), 120)
        return wrapped.status, wrapped.result.result


@pytest.fixture
def operator(motion_node, client_node):
    node = client_node
    op = Operator(node, motion_node, SpunActionClient(node, MoveTo, "/harness/move_to"))
    op.clients = {
        "get_state": node.create_client(GetState, "/motion/get_state"),
        "change_state": node.create_client(ChangeState, "/motion/change_state"),
        "set_parameters": node.create_client(SetParameters, "/motion/set_parameters"),
        "call": node.create_client(HarnessCall, "/harness/call"),
    }
    node.create_subscription(CallResultMsg, "/harness/receipts", op.receipts.append, 50)
    for name, client in op.clients.items():
        if not client.wait_for_service(timeout_sec=60):
            raise RuntimeError(f"motion_node serves no {name}:\n" + "".join(motion_node))
    assert op.move.wait_for_server(timeout_sec=30)
    op.unconfigure()
    yield op
    op.unconfigure()  # let go of this test's graph before it stops


@pytest.fixture
def vendor():
    """Start a VendorGraph (stopped when the test ends)."""
    started: list[VendorGraph] = []

    def start(profile: str, *, description: str | None = None, **options) -> VendorGraph:
        spec = VENDORS[profile]
        graph = VendorGraph(spec, description or read_urdf(spec.urdf), **options)
        started.append(graph.start())
        return graph

    yield start
    for graph in started:
        graph.stop()


def served(node, spec: VendorSpec, key: str) -> bool:
    """Whether `node` sees the interface `key` of `spec` on the graph (as the motion node's configure checks it)."""
    name = spec.interfaces()[key]
    if key in ("trajectory_action", "gripper_action", "grasp_action", "error_recovery"):
        return node.count_services(f"{name}/_action/send_goal") > 0
    if key == "trajectory_topic":
        return node.count_subscribers(name) > 0
    if key in ("collision_behavior", "set_load", *CONTROLLER_MANAGER_SERVICES):
        return node.count_services(name) > 0
    return node.count_publishers(name) > 0


def missing_names(failure: str) -> list[str]:
    """The interface names a configure failure lists as missing ([] if it lists none)."""
    if match := re.search(r"nothing was published on (\S+) within", failure):
        return [match.group(1)]
    if match := re.search(r"nothing behind (.*) within [0-9.]+ s \(is the arm", failure):
        return [item.split(" (", 1)[0] for item in match.group(1).split("; ")]
    return []


def pose_goal(position: np.ndarray, quaternion: list[float], call_id: str, **fields) -> MoveTo.Goal:
    goal = MoveTo.Goal(target_kind=MoveTo.Goal.TARGET_POSE, call_id=call_id, **fields)
    p, o = goal.pose.pose.position, goal.pose.pose.orientation
    p.x, p.y, p.z = map(float, position)
    o.x, o.y, o.z, o.w = map(float, quaternion)
    return goal


def jaw_goal(command: str, call_id: str) -> MoveTo.Goal:
    return MoveTo.Goal(target_kind=MoveTo.Goal.TARGET_JAW, jaw_command=command, call_id=call_id)


def tcp_pose(op: Operator) -> tuple[np.ndarray, list[float]]:
    state = op.call("get_robot_state")
    assert state.success, state.message
    pose = json.loads(state.value_json)["tcp_pose"]
    return np.array(pose["position"]), pose["quaternion"]


def check_move(op: Operator, graph: VendorGraph, call_id: str, delta: np.ndarray = MOVE, **fields) -> None:
    """A move_to by `delta` from where the arm is reaches its target through the vendor's trajectory action."""
    start, quaternion = tcp_pose(op)
    target = start + delta
    status, result = op.run(pose_goal(target, quaternion, call_id, **fields))
    assert status == GoalStatus.STATUS_SUCCEEDED and result.success, (result.message, "".join(op.lines[-20:]))
    value = json.loads(result.value_json)
    assert value["stop_reason"] == "target_reached" and value["distance_to_target_m"] <= 0.003
    goals, received = graph.controller.goals, graph.controller.received
    assert goals, "the vendor's trajectory controller received no goal"
    assert all(sorted(g.trajectory.joint_names) == sorted(graph.spec.arm_joints) for g in goals)
    last = received[-1][1].points[-1].positions
    np.testing.assert_allclose(graph.controller.follower.desired_q, last, atol=1e-6)  # the controller got there
    np.testing.assert_allclose(tcp_pose(op)[0], target, atol=0.003)  # and the harness measures the arm there


# ---------------------------------------------------------------------------------------------- the vendor facts
def test_every_real_arm_profile_matches_its_vendors_names():
    """The fakes hold the vendors' names (docs/vendor_interfaces.md); each shipped profile names the same."""
    assert set(VENDORS) == set(robot.available_profiles()) - TWINS - {"libero_panda"}  # simulators, not vendors
    for name, spec in VENDORS.items():
        profile = robot.load_profile(name)
        interfaces = profile.interfaces
        assert profile.arm_joints == spec.arm_joints, name
        assert (interfaces.joint_states_topic, interfaces.trajectory_action, interfaces.trajectory_topic) == (
            spec.joint_states_topic,
            spec.trajectory_action,
            spec.trajectory_topic,
        ), name
        assert (interfaces.wrench_topic, interfaces.speed_scaling_topic) == (
            spec.wrench_topic,
            spec.speed_scaling_topic,
        ), name
        gripper = interfaces.gripper
        if spec.gripper is None:
            assert not profile.finger_joints, name
            continue
        assert (gripper.action, gripper.grasp_action) == (spec.gripper.action, spec.gripper.grasp_action), name
        separate = "" if spec.arm_state_gripper_joints else spec.gripper.joint_states_topic
        assert gripper.joint_states_topic == separate, name
        assert profile.interfaces.force_reflex is None  # no vendor offers a SetParameters force reflex


# ---------------------------------------------------------------------------------------------- configure
@pytest.mark.parametrize("profile", PROFILES)
def test_configure_finds_every_interface_the_profile_names(operator, vendor, profile):
    vendor(profile, **MAIN_GRAPHS[profile])
    log = operator.bring_up(profile)
    assert not [line for line in log.splitlines() if any(words in line for words in NOT_READY)], log
    assert f"robot profile '{profile}': URDF from /robot_description" in log
    state = operator.call("get_robot_state")  # needs fresh joint states and usable force data
    assert state.success, state.message
    value = json.loads(state.value_json)
    assert len(value["q_rad"]) == len(VENDORS[profile].arm_joints)
    assert all(np.isfinite(value["wrist_force_n"]))


@pytest.mark.parametrize("profile", PROFILES)
def test_configure_without_one_interface_names_exactly_that_one(operator, vendor, profile):
    spec, node = VENDORS[profile], operator.node
    for key, name in spec.interfaces().items():
        graph = vendor(profile, omit=frozenset({key}), **MAIN_GRAPHS[profile])
        others = [k for k in spec.interfaces() if k != key]
        # the test's own view of the graph as a barrier: the previous graph's endpoints gone, this one's there
        wait_for(lambda key=key: not served(node, spec, key), DEADLINE_S, f"{name} to be gone")
        wait_for(lambda others=others: all(served(node, spec, k) for k in others), DEADLINE_S, "the other interfaces")
        deadline = time.monotonic() + DEADLINE_S
        while True:  # the motion node learns of vanished and new endpoints a moment after this process may
            ok, failure = operator.configure(profile, MISSING_TIMEOUT_S)
            if ok:
                operator.unconfigure()
            if (not ok and missing_names(failure) == [name]) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not ok, f"configure succeeded without {name}"
        seen = {k: served(node, spec, k) for k in spec.interfaces()}  # this process's view, to tell DDS from the node
        assert missing_names(failure) == [name], f"{failure}\nthe test's own node sees: {seen}"
        assert operator.state() == "unconfigured"
        graph.stop()  # before the next graph: one bring-up at a time


def test_configure_refuses_a_description_whose_collision_meshes_do_not_load_unless_waived(operator, vendor):
    """The ur5e stand-in's Hand-E collides by robotiq_description's meshes, which no package here holds: configure
    says so and names the waiver; with it, the node runs and warns that the check covers only what loaded."""
    vendor("ur5e", **MAIN_GRAPHS["ur5e"])
    ok, failure = operator.configure("ur5e", CONNECT_TIMEOUT_S, waive=False)
    assert not ok
    assert "self-collision cannot be checked on this description" in failure, failure
    assert "package://robotiq_description/meshes/collision/hande/hand-e.stl is not found" in failure, failure
    assert "allow_unchecked_self_collision:=true" in failure, failure
    assert operator.state() == "unconfigured"
    log = operator.bring_up("ur5e")  # waived (the stand-in's default here)
    assert "self-collision partly UNCHECKED (allow_unchecked_self_collision is true)" in log, log


def test_ur5e_runs_with_the_shadow_check_asked_for_and_says_it_is_off(operator, vendor):
    """real_arm.launch.py asks for the shadow check; the ur5e profile has no twin: activation warns that the check is
    off and the arm is guarded by everything else (the FR3's panda_twin shadow is covered by test_shadow.py)."""
    vendor("ur5e", **MAIN_GRAPHS["ur5e"])
    set_parameters(operator.clients["set_parameters"], shadow_check=True)
    try:
        log = operator.bring_up("ur5e")
    finally:
        set_parameters(operator.clients["set_parameters"], shadow_check=False)
    assert "shadow check OFF: robot profile 'ur5e' has no twin and names no shadow_twin" in log, log


def test_a_payload_only_franka_hardware_would_take_is_named_at_configure_not_dropped(operator, vendor, tmp_path):
    """A UR profile that declares a payload: nothing here sends it to the UR, so configure says where to set it."""
    doc = robot.profile_path("ur5e").read_text() + "payload:\n  mass_kg: 1.2\n  center_of_mass_m: [0.0, 0.0, 0.04]\n"
    (tmp_path / "ur5e_tool.yaml").write_text(doc)
    assert robot.load_profile(tmp_path / "ur5e_tool.yaml").payload.mass_kg == 1.2
    vendor("ur5e", **MAIN_GRAPHS["ur5e"])
    log = operator.bring_up(str(tmp_path / "ur5e_tool.yaml"), waive=True)  # its Hand-E meshes are not here
    assert "declares a payload of 1.2 kg, which this stack sends only to franka_hardware" in log, log
    assert "teach pendant" in log, log


def test_fr3_configure_sets_the_profiles_collision_thresholds_and_payload(operator, vendor, tmp_path):
    """Configure gives franka_hardware the profile's contact and reflex thresholds, then the payload (a profile
    with a 0.8 kg tool here); a refusal (the arm is moving) fails configure with franka_hardware's reason."""
    doc = robot.profile_path("franka_fr3").read_text().replace("  mass_kg: 0.0", "  mass_kg: 0.8")
    doc = doc.replace("center_of_mass_m: [0.0, 0.0, 0.0]", "center_of_mass_m: [0.0, 0.0, 0.05]")
    (tmp_path / "fr3_tool.yaml").write_text(doc)
    profile = robot.load_profile(tmp_path / "fr3_tool.yaml")
    graph = vendor("franka_fr3")
    log = operator.bring_up(str(tmp_path / "fr3_tool.yaml"))
    assert "franka_hardware: collision reflex at 20-20 N and 12-20 N m per joint, payload 0.8 kg" in log, log
    (behavior_name, behavior), (load_name, load) = graph.franka_requests
    assert behavior_name == "/service_server/set_force_torque_collision_behavior"
    settings = profile.interfaces.franka
    assert tuple(behavior.upper_torque_thresholds_nominal) == settings.upper_torque_thresholds_nm
    assert tuple(behavior.lower_force_thresholds_nominal) == settings.lower_force_thresholds_n
    assert load_name == "/service_server/set_load" and load.mass == 0.8 and list(load.center_of_mass) == [0, 0, 0.05]
    operator.unconfigure()
    graph.stop()
    vendor("franka_fr3", franka_refusal="libfranka: command not possible in the current mode (Move)")
    ok, failure = operator.configure("franka_fr3", CONNECT_TIMEOUT_S)
    assert not ok
    assert (
        "/service_server/set_force_torque_collision_behavior refused: libfranka: command not possible in the current "
        "mode (Move)" in failure
    ), failure


def test_fr3_configure_checks_self_collision_on_its_description(operator, vendor):
    """The FR3 stand-in's collision geometry loads: configure says how many pairs it checks and of which SRDF."""
    vendor("franka_fr3")
    log = operator.bring_up("franka_fr3")
    assert re.search(r"self-collision: \d+ links with geometry, \d+ pairs checked \(no SRDF", log), log
    assert "UNCHECKED" not in log


# ---------------------------------------------------------------------------------------------- motion
@pytest.mark.parametrize("profile", PROFILES)
def test_move_to_runs_through_the_vendor_trajectory_controller(operator, vendor, profile):
    graph = vendor(profile, **MAIN_GRAPHS[profile])
    operator.bring_up(profile)
    check_move(operator, graph, f"{profile}-small-move")


def test_fr3_with_use_moveit_needs_move_group_and_refuses_a_sweep_its_scene_finds_in_collision(
    operator, vendor, client_node
):
    """use_moveit:=true: configure names move_group's missing services; with a fake move_group (its world a box on
    the sweep's path) the move_to is refused before the trajectory controller gets a goal, and runs once the box is
    gone, each sweep checked in the FR3's planning group; the perception node's measurement (a receipt) enters the
    scene and leaves it once stale."""
    graph = vendor("franka_fr3", **MAIN_GRAPHS["franka_fr3"])
    set_parameters(operator.clients["set_parameters"], use_moveit=True)
    fake = None
    try:
        ok, failure = operator.configure("franka_fr3", MISSING_TIMEOUT_S)
        assert not ok
        assert "use_moveit: nothing behind /check_state_validity (moveit_msgs/srv/GetStateValidity); " in failure
        assert "/apply_planning_scene (moveit_msgs/srv/ApplyPlanningScene)" in failure, failure
        profile = robot.load_profile("franka_fr3").with_urdf_text(read_urdf(VENDORS["franka_fr3"].urdf))
        fake = FakeMoveGroup(client_node.context, profile).start()
        log = operator.bring_up("franka_fr3")
        assert (
            "MoveIt planning scene on (services, interfaces.moveit.api auto): every sweep checked through "
            "/check_state_validity (group 'fr3_arm'"
        ) in log
        start, quaternion = tcp_pose(operator)
        fake.add(SceneBox("crate", tuple(start + MOVE / 2), (0.02, 0.02, 0.02), 0.0))
        goals = len(graph.controller.goals)
        status, result = operator.run(pose_goal(start + MOVE, quaternion, "moveit-refused"))
        assert status == GoalStatus.STATUS_ABORTED and not result.success
        assert result.failure_category == "safety_stop", result.message
        assert "MoveIt planning scene: fr3_hand_tcp collides with crate at" in result.message, result.message
        assert len(graph.controller.goals) == goals  # nothing was sent to the arm
        assert fake.groups == {"fr3_arm"}
        fake.world.clear()
        # the perception node's measurement, as it publishes it: the object goes into the scene, and out of it once
        # a motion has run (stale); a guarded sweep's hand may reach it
        receipts = operator.node.create_publisher(CallResultMsg, "/harness/receipts", 50)
        measured = {"object": "det_5", "center_m": (start + MOVE).tolist(), "extents_m": [0.02, 0.02, 0.02]}
        receipt = CallResultMsg(capability="measure_object_geometry", success=True, value_json=json.dumps(measured))
        receipts.publish(receipt)
        wait_for(lambda: "det_5" in fake.world, 30, "the measured object in the fake move_group's scene")
        check_move(operator, graph, "moveit-clear")
        wait_for(lambda: "det_5" not in fake.world, 30, "the stale object removed from the scene")
    finally:
        operator.unconfigure()
        set_parameters(operator.clients["set_parameters"], use_moveit=False)
        if fake is not None:
            fake.close()


@pytest.mark.parametrize("profile", ["franka_fr3", "ur5e"])
def test_gripper_runs_through_the_vendor_action_and_reports_the_measured_opening(operator, vendor, profile):
    """Open, then close on a 30 mm object: the goals carry the vendor's units and the profile's grasp force, and
    the receipt reports where the fingers stopped (30 mm), not the command (0 mm)."""
    graph = vendor(profile, gripper_overrides={"object_m": 0.03, "opening_m": 0.04}, **MAIN_GRAPHS[profile])
    operator.bring_up(profile)
    effort = robot.load_profile(profile).interfaces.gripper.max_effort_n
    full = {"franka_fr3": 0.08, "ur5e": 0.05}[profile]  # Franka Hand 2 x 0.04 m, Hand-E 0.05 m stroke

    status, opened = operator.run(jaw_goal(MoveTo.Goal.JAW_OPEN, f"{profile}-open"))
    assert status == GoalStatus.STATUS_SUCCEEDED and opened.success, opened.message
    assert json.loads(opened.value_json)["jaw_after_m"] == pytest.approx(full, abs=0.001)
    goal = graph.gripper.goals[-1]
    if profile == "franka_fr3":
        assert isinstance(goal, Move.Goal) and goal.width == pytest.approx(full)
    else:
        assert isinstance(goal, ParallelGripperCommand.Goal)
        assert list(goal.command.position) == pytest.approx([0.0])  # hande_finger_distance: 0 = open
        assert list(goal.command.effort) == pytest.approx([effort])

    status, closed = operator.run(jaw_goal(MoveTo.Goal.JAW_CLOSE, f"{profile}-close"))
    assert status == GoalStatus.STATUS_SUCCEEDED and closed.success, closed.message
    value = json.loads(closed.value_json)
    assert graph.gripper.opening_m == pytest.approx(0.03)  # the fake's fingers stopped on the object
    assert value["jaw_command_m"] == 0.0 and value["jaw_after_m"] == pytest.approx(0.03, abs=0.001)
    assert value["holding_object"] and "(command 0 mm), holding an object 30 mm wide" in closed.receipt
    goal = graph.gripper.goals[-1]
    if profile == "franka_fr3":
        assert isinstance(goal, Grasp.Goal) and goal.width == 0.0 and goal.force == pytest.approx(effort)
    else:
        assert list(goal.command.position) == pytest.approx([0.05])  # hande_finger_distance: 0.05 m = shut
        assert list(goal.command.effort) == pytest.approx([effort])


def test_ur_motion_at_half_speed_scaling(operator, vendor):
    """UR's scaled controller at 50 % (published as 50.0: percent) takes twice as long: the motion still completes,
    as the backend follows the scaling instead of declaring the slowed arm stalled."""
    graph = vendor("ur5e", speed_scaling_percent=50.0, **MAIN_GRAPHS["ur5e"])
    operator.bring_up("ur5e")
    check_move(operator, graph, "ur-half-speed", delta=np.array([0.0, 0.1, 0.0]), speed_mps=0.05)


def test_ur_protective_stop_ends_the_motion_as_such_and_refuses_the_next(operator, vendor):
    """io_and_status_controller reports a protective stop while a move runs: the move ends naming it (not as a
    pause or a stall, which is what the speed scaling of 0 alone would look like), the next move is refused
    with the reason before anything is sent, and once the pendant clears it moves again. A program that is not
    playing is named too."""
    from ur_dashboard_msgs.msg import RobotMode, SafetyMode

    graph = vendor("ur5e", **MAIN_GRAPHS["ur5e"])
    operator.bring_up("ur5e")
    start, quaternion = tcp_pose(operator)
    handle = result_of(
        operator.move.send_goal_async(pose_goal(start + [0.0, 0.15, 0.0], quaternion, "ur-stop", speed_mps=0.03)), 30
    )
    assert handle.accepted
    wait_for(lambda: graph.controller.goals, DEADLINE_S, "the move's goal at the controller")
    graph.set_ur_status(RobotMode.RUNNING, SafetyMode.PROTECTIVE_STOP, True)
    wrapped = result_of(handle.get_result_async(), 120)
    assert not wrapped.result.result.success
    assert "the UR is in a protective stop (safety mode PROTECTIVE_STOP)" in wrapped.result.result.message
    sent = len(graph.controller.goals)
    _, result = operator.run(pose_goal(start, quaternion, "ur-refused"))
    assert not result.success and "protective stop" in result.message, result.message
    assert len(graph.controller.goals) == sent  # refused before a goal went out
    graph.set_ur_status(RobotMode.RUNNING, SafetyMode.NORMAL, False)
    attempt = lambda: operator.run(pose_goal(start, quaternion, "ur-back"))[1].message  # noqa: E731
    # the motion node hears the new state a moment later: until then the refusal names the protective stop
    wait_for(lambda: "External Control program is not running" in attempt(), DEADLINE_S, "the program refusal")
    assert len(graph.controller.goals) == sent
    graph.set_ur_status(RobotMode.RUNNING, SafetyMode.NORMAL, True)
    wait_for(lambda: "External Control" not in attempt(), DEADLINE_S, "the UR state to clear")  # moves back
    check_move(operator, graph, "ur-after-stop")


# ---------------------------------------------------------------------------------------------- Franka's state
FR3_STATE = "/franka_robot_state_broadcaster/robot_state"
FR3_CONTROLLERS = ["fr3_arm_controller", "joint_state_broadcaster", "franka_robot_state_broadcaster"]
FR3_RECOVERY = [  # what the recovery asks, in order, of franka_hardware and the controller_manager
    "error_recovery",
    "set_hardware_component_state FrankaHardwareInterface active",
    "list_controllers",
    f"switch_controller activate {sorted(FR3_CONTROLLERS)} strict",
    "list_controllers",
]


def start_sweep(op: Operator, call_id: str):
    """A 15 cm move at 3 cm/s (5 s) started, not waited for: (its goal handle, the start pose, its quaternion)."""
    start, quaternion = tcp_pose(op)
    goal = pose_goal(start + [0.0, 0.15, 0.0], quaternion, call_id, speed_mps=0.03)
    handle = result_of(op.move.send_goal_async(goal), 30)
    assert handle.accepted
    return handle, start, quaternion


def reflex_mid_sweep(op: Operator, graph: VendorGraph, call_id: str) -> tuple[CallResultMsg, np.ndarray, list]:
    """A sweep stopped by the FR3's reflex: (its result, where the arm stopped, the start pose and quaternion)."""
    handle, start, quaternion = start_sweep(op, call_id)
    wait_for(lambda: graph.controller.goals, DEADLINE_S, "the sweep's goal at the controller")
    graph.reflex()
    stopped = graph.controller.follower.desired_q.copy()
    return result_of(handle.get_result_async(), 120).result.result, stopped, [start, quaternion]


def test_fr3_reflex_mid_motion_ends_it_as_such_holds_and_refuses_motion(operator, vendor):
    """The FR3 stops itself in a reflex mid-sweep: franka_hardware's controllers go inactive (the goal aborted, joint
    states, wrench and robot state silent). The move ends naming the silent robot state and `recover`, not only as a
    lost link; the arm stays where the reflex stopped it; get_robot_state and the next move are refused with the same
    reason, and nothing more reaches the controller."""
    graph = vendor("franka_fr3")
    operator.bring_up("franka_fr3")
    result, stopped, (start, quaternion) = reflex_mid_sweep(operator, graph, "fr3-reflex")
    assert not result.success
    assert f"the FR3's robot state on {FR3_STATE} is" in result.message, result.message
    assert "call recover" in result.message, result.message
    np.testing.assert_array_equal(graph.controller.follower.desired_q, stopped)  # held where the reflex stopped it
    state = operator.call("get_robot_state")
    assert not state.success and "call recover" in state.message, state.message
    sent = len(graph.controller.goals)
    _, refused = operator.run(pose_goal(start, quaternion, "fr3-refused"))
    assert not refused.success and "call recover" in refused.message, refused.message
    assert len(graph.controller.goals) == sent
    np.testing.assert_array_equal(graph.controller.follower.desired_q, stopped)


def test_fr3_recover_runs_the_whole_recovery_in_order_then_moves_again(operator, vendor):
    """After a reflex `recover` runs franka_hardware's error recovery, the hardware component back to active, the
    inactive controllers in one STRICT switch, and confirms them (the order the fakes saw); its receipt says so and
    the arm did not move. Then motion works again, and a second `recover` reverses the last motion as on a
    healthy arm."""
    graph = vendor("franka_fr3")
    operator.bring_up("franka_fr3")
    check_move(operator, graph, "fr3-before")
    result, stopped, _ = reflex_mid_sweep(operator, graph, "fr3-reflex-2")
    assert not result.success
    recovered = operator.call("recover")
    assert recovered.success, recovered.message
    assert graph.recovery_calls == FR3_RECOVERY
    assert recovered.receipt.startswith(
        "recover: arm error recovery: error recovery done; FrankaHardwareInterface active; activated "
    ), recovered.receipt
    assert "the arm did not move" in recovered.receipt
    value = json.loads(recovered.value_json)
    assert value["vendor_recovery"][-2:] == ["controllers confirmed active", "arm state back"]
    assert f"the FR3's robot state on {FR3_STATE}" in value["fault"]
    assert graph.hardware_state == "active" and set(graph.controller_states.values()) == {"active"}
    np.testing.assert_allclose(graph.controller.follower.desired_q, stopped, atol=1e-9)  # recovered where it stood
    state = operator.call("get_robot_state")
    assert state.success and "arm_fault" not in json.loads(state.value_json), state.message
    check_move(operator, graph, "fr3-after-recovery")
    back = operator.call("recover", distance_m=0.01)
    assert back.success and re.search(r"; reversed [01]\.\d cm of motion \d+$", back.receipt), back.message
    # a healthy arm: recover asked the controller_manager (all active), and ran no vendor recovery
    assert graph.recovery_calls == [*FR3_RECOVERY, "list_controllers"]


@pytest.mark.parametrize(
    ("graph_options", "failure", "calls"),
    [
        (
            {"recovery_aborts": True},
            "Franka recovery step 1 of 4 (franka_hardware's error recovery, /action_server/error_recovery): aborted: "
            "libfranka could not recover the arm",
            ["error_recovery"],
        ),
        (
            {"refuse_activation": frozenset({"fr3_arm_controller"})},
            "Franka recovery step 3 of 4 (activate fr3_arm_controller, joint_state_broadcaster, "
            "franka_robot_state_broadcaster, /controller_manager/switch_controller, strict): the controller_manager "
            "refused: After activating, controller 'fr3_arm_controller' is in state 'inactive'",
            FR3_RECOVERY[:4],
        ),
    ],
    ids=["error-recovery-aborts", "controller-will-not-activate"],
)
def test_fr3_recovery_that_fails_names_the_step_and_leaves_the_arm_holding(
    operator, vendor, graph_options, failure, calls
):
    """`recover` after a reflex mid-sweep: a step that fails ends it with a backend_error naming the step and what to
    do, the later steps are not tried, and the arm stays where it stopped."""
    graph = vendor("franka_fr3", **graph_options)
    operator.bring_up("franka_fr3")
    _, stopped, _ = reflex_mid_sweep(operator, graph, "fr3-reflex-3")
    result = operator.call("recover")
    assert not result.success and result.failure_category == "backend_error", result.message
    assert failure in result.message and "the arm holds" in result.message, result.message
    assert "call recover again" in result.message, result.message
    assert graph.recovery_calls == calls
    assert graph.controller_states["fr3_arm_controller"] == "inactive"
    np.testing.assert_array_equal(graph.controller.follower.desired_q, stopped)


def test_fr3_motion_fails_closed_on_a_stale_robot_state_or_a_stop_mode(operator, vendor):
    """A robot state that stops coming (only it: joint states and wrench flow on) refuses motion once it is older than
    the link limit, before anything reaches the controller, and get_robot_state reports it; a fresh robot state in a
    mode other than IDLE and MOVE (here REFLEX, with libfranka's error) refuses motion naming the mode."""
    from franka_msgs.msg import FrankaRobotState

    graph = vendor("franka_fr3")
    operator.bring_up("franka_fr3")
    start, quaternion = tcp_pose(operator)
    sent = len(graph.controller.goals)
    graph.robot_state_silent = True
    fault = lambda: json.loads(operator.call("get_robot_state").value_json).get("arm_fault", "")  # noqa: E731
    wait_for(lambda: f"the FR3's robot state on {FR3_STATE} is" in fault(), DEADLINE_S, "the stale robot state")
    _, refused = operator.run(pose_goal(start + MOVE, quaternion, "fr3-stale"))
    assert not refused.success and f"the FR3's robot state on {FR3_STATE} is" in refused.message, refused.message
    assert len(graph.controller.goals) == sent
    graph.robot_mode, graph.robot_errors = FrankaRobotState.ROBOT_MODE_REFLEX, ("cartesian_reflex",)
    graph.robot_state_silent = False
    wait_for(lambda: "REFLEX" in fault(), DEADLINE_S, "the robot mode")
    _, refused = operator.run(pose_goal(start + MOVE, quaternion, "fr3-reflex-mode"))
    assert not refused.success, refused.message
    assert "the FR3's robot mode is REFLEX, errors: cartesian_reflex: the arm stopped itself" in refused.message
    assert len(graph.controller.goals) == sent
    graph.robot_mode, graph.robot_errors = None, ()
    wait_for(lambda: not fault(), DEADLINE_S, "the robot mode back to MOVE")
    check_move(operator, graph, "fr3-after-stale")


def test_fr3_recover_right_after_a_reflex_asks_the_controller_manager(operator, vendor):
    """A reflex with the arm at rest, and `recover` at once: the robot state may not be old enough yet to count as
    silent, so `recover` asks the controller_manager, which lists the controllers inactive, and recovers."""
    graph = vendor("franka_fr3")
    operator.bring_up("franka_fr3")
    graph.reflex()
    recovered = operator.call("recover")
    assert recovered.success, recovered.message
    fault = json.loads(recovered.value_json)["fault"]
    if graph.recovery_calls[0] == "list_controllers":  # asked before the robot state counted as silent
        assert graph.recovery_calls == ["list_controllers", *FR3_RECOVERY]
        assert fault.startswith("the controller_manager lists fr3_arm_controller is inactive"), fault
    else:  # a host so slow that the robot state was already older than the link limit
        assert graph.recovery_calls == FR3_RECOVERY and "robot state" in fault, fault
    check_move(operator, graph, "fr3-after-quick-recovery")
