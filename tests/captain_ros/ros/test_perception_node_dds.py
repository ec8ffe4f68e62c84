"""perception_node over DDS: twin_node (cameras at 5 Hz), perception_node and motion_node in their own
processes. One test drives every perception call through /perception/call, fetches images through
/perception/get_observation, and makes observations stale with an executed receipt; another checks that
the motion node's completion gate counts measurements the perception node made. The camera-pose tests run a
second perception node on a camera this process publishes itself (images, joint states and /tf), under names of
its own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from scipy.spatial.transform import Rotation, Slerp
from sensor_msgs.msg import CameraInfo, Image, JointState
from std_msgs.msg import Header
from std_srvs.srv import Trigger
from tf2_msgs.msg import TFMessage
from visualization_msgs.msg import MarkerArray

from captain_interfaces.msg import CallResult as CallResultMsg
from captain_interfaces.srv import GetObservation, HarnessCall
from captain_ros.core import robot
from captain_ros.paths import config_path
from captain_ros.ros.convert import image_msg, quat_wxyz, stamp_msg
from captain_ros.ros.frames import transform_msg

from .helpers import (
    LOADED_MACHINE_PERCEPTION,
    launch_motion_node,
    launch_perception_node,
    launch_twin,
    node_processes,
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
    with node_processes() as started:
        started["twin"] = launch_twin(TASK, f"{TASK}/wide/3", real_time_factor=1.0, camera_rate_hz=5.0)
        started["perception"] = launch_perception_node()
        started["motion"] = launch_motion_node(("watchdog", False), ("shadow_check", True))
        yield started["perception"][1], started["twin"][1], started["motion"][1], started["twin"][0]


def _call(client, capability: str, **kwargs) -> CallResultMsg:
    request = HarnessCall.Request(capability=capability, args_json=json.dumps(kwargs))
    return result_of(client.call_async(request), 60).result


def _tracking_report(get, compared: dict, tracked: dict, cube: dict) -> str:
    """Everything that can tell why a detection tracked into a newer observation of an unchanged scene moved: both
    detections in full, and of the two observations' head cameras the poses and how much the images differ."""
    lines = [f"compared: {json.dumps(compared)}", f"tracked: {json.dumps(tracked)}", f"cube: {json.dumps(cube)}"]
    images = {}
    for handle in (cube["observation_handle"], tracked["observation_handle"]):
        obs = result_of(get.call_async(GetObservation.Request(handle=handle, include_depth=True)), 30).observation
        i = list(obs.cameras).index("head")
        p, q = obs.camera_poses[i].pose.position, obs.camera_poses[i].pose.orientation
        lines.append(
            f"{handle} head pose: ({p.x:.4f}, {p.y:.4f}, {p.z:.4f}) q ({q.w:.4f}, {q.x:.4f}, {q.y:.4f}, {q.z:.4f})"
        )
        images[handle] = (
            np.frombuffer(bytes(obs.color[i].data), np.uint8),
            np.frombuffer(bytes(obs.depth[i].data), np.float32),
        )
    (c0, d0), (c1, d1) = images.values()
    if c0.shape == c1.shape and d0.shape == d1.shape:
        lines.append(
            f"head colour bytes differing: {int((c0 != c1).sum())}; depth max |diff| {np.nanmax(np.abs(d0 - d1)):.4f} m"
        )
    return "\n".join(lines)


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
    # CI saw the cube 3.9 cm from itself here twice (not reproduced here): on failure, say what differed
    if compared["moved"] or compared["distance_m"] >= 0.005:
        raise AssertionError(_tracking_report(get, compared, tracked, cube))
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


