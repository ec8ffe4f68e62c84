"""Conversions between the ROS-free core types and captain_interfaces messages."""

from __future__ import annotations

import json
import math

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import Pose
from scipy.spatial.transform import Rotation
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import Header

from captain_interfaces.msg import Budget as BudgetMsg
from captain_interfaces.msg import CallResult as CallResultMsg
from captain_ros.core.contract import Budget, CallResult, FailureCategory


def budget_to_msg(budget: Budget) -> BudgetMsg:
    return BudgetMsg(
        requests_used=budget.requests_used,
        requests_limit=budget.requests_limit,
        actions_used=budget.actions_used,
        actions_limit=budget.actions_limit,
        wall_time_used_s=float(budget.wall_time_used_s),
        wall_time_limit_s=float(budget.wall_time_limit_s),
    )


def budget_from_msg(msg: BudgetMsg) -> Budget:
    return Budget(
        requests_used=msg.requests_used,
        requests_limit=msg.requests_limit,
        actions_used=msg.actions_used,
        actions_limit=msg.actions_limit,
        wall_time_used_s=msg.wall_time_used_s,
        wall_time_limit_s=msg.wall_time_limit_s,
    )


def call_result_to_msg(result: CallResult, stamp_s: float | None = None) -> CallResultMsg:
    header = Header(frame_id=result.frame_id)
    if stamp_s is not None and math.isfinite(stamp_s):
        header.stamp.sec = int(stamp_s)
        header.stamp.nanosec = round((stamp_s - int(stamp_s)) * 1e9) % 1_000_000_000
    return CallResultMsg(
        header=header,
        call_id=result.call_id,
        episode_id=result.episode_id,
        capability=result.capability,
        success=result.success,
        executed=result.executed,
        failure_category=result.failure_category.value,
        message=result.message,
        receipt=result.receipt,
        value_json=result.value_json(),
        diagnostics_json=result.diagnostics_json(),
        budget=budget_to_msg(result.budget),
        duration_s=float(result.duration_s),
    )


def call_result_from_msg(msg: CallResultMsg) -> CallResult:
    """Rebuild a core result; a message that breaks the contract becomes a backend_error result."""
    try:
        category = FailureCategory(msg.failure_category)
        value = json.loads(msg.value_json) if msg.value_json else None
        diagnostics = json.loads(msg.diagnostics_json) if msg.diagnostics_json else {}
        return CallResult(
            capability=msg.capability,
            success=msg.success,
            executed=msg.executed,
            failure_category=category,
            message=msg.message,
            receipt=msg.receipt,
            value=value,
            diagnostics=diagnostics,
            budget=budget_from_msg(msg.budget),
            call_id=msg.call_id,
            episode_id=msg.episode_id,
            duration_s=msg.duration_s,
            frame_id=msg.header.frame_id,
        )
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        return CallResult.fail(
            msg.capability or "unknown",
            FailureCategory.BACKEND_ERROR,
            f"malformed CallResult message from the server: {exc}",
            call_id=msg.call_id,
            episode_id=msg.episode_id,
            executed=msg.executed,
        )


def stamp_msg(t_s: float) -> Time:
    sec = math.floor(t_s)
    return Time(sec=sec, nanosec=int((t_s - sec) * 1e9))


def stamp_msg_ns(t_ns: int) -> Time:
    """A stamp from integer nanoseconds, exactly (lockstep compares stamps for equality)."""
    return Time(sec=t_ns // 1_000_000_000, nanosec=t_ns % 1_000_000_000)


def pose_msg(position: np.ndarray, quaternion_wxyz: np.ndarray) -> Pose:
    p = Pose()
    p.position.x, p.position.y, p.position.z = map(float, position)
    p.orientation.w, p.orientation.x, p.orientation.y, p.orientation.z = map(float, quaternion_wxyz)
    return p


def quat_wxyz(mat: np.ndarray) -> np.ndarray:
    """Rotation matrix -> quaternion (w, x, y, z)."""
    x, y, z, w = Rotation.from_matrix(np.asarray(mat, dtype=float).reshape(3, 3)).as_quat()
    return np.array([w, x, y, z])


def image_msg(header: Header, array: np.ndarray, encoding: str) -> Image:
    """A sensor_msgs/Image of a C-contiguous (H, W[, C]) little-endian array."""
    h, w = array.shape[:2]
    return Image(
        header=header,
        height=h,
        width=w,
        encoding=encoding,
        is_bigendian=0,
        step=array.strides[0],
        data=np.ascontiguousarray(array).tobytes(),
    )


def camera_info(frame, header: Header) -> CameraInfo:
    """`frame`: anything with K (3, 3) and depth_m (H, W), e.g. a twin CameraFrame or a perception CameraImage."""
    """Pinhole calibration in sensor_msgs/CameraInfo conventions (no distortion; P = [K | 0])."""
    h, w = frame.depth_m.shape
    k = frame.K
    info = CameraInfo(header=header, height=h, width=w, distortion_model="plumb_bob")
    info.d = [0.0] * 5
    info.k = [float(v) for v in k.ravel()]
    info.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    info.p = [float(k[0, 0]), 0.0, float(k[0, 2]), 0.0, 0.0, float(k[1, 1]), float(k[1, 2]), 0.0, 0.0, 0.0, 1.0, 0.0]
    return info
