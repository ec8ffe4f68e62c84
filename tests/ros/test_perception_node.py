"""perception_node over DDS: twin_node (cameras at 5 Hz), perception_node and motion_node in their own
processes. One test drives every perception call through /perception/call, fetches images through
/perception/get_observation, and makes observations stale with an executed receipt; another checks that
the motion node's completion gate counts measurements the perception node made."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from std_srvs.srv import Trigger
from visualization_msgs.msg import MarkerArray

from captain_interfaces.msg import CallResult as CallResultMsg
from captain_interfaces.srv import GetObservation, HarnessCall
from captain_ros.core import robot
from captain_ros.ros.convert import quat_wxyz

from .helpers import (
    LOADED_MACHINE_PERCEPTION,
    LOADED_MACHINE_STATE_TIMEOUT_S,
    LOADED_MACHINE_WRENCH_LAG_S,
    launch_node,
    launch_twin,
    result_of,
    set_parameters,
    stop,
    wait_for,
)

PANDA = robot.default_profile()  # the twin's arm

pytestmark = [pytest.mark.ros, pytest.mark.slow]
TASK = "put_red_cube_in_bowl"


@pytest.fixture(scope="module")
def nodes():
    twin, twin_lines = launch_twin(TASK, f"{TASK}/wide/3", real_time_factor=1.0, camera_rate_hz=5.0)
    proc, lines = launch_node("perception_node", *LOADED_MACHINE_PERCEPTION)
    motion, motion_lines = launch_node(
        "motion_node",
        ("watchdog", False),
        ("state_timeout_s", LOADED_MACHINE_STATE_TIMEOUT_S),
        ("wrench_max_lag_s", LOADED_MACHINE_WRENCH_LAG_S),
    )
    yield lines, twin_lines, motion_lines, twin
    stop(motion)
    stop(proc)
    stop(twin)


def _call(client, capability: str, **kwargs) -> CallResultMsg:
    request = HarnessCall.Request(capability=capability, args_json=json.dumps(kwargs))
    return result_of(client.call_async(request), 60).result


def test_every_perception_call_over_dds(nodes, client_node):
    node = client_node
    call = node.create_client(HarnessCall, "/perception/call")
    get = node.create_client(GetObservation, "/perception/get_observation")
    if not call.wait_for_service(timeout_sec=60):
        raise RuntimeError("perception_node did not come up:\n" + "".join(nodes[0]))
    assert get.wait_for_service(timeout_sec=20)
    receipts: list[CallResultMsg] = []
    node.create_subscription(CallResultMsg, "/harness/receipts", receipts.append, 50)
    publish = node.create_publisher(CallResultMsg, "/harness/receipts", 10)
    markers: list[MarkerArray] = []
    node.create_subscription(MarkerArray, "/captain/markers", markers.append, 10)

    def perceive(capability: str, **kwargs) -> dict:
        result = _call(call, capability, **kwargs)
        assert result.success, f"{capability}: {result.failure_category}: {result.message}"
        assert result.receipt.startswith(capability) and len(result.receipt) <= 300
        return json.loads(result.value_json)

    # the cameras need a moment to publish their first frames
    wait_for(lambda: _call(call, "observe").success, 60, "a first observation")
    handle = perceive("observe")["observation_handle"]
    cube = perceive("segment", text="red cube")["detections"][0]
    bowl = perceive("segment", text="black bowl")["detections"][0]
    u0, v0, u1, v1 = cube["bbox_px"]
    mark = perceive("mark_point", observation_handle=handle, camera="head", u=(u0 + u1) / 1022, v=(v0 + v1) / 1022)
    np.testing.assert_allclose(mark["position_m"], cube["position_m"], atol=0.005)
    chosen = perceive(
        "select_detection", candidates=[cube["detection_id"], bowl["detection_id"]], evidence=mark["detection_id"]
    )
    assert chosen["detection_id"] == cube["detection_id"]
    pointed = perceive("point", text="green cube")
    geometry = perceive("measure_object_geometry", object=cube["detection_id"], destination=bowl["detection_id"])
    assert geometry["kind"] == "cube" and geometry["destination"]["kind"] == "bowl"
    np.testing.assert_allclose(geometry["extents_m"], [0.045, 0.045, 0.045], atol=0.005)
    points = perceive("measure_image_points", points=[[0.5, 0.9], [(u0 + u1) / 1022, (v0 + v1) / 1022]])
    assert points["points"][1]["height_above_table_m"] > 0.02
    contact = perceive(
        "inspect_contact_geometry", object=cube["detection_id"], pose={"position": cube["position_m"], "yaw_deg": 0}
    )
    assert contact["fits_between_pads"]
    release = perceive("inspect_release_geometry", object=cube["detection_id"], destination=bowl["detection_id"])
    assert release["footprint_inside"]
    images = result_of(get.call_async(GetObservation.Request(handle=handle, include_depth=True)), 30)
    assert images.result.success and list(images.observation.cameras) == ["head", "wrist"]
    assert images.observation.color[0].encoding == "rgb8" and images.observation.depth[0].encoding == "32FC1"
    assert images.observation.camera_info[0].k[0] > 100
    unknown = result_of(get.call_async(GetObservation.Request(handle="obs-99")), 30).result
    assert unknown.failure_category == "invalid_argument" and "unknown observation handle" in unknown.message

    # the motion node reports an executed move: everything seen before is stale now
    publish.publish(CallResultMsg(capability="move_to", success=True, executed=True))
    wait_for(
        lambda: (
            _call(call, "measure_object_geometry", object=pointed["detection_id"]).failure_category
            == "stale_observation"
        ),
        10,
        "the stale receipt to take effect",
    )
    perceive("observe")
    tracked = perceive("track_target", detection=cube["detection_id"])
    compared = perceive("compare_object_observations", before=cube["detection_id"], after=tracked["detection_id"])
    assert not compared["moved"] and compared["distance_m"] < 0.005
    wait_for(lambda: {r.capability for r in receipts} >= {"observe", "segment", "track_target"}, 10, "receipts")
    # rviz shows the detections as labelled boxes
    wait_for(
        lambda: f"{cube['detection_id']} red cube" in {m.text for a in markers for m in a.markers},
        10,
        "the cube's marker",
    )


def test_completion_gate_counts_measurements_made_by_the_perception_node(nodes, client_node):
    """finish goes to the motion node, the verification to the perception node: the gate sees it through
    /harness/receipts. With no rejection used yet, an accepted finish is the gate's own verdict."""
    node = client_node
    harness = node.create_client(HarnessCall, "/harness/call")
    perception = node.create_client(HarnessCall, "/perception/call")
    if not harness.wait_for_service(timeout_sec=60):
        raise RuntimeError("motion_node did not come up:\n" + "".join(nodes[2]))
    assert perception.wait_for_service(timeout_sec=60)
    receipts: list[CallResultMsg] = []
    node.create_subscription(CallResultMsg, "/harness/receipts", receipts.append, 50)

    moved = _call(harness, "move_to", pose={"position": [0.45, 0.0, 0.35], "yaw_deg": 0})
    assert moved.success and moved.executed, moved.message
    gate = node.create_client(Trigger, "/harness/gate")
    assert gate.wait_for_service(timeout_sec=20)
    objections = result_of(gate.call_async(Trigger.Request()), 10)
    assert not objections.success and "verify the scene" in objections.message
    wait_for(lambda: _call(perception, "observe").success, 60, "an observation after the move")
    wait_for(lambda: any(r.capability == "observe" and r.success for r in receipts), 10, "the observe receipt")
    # the receipt reaches the motion node on its own topic: wait until its gate has seen it (read-only)
    wait_for(lambda: result_of(gate.call_async(Trigger.Request()), 10).success, 20, "the gate to see the observe")
    finish = _call(harness, "finish", note="checked")
    assert finish.success and json.loads(finish.value_json)["accepted"], finish.message


