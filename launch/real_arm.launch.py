"""The stack on a physical arm driven through ros2_control. Today: robot_state_publisher with
the project's URDF and the monitor; the harness and agent nodes are added by the issues that
build them. The arm's own bring-up (ros2_control controller manager, camera drivers) is
started by the robot's vendor launch, not here.

    ros2 launch captain_ros real_arm.launch.py
"""

from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import Command, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
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
    description = ParameterValue(
        Command(["cat ", PathJoinSubstitution([FindPackageShare("captain_ros"), "urdf", "panda.urdf"])]),
        value_type=str,
    )
    state_publisher = Node(
        package="robot_state_publisher",
        executable="robot_state_publisher",
        parameters=[{"robot_description": description}],
        output="screen",
    )
    monitor = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare("captain_ros"), "launch", "monitor.launch.py"])
        ),
        condition=IfCondition(LaunchConfiguration("use_rviz")),
    )
    return LaunchDescription([*args, state_publisher, monitor])
