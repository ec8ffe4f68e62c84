"""The stack on the MuJoCo twin: the twin (a ros2_control-style arm with RGB-D cameras), the harness
nodes (motion through ros2_control interfaces exactly as on a real arm, perception from its cameras)
and the monitor. agent.launch.py adds the agent node (and the scripted expert) on top of this.

    ros2 launch captain_ros sim_twin.launch.py task:=open_drawer start_id:=open_drawer/wide/4
"""

import os

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, SetEnvironmentVariable
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from captain_ros.core.domains import fast_dds_profile_env


def typed(name: str, value_type: type) -> ParameterValue:
    """A launch argument as a parameter of a fixed type. Untyped, launch_ros parses the text as YAML,
    so `real_time_factor:=0` would reach the node as an integer, which a double parameter refuses."""
    return ParameterValue(LaunchConfiguration(name), value_type=value_type)


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument(
            "task",
            default_value="put_red_cube_in_bowl",
            description="task name from the twin's task suite (config/tasks.yaml)",
        ),
        DeclareLaunchArgument(
            "start_id",
            default_value="",
            description="stable start-state id '<task>/<wide|official>/<index>'; empty = sample one",
        ),
        DeclareLaunchArgument(
            "split",
            default_value="any",
            choices=["train", "eval", "any"],
            description="split sampled start ids come from: train, eval or any",
        ),
        DeclareLaunchArgument(
            "real_time_factor",
            default_value="1.0",
            description="simulated seconds per wall second; 0 = as fast as possible",
        ),
        DeclareLaunchArgument(
            "twin_config",
            default_value=PathJoinSubstitution([FindPackageShare("captain_ros"), "config", "twin.yaml"]),
            description="twin_node parameters (rates, defaults)",
        ),
        DeclareLaunchArgument(
            "robot_profile",
            default_value="panda_twin",
            description="robot profile with a MuJoCo twin (config/robots/<name>.yaml with a twin section)",
        ),
        DeclareLaunchArgument(
            "use_rviz", default_value="true", choices=["true", "false"], description="start the rviz2 monitor"
        ),
    ]
    twin = Node(
        package="captain_ros",
        executable="twin_node",
        name="twin",
        output="screen",
        parameters=[
            LaunchConfiguration("twin_config"),
            {
                "task": typed("task", str),
                "start_id": typed("start_id", str),
                "split": typed("split", str),
                "real_time_factor": typed("real_time_factor", float),
                "robot_profile": typed("robot_profile", str),
            },
        ],
    )
    harness = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare("captain_ros"), "launch", "harness.launch.py"])
        ),
        # a busy host delays the twin's images in wall time: the perception node waits longer for them
        launch_arguments={
            "use_sim_time": "true",
            "camera_stale_after_s": "30.0",
            "camera_pair_wait_s": "10.0",
            "camera_tf_wait_s": "10.0",
        }.items(),
    )  # launch configurations reach included files: robot_profile here, safety_config etc. declared there
    monitor = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare("captain_ros"), "launch", "monitor.launch.py"])
        ),
        launch_arguments={"use_sim_time": "true"}.items(),
        condition=IfCondition(LaunchConfiguration("use_rviz")),
    )
    # Fast DDS with config/fastdds.xml (service responses that survive slow discovery), unless the environment
    # names a profiles file of its own
    dds = [SetEnvironmentVariable(name, value) for name, value in fast_dds_profile_env(os.environ).items()]
    return LaunchDescription([*args, *dds, twin, harness, monitor])
