"""Whole episodes: the code-as-policy agent node against a policy server, on the twin by default.

    ros2 launch captain_ros agent.launch.py                                   # scripted expert on the twin
    ros2 launch captain_ros agent.launch.py policy:=http://localhost:8000/v1 task:=open_drawer episodes:=5
    ros2 launch captain_ros agent.launch.py use_twin:=false instruction:="put the cube in the bowl" \\
        policy:=http://gpu-host:8000/v1                  # on a real arm started with real_arm.launch.py

With use_twin:=true this includes sim_twin.launch.py (twin, motion and perception nodes, rviz); with
use_twin:=false the harness nodes must already run (real_arm.launch.py) and no host scores the scene.
`captain-ros run` starts the same graph without a ROS install (captain_ros.stack).
"""

import os

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, SetEnvironmentVariable
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import EqualsSubstitution, LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from captain_ros.core.domains import fast_dds_profile_env

EXPERT_URL = "http://127.0.0.1:8001/v1"


def typed(name: str, value_type: type) -> ParameterValue:
    return ParameterValue(LaunchConfiguration(name), value_type=value_type)


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument(
            "policy",
            default_value="expert",
            description="'expert' (start the scripted expert on port 8001) or an OpenAI-compatible URL (vLLM)",
        ),
        DeclareLaunchArgument("model", default_value="", description="served model name; empty = the only one"),
        DeclareLaunchArgument(
            "task",
            default_value="put_red_cube_in_bowl",
            description="task name (config/tasks.yaml), or a comma-separated list the episodes cycle through",
        ),
        DeclareLaunchArgument("instruction", default_value="", description="real arm: the instruction to follow"),
        DeclareLaunchArgument("start_id", default_value="", description="twin start id; empty = sample from split"),
        DeclareLaunchArgument(
            "split",
            default_value="eval",
            choices=["train", "eval", "any"],
            description="split the twin's start ids are drawn from",
        ),
        DeclareLaunchArgument("episodes", default_value="1", description="episodes to run before the node exits"),
        DeclareLaunchArgument(
            "use_twin", default_value="true", choices=["true", "false"], description="run on the MuJoCo twin"
        ),
        DeclareLaunchArgument("runs_dir", default_value="runs", description="transcripts and summary.json"),
        DeclareLaunchArgument(
            "send_images", default_value="true", choices=["true", "false"], description="attach camera images"
        ),
        DeclareLaunchArgument(
            "harness_config",
            default_value=PathJoinSubstitution([FindPackageShare("captain_ros"), "config", "harness.yaml"]),
            description="budgets, context limits and gate settings (the harness nodes read the same file)",
        ),
        DeclareLaunchArgument(
            "approval_mode",
            default_value="false",
            choices=["true", "false"],
            description="with use_twin:=true, the twin's motion node asks an operator before every physical "
            "action (`captain-ros approve`); on a real arm, give it to real_arm.launch.py",
        ),
    ]
    twin = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare("captain_ros"), "launch", "sim_twin.launch.py"])
        ),
        launch_arguments={
            "task": LaunchConfiguration("task"),
            "split": LaunchConfiguration("split"),
            "approval_mode": LaunchConfiguration("approval_mode"),
        }.items(),
        condition=IfCondition(LaunchConfiguration("use_twin")),
    )
    expert = Node(
        package="captain_ros",
        executable="expert_server",
        name="expert",
        output="screen",
        arguments=["--host", "127.0.0.1", "--port", "8001"],
        # EqualsSubstitution (launch >= Iron): Jazzy deprecates LaunchConfigurationEquals
        condition=IfCondition(EqualsSubstitution(LaunchConfiguration("policy"), "expert")),
    )
    url = PythonExpression(
        [
            "'",
            EXPERT_URL,
            "' if '",
            LaunchConfiguration("policy"),
            "' == 'expert' else '",
            LaunchConfiguration("policy"),
            "'",
        ]
    )
    agent = Node(
        package="captain_ros",
        executable="agent_node",
        name="agent",
        output="screen",
        emulate_tty=True,
        parameters=[
            {
                "llm_base_url": ParameterValue(url, value_type=str),
                "model": typed("model", str),
                "task": typed("task", str),
                "instruction": typed("instruction", str),
                "start_id": typed("start_id", str),
                "split": typed("split", str),
                "episodes": typed("episodes", int),
                "use_twin": typed("use_twin", bool),
                "runs_dir": typed("runs_dir", str),
                "send_images": typed("send_images", bool),
                "harness_config": typed("harness_config", str),
                "use_sim_time": typed("use_twin", bool),
            }
        ],
    )
    # Fast DDS with config/fastdds.xml (service responses that survive slow discovery), unless the environment
    # names a profiles file of its own
    dds = [SetEnvironmentVariable(name, value) for name, value in fast_dds_profile_env(os.environ).items()]
    return LaunchDescription([*args, *dds, twin, expert, agent])
