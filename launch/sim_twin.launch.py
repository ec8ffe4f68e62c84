"""The stack on the MuJoCo twin. Skeleton: the twin, harness and agent nodes are added by the
issues that build them; today it brings up the monitor only.

    ros2 launch captain_ros sim_twin.launch.py task:=<task> start_id:=<id>
"""

from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

from launch import LaunchDescription


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument("task", default_value="", description="task name from the twin's task suite"),
        DeclareLaunchArgument("start_id", default_value="", description="stable start-state id; empty = sample one"),
        DeclareLaunchArgument(
            "robot_config",
            default_value=PathJoinSubstitution([FindPackageShare("captain_ros"), "config", "robot.yaml"]),
            description="robot description, frames and controller interface names",
        ),
        DeclareLaunchArgument(
            "safety_config",
            default_value=PathJoinSubstitution([FindPackageShare("captain_ros"), "config", "safety.yaml"]),
            description="workspace box, speed and force limits, watchdog",
        ),
        DeclareLaunchArgument("use_rviz", default_value="true", description="start the rviz2 monitor"),
    ]
    monitor = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare("captain_ros"), "launch", "monitor.launch.py"])
        ),
        launch_arguments={"use_sim_time": "true"}.items(),
        condition=IfCondition(LaunchConfiguration("use_rviz")),
    )
    return LaunchDescription([*args, monitor])
