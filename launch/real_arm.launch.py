"""The stack on a physical arm driven through ros2_control. Skeleton: the harness and agent
nodes are added by the issues that build them. The arm's own bring-up (ros2_control
controller manager, camera drivers) is started by the robot's vendor launch, not here.

    ros2 launch captain_ros real_arm.launch.py
"""

from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

from launch import LaunchDescription


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument(
            "robot_config",
            default_value=PathJoinSubstitution([FindPackageShare("captain_ros"), "config", "robot.yaml"]),
            description="robot description, frames and the controller's action, topic and wrench names",
        ),
        DeclareLaunchArgument(
            "safety_config",
            default_value=PathJoinSubstitution([FindPackageShare("captain_ros"), "config", "safety.yaml"]),
            description="workspace box, speed and force limits, watchdog; review before every deployment",
        ),
        DeclareLaunchArgument(
            "use_moveit", default_value="false", description="use moveit_py for collision-aware checks if installed"
        ),
        DeclareLaunchArgument("use_rviz", default_value="true", description="start the rviz2 monitor"),
    ]
    monitor = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare("captain_ros"), "launch", "monitor.launch.py"])
        ),
        condition=IfCondition(LaunchConfiguration("use_rviz")),
    )
    return LaunchDescription([*args, monitor])
