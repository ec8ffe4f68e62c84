"""Operator monitor: rviz2 with the robot profile's display configuration, and the operator_view node that draws
the episode's status (request n of N, actions, budget left, outcome), its latest receipts and its contacts and
forces as markers next to the robot. The motion node draws each sweep as planned before it runs, and as executed.

    ros2 launch captain_ros monitor.launch.py robot_profile:=ur5e

rviz shows config/rviz/<robot_profile>.rviz (the robot from /robot_description, TF, the profile's cameras,
/captain/markers; fixed frame: the profile's base frame). For a profile given as a path to your own YAML, a
configuration is generated from it into a temporary file; `rviz_config:=<file>` overrides both. sim_twin.launch.py
and real_arm.launch.py include this file; their robot_profile reaches it.
"""

import tempfile
from pathlib import Path

from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def typed(name: str, value_type: type) -> ParameterValue:
    """A launch argument as a parameter of a fixed type (untyped, launch_ros would parse the text as YAML)."""
    return ParameterValue(LaunchConfiguration(name), value_type=value_type)


def rviz_file(context: LaunchContext) -> str:
    """The rviz configuration to show: rviz_config if given, else the profile's shipped file, else one generated
    from the profile (a profile given as a path)."""
    given = LaunchConfiguration("rviz_config").perform(context)
    if given:
        return given
    profile = LaunchConfiguration("robot_profile").perform(context)
    shipped = Path(FindPackageShare("captain_ros").perform(context)) / "config" / "rviz" / f"{profile}.rviz"
    if shipped.is_file():
        return str(shipped)
    from captain_ros.core import robot, rviz_config

    text = rviz_config.render(robot.load_profile(profile))  # ProfileError names the file and what is wrong
    generated = Path(tempfile.mkdtemp(prefix="captain_rviz_")) / f"{Path(profile).stem}.rviz"
    generated.write_text(text)
    return str(generated)


def rviz(context: LaunchContext) -> list[Node]:
    return [
        Node(
            package="rviz2",
            executable="rviz2",
            arguments=["-d", rviz_file(context)],
            parameters=[{"use_sim_time": typed("use_sim_time", bool)}],
            output="screen",
        )
    ]


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument(
            "robot_profile",
            default_value="panda_twin",
            description="robot profile (a name in config/robots/ or a path to a profile YAML): picks "
            "config/rviz/<name>.rviz and the frame of the operator view's markers",
        ),
        DeclareLaunchArgument(
            "rviz_config",
            default_value="",
            description="an rviz2 display configuration file to use instead of the robot profile's",
        ),
        DeclareLaunchArgument(
            "use_sim_time",
            default_value="false",
            choices=["true", "false"],
            description="use /clock from the MuJoCo twin",
        ),
    ]
    operator_view = Node(
        package="captain_ros",
        executable="operator_view",
        name="operator_view",
        parameters=[{"robot_profile": typed("robot_profile", str), "use_sim_time": typed("use_sim_time", bool)}],
        output="screen",
    )
    return LaunchDescription([*args, operator_view, OpaqueFunction(function=rviz)])
