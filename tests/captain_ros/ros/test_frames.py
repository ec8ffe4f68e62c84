"""captain_ros.ros.frames: the transform buffer, with each engine that is installed (pytransform3d on the wheel
setups, tf2_ros in a ROS workspace), fed directly and over DDS."""

from __future__ import annotations

import importlib.util
import threading

import numpy as np
import pytest
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from scipy.spatial.transform import Rotation, Slerp
from tf2_msgs.msg import TFMessage

from captain_ros.ros.frames import (
    DisconnectedFramesError,
    ExtrapolationError,
    FrameBuffer,
    FrameError,
    Transform,
    UnknownFrameError,
    default_engine,
    transform_msg,
)

from .helpers import wait_for

pytestmark = pytest.mark.ros
ENGINE_MODULES = {"pytransform3d": "pytransform3d", "tf2_ros": "tf2_ros"}


def rot(axis: str, deg: float) -> np.ndarray:
    return Rotation.from_euler(axis, deg, degrees=True).as_matrix()


@pytest.fixture(params=sorted(ENGINE_MODULES))
def engine(request) -> str:
    if importlib.util.find_spec(ENGINE_MODULES[request.param]) is None:
        pytest.skip(f"{request.param} is not installed here")
    return request.param


@pytest.fixture
def moving_hand(engine) -> FrameBuffer:
    """base -> hand on /tf at 10 s and 11 s (1 m along x, 90 deg about z in between); hand -> camera on
    /tf_static (a hand-eye calibration: 10 cm along the hand's x, looking along its y)."""
    frames = FrameBuffer(engine=engine)
    frames.add([transform_msg("base", "hand", [0.0, 0.0, 0.5], rot("z", 0), 10.0)])
    frames.add([transform_msg("base", "hand", [1.0, 0.0, 0.5], rot("z", 90), 11.0)])
    frames.add([transform_msg("hand", "camera", [0.1, 0.0, 0.0], rot("x", -90))], static=True)
    return frames


def test_the_engine_is_tf2_ros_where_installed_else_pytransform3d():
    expected = "tf2_ros" if importlib.util.find_spec("tf2_ros") else "pytransform3d"
    assert default_engine() == expected and FrameBuffer().engine_name == expected


def test_a_stamp_between_two_transforms_is_interpolated(moving_hand):
    """tf2's interpolation: the position linearly, the rotation by slerp, at a quarter of the way."""
    hand = moving_hand.lookup("base", "hand", 10.25)
    np.testing.assert_allclose(hand.position_m, [0.25, 0.0, 0.5], atol=1e-9)
    expected = Slerp([0.0, 1.0], Rotation.from_matrix([rot("z", 0), rot("z", 90)]))(0.25).as_matrix()
    np.testing.assert_allclose(hand.rotation, expected, atol=1e-9)
    assert hand.stamp_ns == 10_250_000_000 and (hand.target, hand.source) == ("base", "hand")
    at_sample = moving_hand.lookup("base", "hand", 11.0)  # a sample's own stamp: that sample
    np.testing.assert_allclose(at_sample.position_m, [1.0, 0.0, 0.5], atol=1e-12)


def test_a_static_calibration_chains_with_the_moving_link(moving_hand):
    camera = moving_hand.lookup("base", "camera", 11.0)
    # at 11 s the hand is turned 90 deg about z: its x (where the camera sits) is the base's y
    np.testing.assert_allclose(camera.position_m, [1.0, 0.1, 0.5], atol=1e-9)
    np.testing.assert_allclose(camera.rotation, rot("z", 90) @ rot("x", -90), atol=1e-9)
    inverse = moving_hand.lookup("camera", "base", 11.0)  # the other way round is the inverse
    np.testing.assert_allclose(inverse.as_matrix() @ camera.as_matrix(), np.eye(4), atol=1e-9)


def test_no_stamp_means_the_newest_time_the_whole_chain_has(moving_hand):
    moving_hand.add([transform_msg("world", "base", [0.0, 0.0, 0.0], rot("z", 0), 10.5)])  # slower: 10.5 s
    latest = moving_hand.lookup("world", "camera")
    assert latest.stamp_ns == 10_500_000_000  # not 11 s: world -> base is not known that late
    np.testing.assert_allclose(latest.position_m, moving_hand.lookup("world", "camera", 10.5).position_m)
    static = moving_hand.lookup("hand", "camera")
    assert static.stamp_ns is None  # only static transforms: valid at any time
    np.testing.assert_allclose(static.position_m, [0.1, 0.0, 0.0], atol=1e-12)


def test_an_unknown_frame_is_refused_by_name(moving_hand):
    with pytest.raises(UnknownFrameError, match="tool0_controller"):
        moving_hand.lookup("hand", "tool0_controller", 10.5)


def test_a_stamp_outside_the_buffer_is_an_extrapolation_error_that_says_which_way(moving_hand):
    with pytest.raises(ExtrapolationError) as later:
        moving_hand.lookup("base", "camera", 11.5)
    assert later.value.future and "future" in str(later.value)
    with pytest.raises(ExtrapolationError) as earlier:
        moving_hand.lookup("base", "camera", 9.0)
    assert not earlier.value.future and "past" in str(earlier.value)


