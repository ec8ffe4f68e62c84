"""A force/torque driver gone wrong, in its own process: relays the twin's /wrist_ft_sensor/wrench to
/test/relayed_wrench, changed by its `mode` parameter (set at run time through the parameter service):

  pass           unchanged
  silent         nothing (a dead or disconnected sensor)
  late           stamped 5 s in the past (a buffered, lagging pipeline)
  unknown_frame  in frame 'ft_sensor_link', which the arm's description does not have (a misconfiguration)
  base_frame     expressed in the base frame, as some vendors' external-wrench estimates are

Prints READY once it relays. Used by tests/captain_ros/ros/test_force_sensing.py.
"""

from __future__ import annotations

import numpy as np
from geometry_msgs.msg import WrenchStamped
from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.node import Node
from sensor_msgs.msg import JointState

from captain_ros.core import robot
from captain_ros.core.kinematics import Kinematics
from captain_ros.core.wrench import change_frame
from captain_ros.ros.spin import spin

PANDA = robot.default_profile()  # the twin's arm

MODES = ("pass", "silent", "late", "unknown_frame", "base_frame")
RELAYED = "/test/relayed_wrench"


class WrenchRelay(Node):
    def __init__(self) -> None:
        super().__init__("wrench_relay")
        self.declare_parameter("mode", "pass", ParameterDescriptor(description=" | ".join(MODES)))
        self.add_on_set_parameters_callback(self._check)
        self.kin = Kinematics()
        self.q: np.ndarray | None = None
        self.ready = False
        self.pub = self.create_publisher(WrenchStamped, RELAYED, 10)
        self.create_subscription(JointState, "/joint_states", self._on_joints, 10)
        self.create_subscription(WrenchStamped, "/wrist_ft_sensor/wrench", self._on_wrench, 10)

    def _check(self, parameters) -> SetParametersResult:
        bad = [p.value for p in parameters if p.name == "mode" and p.value not in MODES]
        return SetParametersResult(successful=not bad, reason=f"mode must be one of {MODES}" if bad else "")

    def _on_joints(self, msg: JointState) -> None:
        index = {n: i for i, n in enumerate(msg.name)}
        self.q = np.array([msg.position[index[j]] for j in PANDA.arm_joints])

    def _on_wrench(self, msg: WrenchStamped) -> None:
        mode = self.get_parameter("mode").value
        if mode == "silent":
            return
        if mode == "late":
            msg.header.stamp.sec -= 5
        elif mode == "unknown_frame":
            msg.header.frame_id = "ft_sensor_link"
        elif mode == "base_frame":
            if self.q is None:
                return
            p_hand, r_hand = self.kin.forward(self.q, PANDA.hand_frame)
            f, t = msg.wrench.force, msg.wrench.torque
            force, torque = change_frame(np.array([f.x, f.y, f.z]), np.array([t.x, t.y, t.z]), r_hand, p_hand)
            msg.header.frame_id = PANDA.base_frame
            msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z = map(float, force)
            msg.wrench.torque.x, msg.wrench.torque.y, msg.wrench.torque.z = map(float, torque)
        self.pub.publish(msg)
        if not self.ready:
            self.ready = True
            print("READY", flush=True)


if __name__ == "__main__":
    spin(WrenchRelay, num_threads=2)
