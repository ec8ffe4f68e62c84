"""The real-arm backend: drives any ros2_control arm through its standard interfaces.

STATUS (issue 4, in progress): moves the twin over DDS, but streaming one setpoint per control
period from Python does not keep up (joint-state gaps of up to 0.5 s seen against twin_node, which
cause false contact stops). Not used by any node or test yet; see the issue 4 note for the plan
(send the whole sweep as one trajectory, monitor the wrench, stop with a hold trajectory).

In:  sensor_msgs/JointState (/joint_states), geometry_msgs/WrenchStamped (the wrist F/T topic).
Out: trajectory_msgs/JointTrajectory on the arm controller's topic: every control period a
     one-point trajectory a little ahead of now, which joint_trajectory_controller follows;
     the gripper controller gets the same for the finger joint.
Periods are paced by the measured state's stamps (sim time on the twin, wall time on hardware),
so the same harness runs at any real-time factor. A state older than `state_timeout_s` (wall
clock) is a lost link: BackendError, and the harness reports backend_error.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from builtin_interfaces.msg import Duration
from geometry_msgs.msg import WrenchStamped
from rclpy.node import Node
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from captain_ros.harness.backend import ArmBackend, ArmState, BackendError
from captain_ros.twin import robot


def _duration(seconds: float) -> Duration:
    return Duration(sec=int(seconds), nanosec=int((seconds % 1.0) * 1e9))


class Ros2ControlBackend(ArmBackend):
    name = "ros2_control"

    def __init__(
        self,
        node: Node,
        interfaces: dict,
        *,
        control_period_s: float = 0.01,
        lookahead_periods: float = 2.0,
        state_timeout_s: float = 0.5,
    ):
        self.node = node
        self._period = control_period_s
        self._lookahead = lookahead_periods * control_period_s
        self._timeout = state_timeout_s
        self._cond = threading.Condition()
        self._joints: JointState | None = None
        self._joints_wall = 0.0
        self._wrench = np.zeros(6)
        self._last_stamp = -np.inf
        self.lower, self.upper = robot.arm_limits_rad()
        finger = robot.joint_limits()[robot.FINGER_JOINTS[0]]
        self._finger_range = (finger.lower, finger.upper)
        node.create_subscription(JointState, interfaces["joint_states_topic"], self._on_joints, 10)
        node.create_subscription(WrenchStamped, interfaces["wrench_topic"], self._on_wrench, 10)
        self._arm_pub = node.create_publisher(JointTrajectory, interfaces["trajectory_topic"], 10)
        gripper_topic = interfaces["gripper_action"].rsplit("/", 1)[0] + "/joint_trajectory"
        self._gripper_pub = node.create_publisher(JointTrajectory, gripper_topic, 10)

    # ------------------------------------------------------------------------------ callbacks
    def _on_joints(self, msg: JointState) -> None:
        with self._cond:
            self._joints = msg
            self._joints_wall = time.monotonic()
            self._cond.notify_all()

    def _on_wrench(self, msg: WrenchStamped) -> None:
        f, t = msg.wrench.force, msg.wrench.torque
        with self._cond:
            self._wrench = np.array([f.x, f.y, f.z, t.x, t.y, t.z])

    # ------------------------------------------------------------------------------ interface
    @property
    def control_period_s(self) -> float:
        return self._period

    def wait_for_state(self, timeout_s: float = 10.0) -> ArmState:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._joints is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackendError(f"no joint states within {timeout_s:.0f} s: is the arm (or twin) running?")
                self._cond.wait(left)
        return self.read_state()

    def read_state(self) -> ArmState:
        with self._cond:
            msg, wall, wrench = self._joints, self._joints_wall, self._wrench.copy()
        if msg is None:
            raise BackendError("no joint state received yet")
        age = time.monotonic() - wall
        if age > self._timeout:
            raise BackendError(f"the last joint state is {age:.2f} s old (limit {self._timeout} s): link lost")
        index = {n: i for i, n in enumerate(msg.name)}
        try:
            arm = [index[j] for j in robot.ARM_JOINTS]
        except KeyError as exc:
            raise BackendError(f"joint states lack {exc.args[0]}") from None
        pos, vel = np.asarray(msg.position), np.asarray(msg.velocity)
        jaw = sum(float(pos[index[j]]) for j in robot.FINGER_JOINTS if j in index)
        if robot.FINGER_JOINTS[1] not in index and robot.FINGER_JOINTS[0] in index:
            jaw *= 2.0  # a mimic finger not reported: symmetric jaw
        stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        return ArmState(
            stamp,
            pos[arm].copy(),
            vel[arm].copy() if len(vel) == len(pos) else np.zeros(7),
            jaw,
            wrench[:3],
            wrench[3:],
        )

    def command(self, q_rad: np.ndarray, qd_radps: np.ndarray | None = None) -> np.ndarray:
        q = np.clip(np.asarray(q_rad, dtype=float), self.lower, self.upper)
        qd = np.zeros(7) if qd_radps is None else np.asarray(qd_radps, dtype=float)
        self._arm_pub.publish(
            JointTrajectory(
                joint_names=list(robot.ARM_JOINTS),
                points=[
                    JointTrajectoryPoint(
                        positions=q.tolist(), velocities=qd.tolist(), time_from_start=_duration(self._lookahead)
                    )
                ],
            )
        )
        self.last_command_q = q
        return q

    def command_gripper(self, opening_m: float) -> float:
        finger = float(np.clip(opening_m / 2, *self._finger_range))
        self._gripper_pub.publish(
            JointTrajectory(
                joint_names=[robot.FINGER_JOINTS[0]],
                points=[JointTrajectoryPoint(positions=[finger], time_from_start=_duration(self._lookahead))],
            )
        )
        return 2 * finger

    def wait_period(self) -> None:
        """Wait until the measured state has advanced one control period (by its own stamps)."""
        start = self.read_state().time_s
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while True:
                msg = self._joints
                stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
                if stamp >= start + self._period - 1e-9:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackendError(f"joint states stopped advancing for {self._timeout} s: link lost")
                self._cond.wait(left)