def test_frames_in_trees_nothing_joins_are_disconnected(moving_hand):
    moving_hand.add([transform_msg("camera_link", "camera_color_optical_frame", [0, 0, 0], rot("x", 0))], static=True)
    with pytest.raises(DisconnectedFramesError):
        moving_hand.lookup("base", "camera_color_optical_frame", 10.5)


def test_a_frame_has_one_parent_the_latest_publisher_wins(engine):
    frames = FrameBuffer(engine=engine)
    frames.add([transform_msg("base", "camera", [1.0, 0.0, 0.0], rot("z", 0))], static=True)
    frames.add([transform_msg("hand", "camera", [0.0, 2.0, 0.0], rot("z", 0))], static=True)
    frames.add([transform_msg("base", "hand", [0.0, 0.0, 1.0], rot("z", 0))], static=True)
    np.testing.assert_allclose(frames.lookup("base", "camera").position_m, [0.0, 2.0, 1.0], atol=1e-12)


def test_a_clock_reset_clears_the_tf_history_and_keeps_the_static_transforms(moving_hand):
    """A simulator reset restarts its clock: samples from before it must not be interpolated with new ones."""
    moving_hand.add([transform_msg("base", "hand", [0.3, 0.0, 0.5], rot("z", 0), 0.2)])
    with pytest.raises(ExtrapolationError):
        moving_hand.lookup("base", "hand", 10.5)  # the old episode's samples are gone
    camera = moving_hand.lookup("base", "camera", 0.2)  # the calibration survived
    np.testing.assert_allclose(camera.position_m, [0.4, 0.0, 0.5], atol=1e-9)


def test_a_calibration_hangs_on_a_link_placed_by_the_caller(moving_hand):
    """lookup_with: the camera's /tf_static chain up to the hand, the hand where the caller says (the arm's
    kinematics at an image's joint state), whatever /tf says about the hand."""
    assert moving_hand.static_chain("camera") == ["hand"]
    hand = Transform("base", "hand", np.array([0.0, 0.0, 2.0]), rot("z", 180), None)
    camera = moving_hand.lookup_with("base", "camera", "hand", hand)
    np.testing.assert_allclose(camera.position_m, [-0.1, 0.0, 2.0], atol=1e-9)
    np.testing.assert_allclose(camera.rotation, rot("z", 180) @ rot("x", -90), atol=1e-9)
    with pytest.raises(DisconnectedFramesError):
        moving_hand.lookup_with("base", "camera", "forearm", hand)
    moving_hand.add([transform_msg("base", "head_camera", [1.0, 0.0, 0.8], rot("y", 90))], static=True)
    base = Transform("base", "base", np.zeros(3), np.eye(3), None)  # a fixed camera: calibrated on the base itself
    head = moving_hand.lookup_with("base", "head_camera", "base", base)
    np.testing.assert_allclose(head.position_m, [1.0, 0.0, 0.8], atol=1e-12)


def test_over_dds_a_latched_calibration_and_a_moving_link(client_node):
    """/tf_static published before the buffer subscribes still arrives (transient local); a lookup at a stamp /tf
    has not reached yet waits for it."""
    latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL, reliability=ReliabilityPolicy.RELIABLE)
    static_pub = client_node.create_publisher(TFMessage, "/tf_static", latched)
    static_pub.publish(TFMessage(transforms=[transform_msg("hand", "camera", [0.1, 0.0, 0.0], rot("x", 0))]))
    frames = FrameBuffer(client_node)
    assert frames.subscribed
    wait_for(lambda: frames.static_chain("camera") == ["hand"], 30, "the latched calibration")
    tf_pub = client_node.create_publisher(TFMessage, "/tf", 10)
    wait_for(lambda: tf_pub.get_subscription_count() > 0, 30, "the buffer's /tf subscription")
    tf_pub.publish(TFMessage(transforms=[transform_msg("base", "hand", [0.0, 0.0, 0.5], rot("z", 0), 20.0)]))
    wait_for(lambda: _known(frames, 20.0), 30, "the first /tf sample")

    result: list = []
    waiter = threading.Thread(target=lambda: result.append(frames.wait_for("base", "camera", 20.5, 60.0)))
    waiter.start()
    tf_pub.publish(TFMessage(transforms=[transform_msg("base", "hand", [1.0, 0.0, 0.5], rot("z", 0), 21.0)]))
    waiter.join(timeout=90)
    assert result, "wait_for did not return"
    np.testing.assert_allclose(result[0].position_m, [0.6, 0.0, 0.5], atol=1e-9)
    with pytest.raises(ExtrapolationError):  # data older than the buffer holds: waiting cannot help, no wait
        frames.wait_for("base", "camera", 5.0, 60.0)


def _known(frames: FrameBuffer, stamp_s: float) -> bool:
    try:
        frames.lookup("base", "camera", stamp_s)
    except FrameError:  # not there yet
        return False
    return True
