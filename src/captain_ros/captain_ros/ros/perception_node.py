"""perception_node: the perception capabilities over ROS, from any RGB-D cameras (twin or real).

In:  <cam> color + aligned depth images and CameraInfo (names from the robot profile), /joint_states,
     /tf and /tf_static (captain_ros.ros.frames: tf2_ros where it is installed), /harness/receipts (an executed
     physical action makes earlier observations stale).
Out: /perception/call            captain_interfaces/srv/HarnessCall    observe, segment, point, mark_point,
                                 select_detection, track_target, measure_object_geometry, measure_image_points,
                                 inspect_contact_geometry, inspect_release_geometry, compare_object_observations
     /perception/get_observation captain_interfaces/srv/GetObservation the images of an observation handle
     /harness/receipts           captain_interfaces/msg/CallResult     every result
     /captain/markers            visualization_msgs/MarkerArray        detections as labelled boxes (rviz)
Segmentation is the built-in RGB-D segmenter unless harness.yaml names an HTTP server. The simulator's
ground truth is never used here.

Each image's camera pose is that of the image's own frame (header.frame_id) in the base frame at the image's
stamp, the first of:
  1. a hand-eye calibration on /tf_static that hangs the frame on a link of the arm (real_arm.launch.py's, from
     config/camera_calibration/<profile>.yaml: a fixed camera's on the base, a wrist camera's on the hand),
     chained with that link at the image's joint state: the time-correct answer, without waiting for
     robot_state_publisher;
  2. /tf at the image's stamp, interpolated (the twin publishes its links and cameras there), waiting up to
     `tf_wait_s` for /tf to reach the stamp; a frame /tf has but not at that stamp (late, or older than the
     buffer) fails observe: the URDF's nominal pose may not be where /tf puts the camera;
  3. the URDF at the image's joint state, for setups without the frame on /tf.
An image whose frame_id differs from the profile's camera frame is used in its own frame, with a warning (the
frame says where the pixels were taken; the profile's name is what the calibration and the URDF use): if that
frame cannot be placed, observe fails with an error naming both. The calibration's frames need not be links of
the arm's URDF.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections import defaultdict, deque
from pathlib import Path

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import PoseStamped
from rcl_interfaces.msg import FloatingPointRange, ParameterDescriptor
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import CameraInfo, Image, JointState
from std_msgs.msg import Header
from visualization_msgs.msg import Marker, MarkerArray

from captain_interfaces.msg import CallResult as CallResultMsg
from captain_interfaces.msg import Observation as ObservationMsg
from captain_interfaces.srv import GetObservation, HarnessCall
from captain_ros.core import robot
from captain_ros.core.clock import StampedHistory
from captain_ros.core.config import load_config
from captain_ros.core.contract import CAPABILITY_BY_NAME, CallResult, FailureCategory
from captain_ros.core.kinematics import Kinematics
from captain_ros.harness.backend import BackendError
from captain_ros.harness.dispatch import dispatch
from captain_ros.paths import config_path
from captain_ros.perception.observation import CameraImage, PerceptionError
from captain_ros.perception.perception import Perception
from captain_ros.ros.convert import call_result_to_msg, camera_info, image_msg, pose_msg, quat_wxyz, stamp_msg
from captain_ros.ros.description import resolve_profile
from captain_ros.ros.frames import ExtrapolationError, FrameBuffer, FrameError, Transform, UnknownFrameError
from captain_ros.ros.guard import GuardedNode
from captain_ros.ros.spin import SideNode, spin

STALE_AFTER_S = 2.0  # default (parameter stale_after_s), wall seconds: older camera or joint messages are not current
SYNC_TOLERANCE_S = 0.02  # colour and depth stamps must agree this well
PAIR_WAIT_S = 1.0  # default (parameter pair_wait_s): how long observe waits for a colour and depth pair
TF_WAIT_S = 0.5  # default (parameter tf_wait_s): how long observe waits for /tf to reach an image's stamp
HISTORY = 4  # messages kept per stream for pairing
JOINT_HISTORY_S = 2.0  # joint states kept (by their stamps: 200 at the twin's 100 Hz, 2,000 at a Franka's 1 kHz)


def image_to_array(msg: Image) -> np.ndarray:
    """rgb8/bgr8 -> (H, W, 3) uint8 RGB; 32FC1 (m) or 16UC1 (mm) -> (H, W) float32 metres."""
    raw = bytes(msg.data)
    if msg.encoding in ("rgb8", "bgr8"):
        rgb = (
            np.frombuffer(raw, np.uint8)
            .reshape(msg.height, msg.step)[:, : msg.width * 3]
            .reshape(msg.height, msg.width, 3)
        )
        return rgb[..., ::-1].copy() if msg.encoding == "bgr8" else rgb.copy()
    if msg.encoding == "32FC1":
        dtype = ">f4" if msg.is_bigendian else "<f4"
        return np.frombuffer(raw, dtype).reshape(msg.height, msg.step // 4)[:, : msg.width].astype(np.float32)
    if msg.encoding in ("16UC1", "mono16"):
        dtype = ">u2" if msg.is_bigendian else "<u2"
        mm = np.frombuffer(raw, dtype).reshape(msg.height, msg.step // 2)[:, : msg.width]
        return mm.astype(np.float32) / 1000.0
    raise BackendError(f"unsupported image encoding {msg.encoding!r} (rgb8, bgr8, 32FC1, 16UC1)")


def _seconds(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


class RawImage:
    """A sensor_msgs/Image as it came off the wire (CDR), deserialized only when an observe picks it.

    The cameras stream far more than observe ever uses (head and wrist colour and depth, 3.6 MB a frame): turned into
    Python messages as they came, they cost this node more CPU, under the interpreter's lock, than the observe calls
    themselves. Pairing needs only the stamp, which every CDR-encoded message with a std_msgs/Header has first: after
    the 4-byte encapsulation header (its second byte says the byte order), int32 sec and uint32 nanosec."""

    __slots__ = ("data", "header")

    def __init__(self, data: bytes):
        if len(data) < 12:
            raise ValueError(f"a serialized Image of {len(data)} bytes has no header")
        sec, nanosec = struct.unpack_from("<iI" if data[1] & 1 else ">iI", data, 4)
        self.data = data
        self.header = Header(stamp=Time(sec=sec, nanosec=nanosec))

    def message(self) -> Image:
        return deserialize_message(self.data, Image)


class PerceptionNode(GuardedNode, Node):
    def __init__(self) -> None:
        super().__init__("perception")
        self.declare_parameter(
            "robot_profile",
            str(robot.DEFAULT_PROFILE),
            ParameterDescriptor(description="robot profile (config/robots/<name>.yaml or a path): cameras, joints"),
        )
        self.declare_parameter(
            "harness_config",
            str(config_path("harness.yaml")),
            ParameterDescriptor(description="perception section: segmenter and pointing servers"),
        )
        seconds = [FloatingPointRange(from_value=0.0, to_value=3600.0, step=0.0)]  # rclpy refuses values outside
        self.declare_parameter(
            "stale_after_s",
            STALE_AFTER_S,
            ParameterDescriptor(
                description="wall seconds after which a camera or joint stream counts as gone",
                floating_point_range=seconds,
            ),
        )
        self.declare_parameter(
            "pair_wait_s",
            PAIR_WAIT_S,
            ParameterDescriptor(
                description="wall seconds observe waits for a fresh colour and depth pair",
                floating_point_range=seconds,
            ),
        )
        self.declare_parameter(
            "tf_wait_s",
            TF_WAIT_S,
            ParameterDescriptor(
                description="wall seconds observe waits for /tf to reach an image's stamp (then it fails)",
                floating_point_range=seconds,
            ),
        )
        self.profile = profile = resolve_profile(self, self.get_parameter("robot_profile").value)
        interfaces = profile.interfaces
        config = load_config(harness_path=Path(self.get_parameter("harness_config").value))
        self.kin = Kinematics(profile=profile)
        self.perception = Perception(self.kin, self._capture, config.perception)
        self._lock = threading.Lock()  # one call at a time (the observation store is not thread-safe)
        # (camera, kind) -> the last few (msg, wall time): colour and depth are paired by stamp, as
        # message_filters' approximate-time policy would
        self._latest: dict[tuple[str, str], deque] = defaultdict(lambda: deque(maxlen=HISTORY))
        # to find the arm's pose at an image's stamp
        self._latest[("", "joints")] = StampedHistory(JOINT_HISTORY_S, lambda kept: _seconds(kept[0].header.stamp))
        self._links = {self.kin.model.body(b).name for b in range(1, self.kin.model.nbody)}  # the URDF's frames
        self._image_frames = dict(profile.camera_frames)  # camera -> the frame its images came in, last seen
        self._told: set[tuple] = set()  # frame problems already logged (once each: observe runs often)
        group = ReentrantCallbackGroup()
        self.streams = SideNode(self, "streams")  # the cameras, joint states and /tf: hundreds of messages a second
        self.frames = FrameBuffer(self.streams)  # /tf and /tf_static
        reliability = (
            ReliabilityPolicy.BEST_EFFORT if interfaces.camera_qos == "best_effort" else ReliabilityPolicy.RELIABLE
        )
        camera_qos = QoSProfile(depth=HISTORY, reliability=reliability)  # best effort hears both kinds of publisher
        for cam, topics in interfaces.cameras.items():
            for kind, topic, msg_type in (
                ("color", topics.color_topic, Image),
                ("depth", topics.depth_topic, Image),
                ("info", topics.info_topic, CameraInfo),
            ):
                self.streams.subscribe(
                    msg_type,
                    topic,
                    lambda m, c=cam, k=kind: self._store(c, k, RawImage(m) if isinstance(m, bytes) else m),
                    camera_qos,
                    raw=msg_type is Image,  # kept serialized until an observe picks it (RawImage)
                )
        self.streams.subscribe(JointState, interfaces.joint_states_topic, lambda m: self._store("", "joints", m), 10)
        self.streams.start()
        self.create_subscription(CallResultMsg, "/harness/receipts", self._on_receipt, 50, callback_group=group)
        self.receipts = self.create_publisher(CallResultMsg, "/harness/receipts", 50)
        self.markers = self.create_publisher(MarkerArray, "/captain/markers", 10)
        self.create_service(HarnessCall, "/perception/call", self._on_call, callback_group=group)
        self.create_service(GetObservation, "/perception/get_observation", self._on_get, callback_group=group)
        segmenter = config.perception.segment_url if config.perception.segmenter == "http" else "built-in RGB-D"
        self.get_logger().info(
            f"perception ready: segmenter {segmenter}, cameras {', '.join(interfaces.cameras)}, "
            f"frames from {self.frames.engine_name}"
        )

    def destroy_node(self) -> None:
        self.streams.close()
        super().destroy_node()

    # ------------------------------------------------------------------------------ inputs
    def _store(self, camera: str, kind: str, msg) -> None:
        self._latest[(camera, kind)].append((msg, time.monotonic()))

    def _tell(self, key: tuple, text: str) -> None:
        """A warning about a camera's frames, once per kind of problem."""
        if key not in self._told:
            self._told.add(key)
            self.get_logger().warning(text)

    def _image_frame(self, camera: str, image: Image) -> str:
        """The frame the image was taken in: its own header's, else (an empty frame_id) the profile's."""
        expected = self.profile.camera_frames.get(camera, "")
        frame = image.header.frame_id.lstrip("/")  # tf2 names have no leading slash (a ROS 1 habit)
        if not frame:
            self._tell((camera, "empty"), f"{camera}: images with an empty frame_id: taken as {expected!r}")
            return expected
        if frame != expected:
            self._tell(
                (camera, "frame", frame),
                f"{camera}: the images are in frame '{frame}', the profile's camera_frames.{camera} is "
                f"'{expected}': using the image's own frame (name it in the profile, or calibrate that frame, "
                "to silence this)",
            )
        return frame

    def _camera_pose(self, camera: str, frame: str, image: Image, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pose of the image's frame in the base frame at the image's stamp (q: the joint state at that
        stamp); the order of the three sources is in the module docstring."""
        base = self.profile.base_frame
        chain = self.frames.static_chain(frame)
        link = next((f for f in chain if f in self._links), None)
        if link is not None:  # 1. calibrated on a link of the arm: with the link at the image's joint state
            p_link, r_link = self.kin.forward(q, link)
            pose = self.frames.lookup_with(base, frame, link, Transform(base, link, p_link, r_link, None))
            return pose.position_m, pose.rotation
        wait_s = self.get_parameter("tf_wait_s").value
        try:  # 2. /tf at the image's stamp
            pose = self.frames.wait_for(base, frame, image.header.stamp, wait_s)
            return pose.position_m, pose.rotation
        except UnknownFrameError as exc:  # nothing publishes the frame on /tf: a setup without /tf
            problem = exc
        except FrameError as exc:
            # /tf places the frame, just not at this stamp (late, or too old): the URDF's nominal pose may differ
            # from what /tf says (a calibrated camera, the twin's per-start camera error), so fail closed
            late = isinstance(exc, ExtrapolationError) and exc.future
            raise BackendError(
                f"{camera}: /tf has '{frame}' but not at the image's stamp{f' within {wait_s:g} s' if late else ''}"
                f": {exc}" + (" (a loaded host delivers /tf late: raise the parameter tf_wait_s)" if late else "")
            ) from None
        if frame in self._links:  # 3. the URDF at the image's joint state
            return self.kin.forward(q, frame)
        expected = self.profile.camera_frames.get(camera, "")
        named = f" (the profile names '{expected}')" if expected != frame else ""
        raise BackendError(
            f"{camera}: cannot place the image's frame '{frame}'{named} in {base}: {problem}. It is not a link of the "
            "arm's URDF either: publish it on /tf or /tf_static (config/camera_calibration/<profile>.yaml, "
            "real_arm.launch.py)"
        )

    def _on_receipt(self, msg: CallResultMsg) -> None:
        if msg.executed and CAPABILITY_BY_NAME.get(msg.capability) and CAPABILITY_BY_NAME[msg.capability].physical:
            self.perception.scene_changed()

    def _fresh(self, camera: str, kind: str) -> list:
        """Recent messages of one stream, newest first; raises when there are none or the stream went quiet."""
        history = list(self._latest.get((camera, kind), ()))
        if not history:
            raise BackendError(f"no {kind} message from the {camera or 'arm'} yet")
        age = time.monotonic() - history[-1][1]
        if age > self.get_parameter("stale_after_s").value:
            raise BackendError(f"the last {kind} message of {camera or 'the arm'} is {age:.1f} s old")
        return [msg for msg, _ in reversed(history)]

    @staticmethod
    def _pair(camera: str, colors: list, depths: list) -> tuple:
        """The newest colour and depth images taken at the same time (within SYNC_TOLERANCE_S)."""
        for color in colors:
            t_color = _seconds(color.header.stamp)
            for depth in depths:
                if abs(_seconds(depth.header.stamp) - t_color) <= SYNC_TOLERANCE_S:
                    return color, depth, t_color
        raise BackendError(f"{camera}: no colour and depth image pair within {SYNC_TOLERANCE_S * 1000:.0f} ms")

    def _wait_for_pair(self, camera: str) -> tuple:
        """A synchronised colour + depth pair and the newest camera info; waits up to `pair_wait_s`, since one
        stream can run a frame ahead of the others (the subscriptions keep filling in other executor threads
        meanwhile): at start-up the first images may come before the first info message."""
        deadline = time.monotonic() + self.get_parameter("pair_wait_s").value
        while True:
            try:
                color, depth, t_color = self._pair(camera, self._fresh(camera, "color"), self._fresh(camera, "depth"))
                return color, depth, t_color, self._fresh(camera, "info")[0]
            except BackendError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _capture(self, cameras: tuple[str, ...]) -> tuple[float, dict[str, CameraImage], np.ndarray, float]:
        joint_history = self._fresh("", "joints")
        images, stamp, q, jaw = {}, 0.0, None, 0.0
        for cam in cameras:
            raw_color, raw_depth, t_color, info = self._wait_for_pair(cam)
            color, depth = raw_color.message(), raw_depth.message()
            joints = min(joint_history, key=lambda m: abs(_seconds(m.header.stamp) - t_color))
            index = {n: i for i, n in enumerate(joints.name)}
            q_cam = np.array([joints.position[index[j]] for j in self.profile.arm_joints])
            if q is None:  # the observation's robot state: at the first camera's image time
                fingers = {j: joints.position[index[j]] for j in self.profile.finger_joints if j in index}
                q, jaw = q_cam, self.profile.jaw_opening_m(fingers) or 0.0
            frame = self._image_frame(cam, color)
            position, rotation = self._camera_pose(cam, frame, color, q_cam)
            self._image_frames[cam] = frame
            rgb, depth_m = image_to_array(color), image_to_array(depth)
            if rgb.shape[:2] != depth_m.shape:
                raise BackendError(f"{cam}: colour {rgb.shape[:2]} and depth {depth_m.shape} are not aligned")
            K = np.array(info.k, dtype=float).reshape(3, 3)  # noqa: N806 - the usual name
            images[cam] = CameraImage(cam, rgb, depth_m, K, position, rotation)
            stamp = max(stamp, t_color)
        return stamp, images, q, float(jaw)

    # ------------------------------------------------------------------------------ services
    def _on_call(self, request: HarnessCall.Request, response: HarnessCall.Response) -> HarnessCall.Response:
        capability = request.capability
        try:
            kwargs = json.loads(request.args_json or "{}")
            if not isinstance(kwargs, dict):
                raise ValueError(f"args_json must be a JSON object, got {type(kwargs).__name__}")
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            result = CallResult.fail(capability, FailureCategory.INVALID_ARGUMENT, f"bad args_json: {exc}")
        else:
            handler = getattr(self.perception, f"_{capability}", None) if capability in CAPABILITY_BY_NAME else None
            known = [n for n in CAPABILITY_BY_NAME if hasattr(self.perception, f"_{n}")]
            with self._lock:
                result = dispatch(capability, kwargs, handler, known)
        if request.call_id:
            result.call_id = request.call_id
        result.episode_id, result.frame_id = request.episode_id, self.profile.base_frame
        msg = call_result_to_msg(result, time.time())
        self.receipts.publish(msg)
        if result.success and isinstance(result.value, dict):
            self._show(capability, result.value)
        text = result.receipt or f"{capability}: {result.failure_category.value}: {result.message}"
        if result.success:  # rclpy forbids one logging call site from changing severity
            self.get_logger().info(text)
        else:
            self.get_logger().warning(text)
        response.result = msg
        return response

    def _show(self, capability: str, value: dict) -> None:
        """Detections as boxes with labels in rviz (/captain/markers, namespace 'detections')."""
        ids = [d["detection_id"] for d in value.get("detections", [])] or (
            [value["detection_id"]] if "detection_id" in value else []
        )
        markers = MarkerArray()
        if capability == "observe":
            markers.markers.append(Marker(ns="detections", action=Marker.DELETEALL))
        for det_id in ids:
            det = self.perception.detections[det_id]
            with self._lock:
                g = self.perception._geometry(det)
            header = Header(stamp=stamp_msg(det.observation.time_s), frame_id=self.profile.base_frame)
            number = int(det_id.split("-")[1])
            yaw = np.radians(g.yaw_deg)
            box = Marker(header=header, ns="detections", id=2 * number, type=Marker.CUBE, action=Marker.ADD)
            box.pose = pose_msg(g.center_m, np.array([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)]))
            box.scale.x, box.scale.y, box.scale.z = (float(max(v, 0.002)) for v in g.extents_m)
            box.color.r, box.color.g, box.color.b, box.color.a = 0.1, 0.8, 1.0, 0.35
            label = Marker(header=header, ns="detections", id=2 * number + 1, type=Marker.TEXT_VIEW_FACING)
            label.pose = pose_msg(g.center_m + [0.0, 0.0, g.extents_m[2] / 2 + 0.03], np.array([1.0, 0, 0, 0]))
            label.scale.z = 0.025
            label.color.r = label.color.g = label.color.b = label.color.a = 1.0
            label.text = f"{det_id} {det.label}"
            markers.markers += [box, label]
        if markers.markers:
            self.markers.publish(markers)

    def _on_get(self, request: GetObservation.Request, response: GetObservation.Response) -> GetObservation.Response:
        store = self.perception.store
        try:
            with self._lock:
                obs = store.latest() if not request.handle else store.get(request.handle, allow_stale=True)
            if obs is None:
                raise PerceptionError(FailureCategory.INVALID_ARGUMENT, "no observation yet: call observe first")
            cameras = list(request.cameras) or list(obs.images)
            missing = [c for c in cameras if c not in obs.images]
            if missing:
                raise PerceptionError(FailureCategory.INVALID_ARGUMENT, f"{obs.handle} has no camera(s) {missing}")
        except PerceptionError as exc:
            response.result = call_result_to_msg(CallResult.fail("observe", exc.category, str(exc)), time.time())
            return response
        header = Header(stamp=stamp_msg(obs.time_s), frame_id=self.profile.base_frame)
        msg = ObservationMsg(header=header, handle=obs.handle, stale=store.is_stale(obs), cameras=cameras)
        for cam in cameras:
            im = obs.images[cam]
            cam_header = Header(stamp=header.stamp, frame_id=self._image_frames.get(cam, ""))
            msg.color.append(image_msg(cam_header, im.rgb, "rgb8"))
            if request.include_depth:
                msg.depth.append(image_msg(cam_header, im.depth_m.astype("<f4"), "32FC1"))
            msg.camera_info.append(camera_info(im, cam_header))
            msg.camera_poses.append(PoseStamped(header=header, pose=pose_msg(im.position_m, quat_wxyz(im.rotation))))
        msg.joint_state = JointState(header=header, name=list(self.profile.arm_joints), position=obs.q_rad.tolist())
        position, rotation = self.kin.forward(obs.q_rad)
        msg.ee_pose = pose_msg(position, quat_wxyz(rotation))
        msg.jaw_opening_m = obs.jaw_opening_m
        response.observation = msg
        response.result = call_result_to_msg(
            CallResult.ok("observe", value={"observation_handle": obs.handle}, receipt=f"observation {obs.handle}"),
            time.time(),
        )
        return response


def main(args: list[str] | None = None) -> None:
    spin(PerceptionNode, args)


if __name__ == "__main__":
    main()
