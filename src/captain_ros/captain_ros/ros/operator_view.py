"""operator_view: the episode as rviz markers, from what the stack publishes (captain_ros.core.operator_markers).

In:  agent/status        captain_interfaces/msg/EpisodeStatus   request n of N, actions, budget left, outcome
     harness/receipts    captain_interfaces/msg/CallResult      every result: receipt lines, contacts and forces
     captain/markers     visualization_msgs/MarkerArray         the motion node's planned sweeps (ns 'planned'):
                                                                the direction each contact's force is drawn in
Out: captain/markers     visualization_msgs/MarkerArray         ns status and receipts (text next to the base),
                                                                contacts (spheres, force arrows, labels); all of
                                                                it again every `republish_period_s`, so an rviz
                                                                started later, or one whose markers another
                                                                node cleared, catches up

It commands nothing and reads only topics, so it can run anywhere the operator is (monitor.launch.py starts it
next to rviz2). Markers are in the robot profile's base frame, stamped zero (the latest transform).

    ros2 run captain_ros operator_view --ros-args -p robot_profile:=ur5e
"""

from __future__ import annotations

from geometry_msgs.msg import Point
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.node import Node
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from captain_interfaces.msg import CallResult as CallResultMsg
from captain_interfaces.msg import EpisodeStatus
from captain_ros.core import robot
from captain_ros.core.operator_markers import (
    NS_PLANNED,
    EpisodeView,
    MarkerSpec,
    OperatorView,
    OperatorViewConfig,
    Shape,
)
from captain_ros.ros.convert import budget_from_msg, call_result_from_msg
from captain_ros.ros.guard import GuardedNode
from captain_ros.ros.spin import spin

MARKER_TYPES = {
    Shape.ARROW: Marker.ARROW,
    Shape.SPHERE: Marker.SPHERE,
    Shape.LINE_STRIP: Marker.LINE_STRIP,
    Shape.SPHERE_LIST: Marker.SPHERE_LIST,
    Shape.TEXT: Marker.TEXT_VIEW_FACING,
}


def marker_msg(spec: MarkerSpec) -> Marker:
    """A core MarkerSpec as a visualization_msgs/Marker (stamp zero: rviz uses the latest transform)."""
    m = Marker(ns=spec.ns, id=spec.id, type=MARKER_TYPES[spec.shape], action=Marker.ADD, text=spec.text)
    m.header.frame_id = spec.frame_id
    m.pose.position = Point(x=spec.position_m[0], y=spec.position_m[1], z=spec.position_m[2])
    m.pose.orientation.w = 1.0
    m.points = [Point(x=p[0], y=p[1], z=p[2]) for p in spec.points_m]
    m.scale.x, m.scale.y, m.scale.z = (float(v) for v in spec.scale)
    m.color = ColorRGBA(r=spec.rgba[0], g=spec.rgba[1], b=spec.rgba[2], a=spec.rgba[3])
    return m


def episode_view(msg: EpisodeStatus) -> EpisodeView:
    return EpisodeView(
        episode_id=msg.episode_id,
        task=msg.task,
        state=msg.state,
        request_index=msg.request_index,
        budget=budget_from_msg(msg.budget),
        outcome=msg.outcome,
    )


class OperatorViewNode(GuardedNode, Node):
    def __init__(self, **node_options) -> None:
        super().__init__("operator_view", **node_options)
        d = lambda text: ParameterDescriptor(description=text)  # noqa: E731
        defaults = OperatorViewConfig()
        self.declare_parameter(
            "robot_profile",
            str(robot.DEFAULT_PROFILE),
            d("robot profile (a name in config/robots/ or a path): the markers' frame is its base frame"),
        )
        self.declare_parameter("receipt_lines", defaults.receipt_lines, d("latest receipts shown"))
        self.declare_parameter(
            "text_anchor_m", list(defaults.text_anchor_m), d("centre of the status text in the base frame, metres")
        )
        self.declare_parameter(
            "republish_period_s", 1.0, d("all markers are published again this often (a late rviz catches up)")
        )
        p = {name: self.get_parameter(name).value for name in self._parameters}
        profile = robot.load_profile(p["robot_profile"])
        config = OperatorViewConfig(
            text_anchor_m=tuple(float(v) for v in p["text_anchor_m"]), receipt_lines=int(p["receipt_lines"])
        )
        self.view = OperatorView(profile.base_frame, config)
        self.markers = self.create_publisher(MarkerArray, "captain/markers", 10)
        self.create_subscription(EpisodeStatus, "agent/status", self._on_status, 50)
        self.create_subscription(CallResultMsg, "harness/receipts", self._on_receipt, 100)
        self.create_subscription(MarkerArray, "captain/markers", self._on_markers, 100)
        period = float(p["republish_period_s"])
        if not period > 0:
            raise ValueError(f"republish_period_s must be > 0, got {period}")
        self.create_timer(period, self._publish)
        self._publish()
        self.get_logger().info(f"operator view of '{profile.name}' in {profile.base_frame} on captain/markers")

    # one callback at a time (the node's default, mutually exclusive group): the view needs no lock
    def _on_status(self, msg: EpisodeStatus) -> None:
        self.view.on_status(episode_view(msg))
        self._publish()

    def _on_receipt(self, msg: CallResultMsg) -> None:
        result = call_result_from_msg(msg)  # a malformed message becomes a backend_error line, never a crash
        self.view.on_receipt(result)
        self._publish()

    def _on_markers(self, msg: MarkerArray) -> None:
        for m in msg.markers:
            if m.ns == NS_PLANNED and m.action == Marker.ADD:
                self.view.on_planned(m.id, [(p.x, p.y, p.z) for p in m.points])

    def _publish(self) -> None:
        update = self.view.update()
        cleared = [Marker(ns=ns, action=Marker.DELETEALL) for ns in update.clear]
        self.markers.publish(MarkerArray(markers=cleared + [marker_msg(s) for s in update.markers]))


def main(args: list[str] | None = None) -> None:
    spin(OperatorViewNode, args)


if __name__ == "__main__":
    main()
