"""Operator monitor: rviz2 with the captain_ros display configuration.

ros2 launch captain_ros monitor.launch.py
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    rviz_config = DeclareLaunchArgument(
        "rviz_config",
        default_value=PathJoinSubstitution([FindPackageShare("captain_ros"), "config", "captain.rviz"]),
        description="rviz2 display configuration (robot model, TF, head and wrist images, detections)",
    )
    use_sim_time = DeclareLaunchArgument(
        "use_sim_time", default_value="false", choices=["true", "false"], description="use /clock from the MuJoCo twin"
    )
    rviz = Node(
        package="rviz2",
        executable="rviz2",
        arguments=["-d", LaunchConfiguration("rviz_config")],
        parameters=[{"use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool)}],
        output="screen",
    )
    return LaunchDescription([rviz_config, use_sim_time, rviz])