def test_the_motion_nodes_shadow_check_learns_the_perception_nodes_measurements(nodes, client_node):
    """shadow_check:=true on the motion node (the ros2_control backend): a measurement made by the perception node
    reaches its shadow twin through /harness/receipts, and the next motion is played there first, its prediction
    carried in the result beside the outcome."""
    node = client_node
    harness = node.create_client(HarnessCall, "/harness/call")
    perception = node.create_client(HarnessCall, "/perception/call")
    assert harness.wait_for_service(timeout_sec=60) and perception.wait_for_service(timeout_sec=60)
    assert result_of(node.create_client(Trigger, "/harness/new_episode").call_async(Trigger.Request()), 10).success
    moved = _call(harness, "move_to", pose={"position": [0.4, 0.0, 0.4], "yaw_deg": 0})
    assert moved.success, moved.message
    wait_for(lambda: _call(perception, "observe").success, 60, "an observation after the move")
    found = _call(perception, "segment", text="red cube")
    assert found.success, found.message
    detection = json.loads(found.value_json)["detections"][0]["detection_id"]
    assert _call(perception, "measure_object_geometry", object=detection).success
    line = f"shadow check: measured {detection} "
    wait_for(lambda: any(line in x for x in nodes[2]), 30, "the motion node's shadow to learn the measurement")
    up = _call(harness, "move_to", pose={"position": [0.4, 0.05, 0.4], "yaw_deg": 0})
    assert up.success, up.message
    shadow = json.loads(up.value_json)["shadow"]
    assert shadow["predicted"]["objects"] == 1
    assert shadow["predicted"]["outcome"] == shadow["actual"]["outcome"] == "target_reached"
    assert "twin predicted target_reached" in up.receipt


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
    wait_for(lambda: _call(call, "observe").success, 60, "a first observation")  # the arm's joints have arrived

    def shifted_by_the_calibration() -> bool:
        """The wrist camera of a new observation sits `shift` (hand frame) off the URDF's mount at its joints."""
        observed = _call(call, "observe")
        assert observed.success, observed.message
        handle = json.loads(observed.value_json)["observation_handle"]
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


# ------------------------------------------------------------------ camera poses from /tf, on a camera of our own
FAKE = "/frames_test"  # the second perception node's topics and services
T1, T2, IMAGE_T = 1000.0, 1000.4, 1000.1  # two /tf samples and the image between them (a quarter of the way)
POSE_1 = (np.array([0.5, 0.0, 1.0]), Rotation.from_euler("x", 180, degrees=True))  # looking straight down
POSE_2 = (np.array([0.7, 0.2, 1.0]), Rotation.from_euler("zx", [60, 180], degrees=True))  # moved and turned


