"""Bad input for every argument of every harness call: invalid_argument, a message naming the argument,
and nothing moves or is counted."""

import math

import numpy as np
import pytest

from captain_ros.core.contract import FailureCategory

GOOD_POSE = {"position": [0.4, 0.0, 0.3], "yaw_deg": 0}
NAN = math.nan

CASES = [
    # move_to
    ("move_to", {}, "exactly one of pose"),
    ("move_to", {"pose": GOOD_POSE, "gripper": "open"}, "exactly one of pose"),
    ("move_to", {"pose": "home"}, "is not a pose"),
    ("move_to", {"pose": [0.4, 0.0, 0.3]}, "is not a pose"),
    ("move_to", {"pose": {"position": [0.4, 0.0]}, "yaw_deg": 0}, "unexpected arguments"),
    ("move_to", {"pose": {"position": [0.4, 0.0], "yaw_deg": 0}}, "pose.position must have 3 numbers"),
    ("move_to", {"pose": {"position": [0.4, NAN, 0.3], "yaw_deg": 0}}, "pose.position[1] must be finite"),
    ("move_to", {"pose": {"position": [0.4, math.inf, 0.3], "yaw_deg": 0}}, "must be finite"),
    ("move_to", {"pose": {"position": [0.4, "0", 0.3], "yaw_deg": 0}}, "pose.position[1] must be a number"),
    ("move_to", {"pose": {"position": [0.4, 0.0, 0.3]}}, "exactly one of 'quaternion'"),
    ("move_to", {"pose": {"position": [0.4, 0.0, 0.3], "yaw_deg": 0, "rpy_deg": [0, 0, 0]}}, "exactly one of"),
    ("move_to", {"pose": {"position": [0.4, 0.0, 0.3], "quaternion": [0, 0, 0, 0.5]}}, "unit quaternion"),
    ("move_to", {"pose": {"position": [0.4, 0.0, 0.3], "quaternion": [0, 0, 1]}}, "must have 4 numbers"),
    ("move_to", {"pose": {"position": [0.4, 0.0, 0.3], "yaw_deg": NAN}}, "pose.yaw_deg must be finite"),
    ("move_to", {"pose": {"position": [0.4, 0.0, 0.3], "rpy_deg": [0, NAN, 0]}}, "rpy_deg[1] must be finite"),
    ("move_to", {"pose": {"position": [0.4, 0.0, 0.3], "yaw_deg": 0, "frame": "tcp"}}, "unknown keys"),
    ("move_to", {"pose": [0.4, 0, 0.3, 0, 0, 0, 1.5]}, "unit quaternion"),
    ("move_to", {"gripper": "half"}, "gripper must be 'open', 'close' or an opening"),
    ("move_to", {"gripper": 0.2}, "gripper must be <= 0.08"),
    ("move_to", {"gripper": -0.01}, "gripper must be >= 0"),
    ("move_to", {"gripper": NAN}, "gripper must be finite"),
    ("move_to", {"gripper": True}, "gripper must be a number"),
    ("move_to", {"pose": GOOD_POSE, "mode": "gentle"}, "mode must be one of"),
    ("move_to", {"pose": GOOD_POSE, "speed_mps": 5.0}, "speed_mps must be <="),
    ("move_to", {"pose": GOOD_POSE, "speed_mps": 0.0}, "speed_mps must be >="),
    ("move_to", {"pose": GOOD_POSE, "speed_mps": NAN}, "speed_mps must be finite"),
    ("move_to", {"pose": GOOD_POSE, "duration_s": -1}, "duration_s must be >= 0"),
    ("move_to", {"pose": GOOD_POSE, "duration_s": "2s"}, "duration_s must be a number"),
    ("move_to", {"pose": GOOD_POSE, "force_limit_n": 500}, "force_limit_n must be <= 40"),
    ("move_to", {"pose": GOOD_POSE, "force_limit_n": 1}, "force_limit_n must be >= 3"),
    ("move_to", {"pose": GOOD_POSE, "colour": "red"}, "unexpected arguments"),
    # hold
    ("hold", {"duration_s": -2}, "duration_s must be >= 0"),
    ("hold", {"duration_s": 3600}, "duration_s must be <= 30"),
    ("hold", {"duration_s": NAN}, "must be finite"),
    ("hold", {"force_limit_n": 99}, "force_limit_n must be <= 40"),
    # recover
    ("recover", {"distance_m": 0.5}, "distance_m must be <= 0.1"),
    ("recover", {"distance_m": 0}, "distance_m must be >= 0.001"),
    ("recover", {"distance_m": 0.05, "speed_mps": -1}, "speed_mps must be >="),
    ("recover", {}, "no executed motion to reverse"),
    # release
    ("release", {"opening_m": 0.5}, "opening_m must be <="),
    ("release", {"opening_m": NAN}, "must be finite"),
    ("release", {"opening_m": "wide"}, "opening_m must be a number"),
    # check_motion / preview_motion
    ("check_motion", {}, "check_motion needs pose"),
    ("check_motion", {"pose": {"position": [NAN, 0, 0.2], "yaw_deg": 0}}, "must be finite"),
    ("check_motion", {"pose": GOOD_POSE, "speed_mps": 9}, "speed_mps must be <="),
    ("preview_motion", {}, "preview_motion needs pose"),
    ("preview_motion", {"pose": GOOD_POSE, "duration_s": 1e9}, "duration_s must be <= 60"),
    # state calls take no arguments
    ("get_robot_state", {"verbose": True}, "unexpected arguments"),
    ("gripper_state", {"x": 1}, "unexpected arguments"),
    ("robot_geometry", {"units": "mm"}, "unexpected arguments"),
    # read_motion_trajectory
    ("read_motion_trajectory", {}, "no motion has been executed"),
    # transform_pose
    ("transform_pose", {}, "transform_pose needs pose"),
    ("transform_pose", {"pose": GOOD_POSE, "from_frame": "moon"}, "from_frame must be one of"),
    ("transform_pose", {"pose": GOOD_POSE, "to_frame": 3}, "to_frame must be one of"),
    ("transform_pose", {"pose": GOOD_POSE, "offset_m": [0, 0]}, "offset_m must have 3 numbers"),
    ("transform_pose", {"pose": GOOD_POSE, "offset_m": [0, 0, NAN]}, "offset_m[2] must be finite"),
    # finish
    ("finish", {"note": 42}, "note must be a string"),
    ("finish", {"note": "x", "score": 1}, "unexpected arguments"),
    # not a capability
    ("teleport", {}, "unknown capability 'teleport'"),
]


