"""twin_node over DDS, in its own process: the ros2_control-style interfaces a real-arm client uses,
the cameras, /clock, and the reset and training-only snapshot services."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from action_msgs.msg import GoalStatus
from builtin_interfaces.msg import Duration
from control_msgs.action import FollowJointTrajectory
from geometry_msgs.msg import WrenchStamped
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CameraInfo, Image, JointState
from tf2_msgs.msg import TFMessage
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from captain_interfaces.srv import GetPrivilegedSnapshot, ResetEpisode
from captain_ros.core import robot
from captain_ros.ros.spin import SpunActionClient

from .helpers import launch_twin, result_of, stop, wait_for

PANDA = robot.default_profile()  # the twin's arm

pytestmark = [pytest.mark.ros, pytest.mark.slow]
TASK = "stack_red_on_blue"


@pytest.fixture(scope="module")
def twin_process():
    proc, lines = launch_twin(TASK, f"{TASK}/official/2", real_time_factor=3.0, camera_rate_hz=5.0)
    yield proc, lines
    stop(proc)


@pytest.fixture
def client(twin_process, client_node):
    latest: dict[str, object] = {}
    for topic, kind in [
        ("/joint_states", JointState),
        ("/head_camera/color/image_raw", Image),
        ("/head_camera/aligned_depth_to_color/image_raw", Image),
        ("/wrist_camera/color/image_raw", Image),
        ("/head_camera/color/camera_info", CameraInfo),
        ("/wrist_ft_sensor/wrench", WrenchStamped),
        ("/clock", Clock),
        ("/tf", TFMessage),
    ]:
        client_node.create_subscription(kind, topic, lambda m, t=topic: latest.__setitem__(t, m), 10)
    wait_for(lambda: len(latest) == 8, 60, f"all twin topics (have {sorted(latest)})")
    return client_node, latest


def _arm_goal(q, seconds: float) -> FollowJointTrajectory.Goal:
    goal = FollowJointTrajectory.Goal()
    goal.trajectory.joint_names = list(PANDA.arm_joints)
    goal.trajectory.points = [
        JointTrajectoryPoint(
            positions=[float(v) for v in q], time_from_start=Duration(sec=int(seconds), nanosec=int(seconds % 1 * 1e9))
        )
    ]
    return goal


def test_sensors_are_published_in_ros_conventions(client):
    _, latest = client
    js = latest["/joint_states"]
    assert list(js.name) == [*PANDA.arm_joints, *PANDA.finger_joints]
    np.testing.assert_allclose(js.position[:7], PANDA.home_q, atol=2e-3)
    color, depth = latest["/head_camera/color/image_raw"], latest["/head_camera/aligned_depth_to_color/image_raw"]
    assert (color.width, color.height, color.encoding, color.step) == (512, 512, "rgb8", 1536)
    assert depth.encoding == "32FC1" and color.header.frame_id == "head_camera_optical_frame"
    depth_m = np.frombuffer(bytes(depth.data), dtype="<f4").reshape(512, 512)
    assert 0.5 < float(np.median(depth_m)) < 2.0  # the table, about a metre away
    info = latest["/head_camera/color/camera_info"]
    assert info.k[2] == info.k[5] == 255.5 and info.p[3] == 0.0 and info.distortion_model == "plumb_bob"
    assert latest["/wrist_ft_sensor/wrench"].header.frame_id == PANDA.hand_frame
    children = {t.child_frame_id for t in latest["/tf"].transforms}
    assert {PANDA.tcp_frame, "head_camera_optical_frame", "wrist_camera_optical_frame"} <= children
    assert latest["/clock"].clock.sec >= 0


def test_follow_joint_trajectory_moves_the_arm(client):
    node, latest = client
    action = SpunActionClient(node, FollowJointTrajectory, "/arm_controller/follow_joint_trajectory")
    assert action.wait_for_server(timeout_sec=20)
    target = np.array(latest["/joint_states"].position[:7])
    target[0] += 0.3
    target[3] += 0.2
    feedback = []
    handle = result_of(action.send_goal_async(_arm_goal(target, 1.0), feedback_callback=feedback.append))
    wrapped = result_of(handle.get_result_async(), 30)
    assert wrapped.status == GoalStatus.STATUS_SUCCEEDED
    assert wrapped.result.error_code == FollowJointTrajectory.Result.SUCCESSFUL
    assert feedback and list(feedback[-1].feedback.joint_names) == list(PANDA.arm_joints)
    wait_for(lambda: abs(latest["/joint_states"].position[0] - target[0]) < 0.01, 10, "joint 1 at its target")


def test_cancel_stops_the_arm_where_it_is(client):
    node, latest = client
    action = SpunActionClient(node, FollowJointTrajectory, "/arm_controller/follow_joint_trajectory")
    assert action.wait_for_server(timeout_sec=20)
    start = np.array(latest["/joint_states"].position[:7])
    target = start.copy()
    target[0] -= 1.0
    feedback = []
    # 30 s of sim time (10 s at 3x): the cancel comes while it moves, however slowly this process runs
    handle = result_of(action.send_goal_async(_arm_goal(target, 30.0), feedback_callback=feedback.append))
    moved = lambda: feedback and feedback[-1].feedback.actual.positions[0] < start[0] - 0.02  # noqa: E731
    wait_for(moved, 60, "the arm to be moving")
    result_of(handle.cancel_goal_async())
    wrapped = result_of(handle.get_result_async(), 20)
    assert wrapped.status == GoalStatus.STATUS_CANCELED
    stopped = latest["/joint_states"].position[0]
    assert target[0] + 0.05 < stopped < start[0] - 0.01  # it moved, and it did not finish
    time.sleep(1.0)  # let the twin run on (3x real time): a held arm does not drift
    assert abs(latest["/joint_states"].position[0] - stopped) < 0.02  # and it holds


@pytest.mark.parametrize(
    ("mutate", "code", "message"),
    [
        (lambda g: g.trajectory.joint_names.__setitem__(0, "elbow"), -2, "unknown joints"),
        (lambda g: g.trajectory.points[0].positions.__setitem__(2, math.nan), -1, "finite"),
        (lambda g: g.trajectory.points[0].positions.__setitem__(3, 0.5), -1, "outside its limits"),
        (lambda g: g.trajectory.points.clear(), -1, "no points"),
    ],
)
def test_bad_trajectories_are_refused_with_a_reason(client, mutate, code, message):
    node, latest = client
    action = SpunActionClient(node, FollowJointTrajectory, "/arm_controller/follow_joint_trajectory")
    assert action.wait_for_server(timeout_sec=20)
    before = np.array(latest["/joint_states"].position[:7])
    goal = _arm_goal(before, 1.0)
    goal.trajectory.points[0].positions = list(goal.trajectory.points[0].positions)
    mutate(goal)
    handle = result_of(action.send_goal_async(goal))
    wrapped = result_of(handle.get_result_async(), 20)
    assert wrapped.status == GoalStatus.STATUS_ABORTED
    assert wrapped.result.error_code == code and message in wrapped.result.error_string
    np.testing.assert_allclose(latest["/joint_states"].position[:7], before, atol=5e-3)  # nothing moved


def test_gripper_topic_interface_closes_the_jaw(client):
    node, latest = client
    pub = node.create_publisher(JointTrajectory, "/gripper_controller/joint_trajectory", 10)
    wait_for(lambda: pub.get_subscription_count() > 0, 20, "the gripper topic subscriber")
    msg = JointTrajectory(
        joint_names=["panda_finger_joint1"],
        points=[JointTrajectoryPoint(positions=[0.01], time_from_start=Duration(sec=0, nanosec=500_000_000))],
    )
    pub.publish(msg)
    wait_for(lambda: abs(latest["/joint_states"].position[7] - 0.01) < 2e-3, 20, "the finger at 1 cm")


def test_reset_and_training_only_snapshot(client):
    node, _ = client
    reset = node.create_client(ResetEpisode, "/twin/reset")
    snapshot = node.create_client(GetPrivilegedSnapshot, "/twin/training_only/privileged_snapshot")
    assert reset.wait_for_service(timeout_sec=20) and snapshot.wait_for_service(timeout_sec=20)
    bad = result_of(reset.call_async(ResetEpisode.Request(task="juggle")), 30)
    assert not bad.success and "unknown task 'juggle'" in bad.message
    held_out = result_of(
        reset.call_async(ResetEpisode.Request(task=TASK, start_id=f"{TASK}/official/12", split="train")), 30
    )
    assert not held_out.success and "eval split" in held_out.message
    ok = result_of(
        reset.call_async(
            ResetEpisode.Request(task="open_drawer", start_id="open_drawer/wide/4", split="train", episode_id="ep-42")
        ),
        30,
    )
    assert ok.success and ok.start_id == "open_drawer/wide/4" and ok.episode_id == "ep-42"
    assert ok.instruction == "open the drawer of the cabinet"
    snap = result_of(snapshot.call_async(GetPrivilegedSnapshot.Request(request_index=3)), 30)
    assert snap.success and snap.snapshot.task == "open_drawer" and len(snap.snapshot.features) == 36
    assert snap.snapshot.request_index == 3 and snap.snapshot.episode_id == "ep-42"
    assert list(snap.snapshot.joint_names) == ["cabinet_drawer"] and not snap.snapshot.task_success


def test_topic_holds_sent_before_a_reset_or_after_a_reflex_trip_are_not_followed():
    """The race a fresh CI machine found: a client's final hold (topic) and the next reset (service) are handled
    in separate callbacks, in either order; the hold handled after the reset must not drive the new episode's
    arm back to where the old episode stopped. The node runs in this process and its callbacks are called as
    rclpy calls them, with the MessageInfo the middleware fills in (DDS stamps each message at its writer)."""
    import rclpy
    from rclpy.parameter import Parameter

    from captain_ros.ros.twin_node import TwinNode
    from captain_ros.twin.controller import ReflexTrip

    context = rclpy.Context()
    rclpy.init(context=context)
    start = f"{TASK}/official/2"
    overrides = [
        Parameter("task", value=TASK),
        Parameter("start_id", value=start),
        Parameter("camera_rate_hz", value=0.0),
    ]
    node = TwinNode(context=context, parameter_overrides=overrides)
    try:
        far = np.asarray(PANDA.home_q) + 0.4  # where the previous episode's arm stopped
        hold = JointTrajectory(
            joint_names=list(PANDA.arm_joints),
            points=[JointTrajectoryPoint(positions=far.tolist(), time_from_start=Duration(nanosec=10_000_000))],
        )
        sent_ns = time.time_ns()
        assert node._on_reset(ResetEpisode.Request(task=TASK, start_id=start), ResetEpisode.Response()).success
        arm = node.controllers.arm
        node._on_topic("arm", hold, {"source_timestamp": sent_ns, "received_timestamp": time.time_ns()})
        assert arm.active_token() is None  # dropped: the new episode's arm holds where the reset put it
        node._on_topic("arm", hold, {"source_timestamp": time.time_ns(), "received_timestamp": time.time_ns()})
        assert arm.active_token() is not None  # one sent after the reset is followed
        # after a force reflex trip the arm holds where it stopped until the next trajectory goal. The physics
        # thread arms the reflex (clearing any trip) once it has measured the rest load after the reset: inject
        # the trip only after that, however slowly the loaded machine runs that thread
        deadline = time.monotonic() + 60.0
        while not node.controllers.reflex.armed:
            assert time.monotonic() < deadline, "the reflex never measured its rest load after the reset"
            time.sleep(0.01)
        arm.hold(PANDA.home_q)
        node.controllers.reflex.tripped = ReflexTrip(node.twin.time_s, 40.0, 15.0)
        node._on_topic("arm", hold, {"source_timestamp": time.time_ns(), "received_timestamp": time.time_ns()})
        assert arm.active_token() is None
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)