@pytest.fixture(scope="module")
def fake_camera(tmp_path_factory):
    """A perception node on the Panda's URDF whose cameras and joint states are topics under /frames_test, with
    its node name, services and outputs remapped apart from the twin's perception node; its output lines."""
    doc = yaml.safe_load(config_path("robots/panda_twin.yaml").read_text())
    doc["name"] = "frames_test"
    doc["interfaces"]["joint_states_topic"] = f"{FAKE}/joint_states"
    doc["interfaces"]["cameras"] = {
        cam: {kind: f"{FAKE}/{cam}/{kind}" for kind in ("color_topic", "depth_topic", "info_topic")}
        for cam in ("head", "wrist")
    }
    profile = tmp_path_factory.mktemp("profile") / "frames_test.yaml"
    profile.write_text(yaml.safe_dump(doc))
    exe = shutil.which("perception_node") or str(Path(sys.executable).with_name("perception_node"))
    args = [exe, "--ros-args", "-r", "__node:=frames_test_perception"]
    for name in ("/perception/call", "/perception/get_observation", "/harness/receipts", "/captain/markers"):
        args += ["-r", f"{name}:={FAKE}/{name.rsplit('/', 1)[1]}"]
    for name, value in (("robot_profile", profile), *LOADED_MACHINE_PERCEPTION):
        args += ["-p", f"{name}:={value}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        yield lines
    finally:
        stop(proc)


def _publish_camera(node, camera: str, frame: str, image_t: float = IMAGE_T) -> None:
    """Every 0.1 s: the camera's colour, depth and info stamped `image_t` in `frame`, the arm at home, and /tf
    base -> 'frames_test_camera' at T1 and T2 (POSE_1, POSE_2)."""
    header = Header(stamp=stamp_msg(image_t), frame_id=frame)
    color = image_msg(header, np.zeros((48, 64, 3), np.uint8), "rgb8")
    depth = image_msg(header, np.ones((48, 64), "<f4"), "32FC1")  # a floor 1 m below: the table
    info = CameraInfo(header=header, height=48, width=64, k=[40.0, 0.0, 32.0, 0.0, 40.0, 24.0, 0.0, 0.0, 1.0])
    names = [*PANDA.arm_joints, *PANDA.finger_joints]
    joints = JointState(header=Header(stamp=stamp_msg(image_t)), name=names, position=[*PANDA.home_q_rad, 0.04, 0.04])
    tf = TFMessage(
        transforms=[
            transform_msg(PANDA.base_frame, "frames_test_camera", p, r.as_matrix(), t)
            for t, (p, r) in ((T1, POSE_1), (T2, POSE_2))
        ]
    )
    pubs = [
        (node.create_publisher(Image, f"{FAKE}/{camera}/color_topic", 10), color),
        (node.create_publisher(Image, f"{FAKE}/{camera}/depth_topic", 10), depth),
        (node.create_publisher(CameraInfo, f"{FAKE}/{camera}/info_topic", 10), info),
        (node.create_publisher(JointState, f"{FAKE}/joint_states", 10), joints),
        (node.create_publisher(TFMessage, "/tf", 10), tf),
    ]
    node.create_timer(0.1, lambda: [pub.publish(msg) for pub, msg in pubs])


def _observe_until(call, camera: str, done, what: str) -> CallResultMsg:
    """observe(camera) until `done(result)` (the first images take a moment to arrive); the last result."""
    results: list[CallResultMsg] = []
    try:
        wait_for(lambda: not results.append(_call(call, "observe", cameras=[camera])) and done(results[-1]), 60, what)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; the last: {results[-1].failure_category}: {results[-1].message}") from None
    return results[-1]


def test_a_camera_pose_is_looked_up_on_tf_at_the_images_stamp_in_its_own_frame(fake_camera, client_node):
    """The head images come in 'frames_test_camera', a frame only /tf knows (not the profile's head frame), which
    /tf has at T1 and T2: the observation's camera pose is /tf interpolated at the image's stamp between them."""
    _publish_camera(client_node, "head", "frames_test_camera")
    call = client_node.create_client(HarnessCall, f"{FAKE}/call")
    get = client_node.create_client(GetObservation, f"{FAKE}/get_observation")
    if not call.wait_for_service(timeout_sec=60):
        raise RuntimeError("the second perception_node did not come up:\n" + "".join(fake_camera))
    assert get.wait_for_service(timeout_sec=20)
    observed = _observe_until(call, "head", lambda r: r.success, "an observation")
    handle = json.loads(observed.value_json)["observation_handle"]
    obs = result_of(get.call_async(GetObservation.Request(handle=handle)), 30).observation
    pose = obs.camera_poses[0].pose
    p, q = pose.position, pose.orientation
    np.testing.assert_allclose([p.x, p.y, p.z], POSE_1[0] + 0.25 * (POSE_2[0] - POSE_1[0]), atol=1e-6)
    expected = Slerp([0.0, 1.0], Rotation.concatenate([POSE_1[1], POSE_2[1]]))(0.25)
    assert (Rotation.from_quat([q.x, q.y, q.z, q.w]) * expected.inv()).magnitude() < 1e-6
    assert obs.color[0].header.frame_id == "frames_test_camera"  # the images keep their own frame
    told = "'frames_test_camera', the profile's camera_frames.head is 'head_camera_optical_frame'"
    wait_for(lambda: any(told in line for line in fake_camera), 20, "the frame mismatch warning")


def test_an_image_in_a_frame_nobody_publishes_fails_observe_clearly(fake_camera, client_node):
    _publish_camera(client_node, "wrist", "frames_test_nowhere")
    call = client_node.create_client(HarnessCall, f"{FAKE}/call")
    if not call.wait_for_service(timeout_sec=60):
        raise RuntimeError("the second perception_node did not come up:\n" + "".join(fake_camera))
    refused = _observe_until(call, "wrist", lambda r: "frames_test_nowhere" in r.message, "a refusal naming the frame")
    assert refused.failure_category == "backend_error" and not refused.success and not refused.executed
    assert "the profile names 'wrist_camera_optical_frame'" in refused.message
    assert "nothing publishes it" in refused.message or "does not exist" in refused.message  # pytransform3d / tf2


def test_a_camera_pose_tf_has_but_not_at_the_images_stamp_fails_observe(fake_camera, client_node):
    """/tf has 'frames_test_camera' only up to T2 and the images come after it: observe waits `tf_wait_s`, then
    fails naming the frame and the parameter, rather than taking the URDF's nominal pose (the twin moves its head
    camera per start: the URDF would put every point centimetres off)."""
    _publish_camera(client_node, "head", "frames_test_camera", image_t=T2 + 1.0)
    call = client_node.create_client(HarnessCall, f"{FAKE}/call")
    parameters = client_node.create_client(SetParameters, "/frames_test_perception/set_parameters")
    if not call.wait_for_service(timeout_sec=60):
        raise RuntimeError("the second perception_node did not come up:\n" + "".join(fake_camera))
    set_parameters(parameters, tf_wait_s=0.2)
    try:
        refused = _observe_until(call, "head", lambda r: "not at the image's stamp" in r.message, "a refusal")
    finally:
        set_parameters(parameters, **dict(LOADED_MACHINE_PERCEPTION))
    assert refused.failure_category == "backend_error" and not refused.success and not refused.executed
    assert "/tf has 'frames_test_camera' but not at the image's stamp within 0.2 s" in refused.message
    assert "raise the parameter tf_wait_s" in refused.message