@pytest.mark.parametrize(
    ("capability", "kwargs", "message"), CASES, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(CASES)]
)
def test_bad_input_is_refused_with_a_clear_message_and_nothing_moves(harness, twin, capability, kwargs, message):
    q0, jaw0 = twin.arm_q(), twin.jaw_opening_m()
    result = harness.call(capability, **kwargs)
    assert not result.success
    assert result.failure_category is FailureCategory.INVALID_ARGUMENT
    assert message in result.message, result.message
    assert not result.executed and harness.budget.actions_used == 0
    assert result.receipt.startswith(f"{capability}: FAILED invalid_argument")
    np.testing.assert_allclose(twin.arm_q(), q0, atol=1e-9)
    assert twin.jaw_opening_m() == pytest.approx(jaw0, abs=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"motion_id": 0}, "motion_id must be >= 1"),
        ({"motion_id": 2}, "motion_id must be <= 1"),
        ({"motion_id": 1.5}, "motion_id must be a whole number"),
        ({"page": -1}, "page must be >= 0"),
        ({"page": 10**6}, "page must be <="),
        ({"page": "first"}, "page must be a number"),
    ],
)
def test_bad_trajectory_pages(harness, kwargs, message):
    harness.call("move_to", gripper=0.06)
    result = harness.call("read_motion_trajectory", **kwargs) if harness.motions else None
    if result is None:  # a jaw move records no arm trace: make one arm motion first
        harness.call("hold", duration_s=0.1)
        result = harness.call("read_motion_trajectory", **kwargs)
    assert result.failure_category is FailureCategory.INVALID_ARGUMENT and message in result.message
