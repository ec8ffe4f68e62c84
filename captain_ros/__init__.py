"""captain_ros: a code-as-policy robot agent stack on ROS 2.

`captain_ros.core` never imports rclpy; `captain_ros.ros` holds the thin ROS shells.
"""

__version__ = "0.1.0"
