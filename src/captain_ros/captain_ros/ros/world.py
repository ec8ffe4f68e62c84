"""The ros2_control world: an arm (a real one, or the twin node standing in for it) through its ros2_control bring-up
and the ROS nodes. Its backend is `Ros2ControlBackend` (`ros2_control_backend.py`, inside the motion node), its link
the agent node's `RosLink` (`agent_node.py`); on the twin node its privileged state is the twin node's
`/twin/training_only/privileged_snapshot`, on a real arm there is none. The main job (`captain-ros run`,
agent.launch.py) runs it; in-process rollouts do not.

This module imports no rclpy itself (the registry may import it anywhere): the backend and link classes are imported
when asked for."""

from __future__ import annotations

from captain_ros.worlds import World, register_world


@register_world("ros2_control")
class Ros2ControlWorld(World):
    def backend_class(self) -> type:
        from captain_ros.ros.ros2_control_backend import Ros2ControlBackend

        return Ros2ControlBackend

    def link_class(self) -> type:
        from captain_ros.ros.agent_node import RosLink

        return RosLink