def test_a_hand_eye_calibration_on_tf_static_places_the_wrist_camera(nodes, client_node):
    """real_arm.launch.py publishes the wrist camera's hand-eye calibration on /tf_static relative to the hand;
    perception composes it with the hand's pose at the image's joint state (here: 1 cm off the URDF's mount)."""
    from geometry_msgs.msg import TransformStamped
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from tf2_msgs.msg import TFMessage

    from captain_ros.core.kinematics import Kinematics

    node = client_node
    kin = Kinematics()
    p_hand, r_hand = kin.forward(PANDA.home_q, PANDA.hand_frame)
    p_cam, r_cam = kin.forward(PANDA.home_q, PANDA.camera_frames["wrist"])
    mount_p, mount_r = r_hand.T @ (p_cam - p_hand), r_hand.T @ r_cam  # the URDF's mount in the hand frame
    shift = np.array([0.01, 0.0, 0.0])
    t = TransformStamped(child_frame_id=PANDA.camera_frames["wrist"])
    t.header.frame_id = PANDA.hand_frame
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = map(float, mount_p + shift)
    w, x, y, z = quat_wxyz(mount_r)
    t.transform.rotation.x, t.transform.rotation.y, t.transform.rotation.z, t.transform.rotation.w = x, y, z, w
    latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL, reliability=ReliabilityPolicy.RELIABLE)
    node.create_publisher(TFMessage, "/tf_static", latched).publish(TFMessage(transforms=[t]))

    call = node.create_client(HarnessCall, "/perception/call")
    get = node.create_client(GetObservation, "/perception/get_observation")
    assert call.wait_for_service(timeout_sec=60) and get.wait_for_service(timeout_sec=20)

    def shifted_by_the_calibration() -> bool:
        """The wrist camera of a new observation sits `shift` (hand frame) off the URDF's mount at its joints."""
        handle = json.loads(_call(call, "observe").value_json)["observation_handle"]
        obs = result_of(get.call_async(GetObservation.Request(handle=handle)), 30).observation
        index = {n: i for i, n in enumerate(obs.joint_state.name)}
        q = np.array([obs.joint_state.position[index[j]] for j in PANDA.arm_joints])
        p = obs.camera_poses[list(obs.cameras).index("wrist")].pose.position
        offset = np.array([p.x, p.y, p.z]) - kin.forward(q, PANDA.camera_frames["wrist"])[0]
        return np.linalg.norm(offset - kin.forward(q, PANDA.hand_frame)[1] @ shift) < 1e-3

    wait_for(shifted_by_the_calibration, 30, "the calibration to take effect")


