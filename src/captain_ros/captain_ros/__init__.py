"""captain_ros: a code-as-policy robot agent stack on ROS 2.

`captain_ros.core` and `captain_ros.twin` never import rclpy; `captain_ros.ros` holds the thin
ROS shells.
"""

import os

# MuJoCo picks its OpenGL backend when it is first imported: headless EGL unless told otherwise.
os.environ.setdefault("MUJOCO_GL", "egl")

__version__ = "0.1.0"
