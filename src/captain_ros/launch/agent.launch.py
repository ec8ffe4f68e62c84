"""The code-as-policy agent node against a local vLLM server. Skeleton: the agent node is added
by the agent issue; the arguments below are its interface.

    ros2 launch captain_ros agent.launch.py llm_base_url:=http://localhost:8000/v1 model:=<served name>
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument


def generate_launch_description() -> LaunchDescription:
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                "llm_base_url",
                default_value="http://localhost:8000/v1",
                description="OpenAI-compatible endpoint of the policy server (vLLM)",
            ),
            DeclareLaunchArgument(
                "model", default_value="", description="served model name; empty = the server's only model"
            ),
            DeclareLaunchArgument("task", default_value="", description="instruction or task name for the episode"),
        ]
    )