def test_a_camera_stream_that_goes_quiet_fails_observe_clearly(nodes, client_node):
    """The node's wall-clock limits on their own (the other tests widen them for a loaded machine): with the twin
    frozen (SIGSTOP) no image arrives, so once the last one is older than `stale_after_s`, observe fails as a
    backend_error that says how old it is; once the twin runs again, observe works again."""
    call = client_node.create_client(HarnessCall, "/perception/call")
    parameters = client_node.create_client(SetParameters, "/perception/set_parameters")
    assert call.wait_for_service(timeout_sec=60) and parameters.wait_for_service(timeout_sec=20)
    wait_for(lambda: _call(call, "observe").success, 60, "a first observation")

    bad = SetParameters.Request(
        parameters=[
            Parameter(
                name="stale_after_s", value=ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=-1.0)
            )
        ]
    )
    refused = result_of(parameters.call_async(bad), 30).results[0]
    assert not refused.successful and refused.reason  # a negative age is refused with a reason, the limit stays
    twin_pid = nodes[3].pid
    latest = []
    set_parameters(parameters, stale_after_s=0.5, pair_wait_s=0.1)
    os.kill(twin_pid, signal.SIGSTOP)
    try:
        # (a frame caught half-published can fail the colour and depth pairing first; staleness always comes)
        wait_for(lambda: not latest.append(_call(call, "observe")) and " s old" in latest[-1].message, 60, "a refusal")
    finally:
        os.kill(twin_pid, signal.SIGCONT)
        set_parameters(parameters, **dict(LOADED_MACHINE_PERCEPTION))
    assert latest[-1].failure_category == "backend_error" and not latest[-1].success and not latest[-1].executed
    wait_for(lambda: _call(call, "observe").success, 60, "observations once the twin runs again")
