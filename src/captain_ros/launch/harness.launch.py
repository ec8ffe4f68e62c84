"""The harness services: the motion node (guarded motion through /joint_states, the wrist wrench
topic and the arm's FollowJointTrajectory action) and the perception node (RGB-D cameras, built-in
or HTTP segmentation). Included by sim_twin.launch.py and real_arm.launch.py; on its own:

    ros2 launch captain_ros harness.launch.py watchdog:=false

The motion node is a ROS 2 lifecycle (managed) node, started here as a plain Node: with `autostart`
(the default) it configures and activates itself, and exits if the arm's interfaces are not there. To drive
its transitions yourself, on a real arm say, start it unconfigured and step it through them:

    ros2 launch captain_ros harness.launch.py autostart:=false
    ros2 lifecycle set /motion configure    # connect: fails, naming what is missing, if the arm is not ready
    ros2 lifecycle set /motion activate     # accept goals; `deactivate` stops and holds the arm

(launch_ros's LifecycleNode action would add lifecycle events to the launch; it is not needed for the above.)
"""

import os

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, RegisterEventHandler, SetEnvironmentVariable
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from captain_ros.core.domains import fast_dds_profile_env


def typed(name: str, value_type: type) -> ParameterValue:
    """A launch argument as a parameter of a fixed type. Untyped, launch_ros parses the text as YAML,
    so `control_period_s:=0` would reach the node as an integer and `robot_profile:=123` as one too."""
    return ParameterValue(LaunchConfiguration(name), value_type=value_type)


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument(
            "robot_profile",
            default_value="panda_twin",
            description="robot profile: a name in config/robots/ (panda_twin, franka_fr3, ur5e, ros2_control_demo) "
            "or a path to your own profile YAML: joints, frames, controller, gripper, wrench and camera names",
        ),
        DeclareLaunchArgument(
            "safety_config",
            default_value=PathJoinSubstitution([FindPackageShare("captain_ros"), "config", "safety.yaml"]),
            description="workspace box, speed and force limits, watchdog; review before every deployment",
        ),
        DeclareLaunchArgument(
            "harness_config",
            default_value=PathJoinSubstitution([FindPackageShare("captain_ros"), "config", "harness.yaml"]),
            description="motion, budget, completion-gate and perception (segmenter, pointing server) settings",
        ),
        DeclareLaunchArgument(
            "watchdog",
            default_value="true",
            choices=["true", "false"],
            description="hold the arm when the agent's /agent/heartbeat and calls go silent",
        ),
        DeclareLaunchArgument(
            "autostart",
            default_value="true",
            choices=["true", "false"],
            description="the motion node configures and activates itself; false = it waits, unconfigured, for "
            "`ros2 lifecycle set /motion configure` and `activate`",
        ),
        DeclareLaunchArgument(
            "approval_mode",
            default_value="false",
            choices=["true", "false"],
            description="every physical action waits for an operator's approval (/safety/approve, or "
            "`captain-ros approve` in a terminal); no answer within safety.yaml's approval_timeout_s: the arm holds",
        ),
        DeclareLaunchArgument(
            "estop_deadline_s",
            default_value="0.0",
            description="the /safety/estop topic (a button's bridge) must speak at least this often, else the e-stop "
            "engages and stays until it speaks again, released; 0 = no deadline (the twin); real_arm.launch.py: 0.5",
        ),
        DeclareLaunchArgument(
            "allow_unchecked_self_collision",
            default_value="false",
            choices=["true", "false"],
            description="run although the robot description's collision geometry does not load here (its meshes' "
            "package not installed, or no <collision> at all); false = the motion node's configure refuses it",
        ),
        DeclareLaunchArgument(
            "shadow_check",
            default_value="false",
            choices=["true", "false"],
            description="play every physical action first in a twin built from what the robot measured; refuse it "
            "when the twin predicts a collision of the arm, a force over the limit or an object pushed off the table",
        ),
        DeclareLaunchArgument(
            "use_moveit",
            default_value="false",
            choices=["true", "false"],
            description="check every sweep in MoveIt's planning scene (a running move_group's /check_state_validity) "
            "before it runs, with measured objects in the scene; a move_group that does not answer refuses the sweep",
        ),
        DeclareLaunchArgument(
            "use_sim_time",
            default_value="false",
            choices=["true", "false"],
            description="the motion node's watchdog and wall-time budget on /clock (true with the MuJoCo twin)",
        ),
        DeclareLaunchArgument(
            "camera_stale_after_s",
            default_value="2.0",
            description="perception: a camera or joint stream quiet this long (wall time) is gone (the twin: 30)",
        ),
        DeclareLaunchArgument(
            "camera_pair_wait_s",
            default_value="1.0",
            description="perception: how long observe waits for a fresh colour and depth pair (the twin: 10)",
        ),
        DeclareLaunchArgument(
            "camera_tf_wait_s",
            default_value="0.5",
            description="perception: how long observe waits for /tf to reach an image's stamp (the twin: 10)",
        ),
        DeclareLaunchArgument(
            "control_period_s",
            default_value="0.01",
            description="force-monitoring period: the period of the arm's /joint_states",
        ),
    ]
    motion = Node(
        package="captain_ros",
        executable="motion_node",
        name="motion",
        output="screen",
        parameters=[
            {
                "robot_profile": typed("robot_profile", str),
                "safety_config": typed("safety_config", str),
                "harness_config": typed("harness_config", str),
                "watchdog": typed("watchdog", bool),
                "autostart": typed("autostart", bool),
                "approval_mode": typed("approval_mode", bool),
                "estop_deadline_s": typed("estop_deadline_s", float),
                "shadow_check": typed("shadow_check", bool),
                "use_moveit": typed("use_moveit", bool),
                "allow_unchecked_self_collision": typed("allow_unchecked_self_collision", bool),
                "control_period_s": typed("control_period_s", float),
                "use_sim_time": typed("use_sim_time", bool),
            }
        ],
    )
    perception = Node(
        package="captain_ros",
        executable="perception_node",
        name="perception",
        output="screen",
        parameters=[
            {
                "robot_profile": typed("robot_profile", str),
                "harness_config": typed("harness_config", str),
                "stale_after_s": typed("camera_stale_after_s", float),
                "pair_wait_s": typed("camera_pair_wait_s", float),
                "tf_wait_s": typed("camera_tf_wait_s", float),
            }
        ],
    )
    # the stack without its motion node is an arm nobody guards: when it exits (a crash, a kill), the whole launch
    # shuts down, so the operator sees it end instead of a monitor that still looks alive
    motion_died = RegisterEventHandler(
        OnProcessExit(
            target_action=motion,
            on_exit=[EmitEvent(event=Shutdown(reason="the motion node exited: the arm is no longer guarded"))],
        )
    )
    # Fast DDS with config/fastdds.xml (service responses that survive slow discovery), unless the environment
    # names a profiles file of its own
    dds = [SetEnvironmentVariable(name, value) for name, value in fast_dds_profile_env(os.environ).items()]
    return LaunchDescription([*args, *dds, motion, perception, motion_died])
