"""What the agent's Python session gives every cell before it runs (agent/sandbox_child.py, `main`): the robot
client. A stub only, for the helper parts' TYPE_CHECKING imports; there is no such module at run time."""

from captain_ros.agent.sandbox_child import Robot

robot: Robot
