"""The stack on a physical arm driven through ros2_control: robot_state_publisher with the project's
URDF, the harness nodes (guarded motion through the arm's joint_trajectory_controller, the wrist
F/T topic and /joint_states; perception from the RGB-D cameras) and the monitor; the agent node
is added by the issue that builds it. The arm's own bring-up (ros2_control controller manager,
camera drivers) is started by the robot's vendor launch, not here.

    ros2 launch captain_ros real_arm.launch.py
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import Command, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    args = [
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
    harness = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare("captain_ros"), "launch", "harness.launch.py"])
        ),
    )  # its arguments (robot_config, safety_config, watchdog, ...) pass through: real_arm.launch.py watchdog:=true
    monitor = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare("captain_ros"), "launch", "monitor.launch.py"])
        ),
        condition=IfCondition(LaunchConfiguration("use_rviz")),
    )
    return LaunchDescription([*args, state_publisher, harness, monitor])
