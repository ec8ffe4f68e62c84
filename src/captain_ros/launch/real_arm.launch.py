"""The stack on a physical arm driven through ros2_control: the harness nodes (guarded motion through the
arm's joint_trajectory_controller, the wrist F/T topic and /joint_states; perception from the RGB-D
cameras), the cameras' hand-eye calibration as static transforms, and the monitor; the agent node is added
by the issue that builds it.

The arm's own bring-up (Franka's franka_bringup, UR's ur_robot_driver: ros2_control, controllers, its
robot_state_publisher) and the camera drivers run first, from the vendor's launch files. Their
robot_state_publisher publishes the arm's links, so this file publishes only what they cannot know:
where the cameras are (config/camera_calibration/<profile>.yaml, checked against the profile's frames). For an
arm whose bring-up starts no robot_state_publisher, own_state_publisher:=true starts one with this package's
URDF, which also holds the cameras' nominal mounting (the calibration transforms are then not published: a frame
has one parent).

The calibration goes out through tf2_ros's static_transform_publisher with the flag arguments of Humble and
later (`--x --y --z --qx --qy --qz --qw --frame-id --child-frame-id`; Jazzy and Kilted warn about the old
positional form), one latched /tf_static transform per camera. perception_node hangs each camera on the link
named there, at the image's joint state. Only a ROS install runs this file (launch, launch_ros and the vendor
drivers are not on PyPI), and it has tf2_ros; the PyPI-wheel setups are the twin's, whose twin_node publishes
its cameras on /tf itself, so nothing else publishes a calibration (no node of ours imitates
static_transform_publisher).

    ros2 launch captain_ros real_arm.launch.py robot_profile:=franka_fr3
    ros2 launch captain_ros real_arm.launch.py robot_profile:=ur5e camera_calibration:=/path/to/my_calibration.yaml
    ros2 launch captain_ros real_arm.launch.py robot_profile:=franka_fr3 use_moveit:=true   # move_group running
"""

import os

from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, OpaqueFunction, SetEnvironmentVariable
from launch.conditions import IfCondition, UnlessCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import Command, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from captain_ros.core.domains import fast_dds_profile_env


def camera_extrinsics(context: LaunchContext) -> list[Node]:
    """One static_transform_publisher per camera of the profile's calibration file (config/camera_calibration/
    <profile>.yaml, or camera_calibration:=<file>), read and checked against the profile when the launch runs: the
    optical frame `child_frame` in `parent_frame`, a quaternion [x, y, z, w] as tf2 takes it."""
    from captain_ros.core.camera_calibration import calibration_path, load_calibration
    from captain_ros.core.robot import load_profile

    profile = load_profile(LaunchConfiguration("robot_profile").perform(context))
    path = calibration_path(profile, LaunchConfiguration("camera_calibration").perform(context))
    publishers = []
    for name, cam in load_calibration(path, profile).items():
        (x, y, z), (qx, qy, qz, qw) = cam.translation_m, cam.rotation_xyzw
        pose = {"--x": x, "--y": y, "--z": z, "--qx": qx, "--qy": qy, "--qz": qz, "--qw": qw}
        publishers.append(
            Node(
                package="tf2_ros",
                executable="static_transform_publisher",
                name=f"{name}_camera_extrinsics",
                arguments=[
                    *(str(part) for item in pose.items() for part in item),
                    "--frame-id",
                    cam.parent_frame,
                    "--child-frame-id",
                    cam.child_frame,
                ],
                output="screen",
            )
        )
    return publishers


def generate_launch_description() -> LaunchDescription:
    args = [
        DeclareLaunchArgument(
            "robot_profile",
            description="the arm (required: no default on a physical arm): franka_fr3, ur5e, or a path to your own "
            "profile YAML (docs/robot_profiles.md)",
        ),
        DeclareLaunchArgument(
            "use_rviz", default_value="true", choices=["true", "false"], description="start the rviz2 monitor"
        ),
        DeclareLaunchArgument(
            "own_state_publisher",
            default_value="false",
            choices=["true", "false"],
            description="start robot_state_publisher with this package's URDF; only for an arm whose "
            "bring-up starts none (Franka's and UR's do)",
        ),
        DeclareLaunchArgument(
            "camera_calibration",
            default_value="",
            description='hand-eye calibration: each camera\'s optical frame in the base or hand frame; "" = the '
            "profile's own, config/camera_calibration/<profile>.yaml (nominal values: calibrate yours)",
        ),
        DeclareLaunchArgument(
            "approval_mode",
            default_value="true",
            choices=["true", "false"],
            description="every physical action waits for an operator's approval (/safety/approve, or "
            "`captain-ros approve` in a terminal); on by default on a physical arm: approval_mode:=false once the "
            "profile's first runs went as expected",
        ),
        DeclareLaunchArgument(
            "estop_deadline_s",
            default_value="0.5",
            description="the e-stop button's bridge must publish on /safety/estop at least this often (steady time); "
            "silence engages the e-stop, which stays until the bridge is back and reads released; 0 = no bridge is "
            "watched (only the arm's own hardware e-stop then stops a dead stack)",
        ),
        DeclareLaunchArgument(
            "shadow_check",
            default_value="true",
            choices=["true", "false"],
            description="every physical action is first played in a twin of the arm (the profile's own, or its "
            "shadow_twin) built from what the robot measured, and refused when the twin predicts a collision of the "
            "arm, a force over the limit or an object pushed off the table",
        ),
        DeclareLaunchArgument(
            "use_moveit",
            default_value="false",
            choices=["true", "false"],
            description="check every sweep in MoveIt's planning scene before it runs: needs the arm's move_group "
            "running (the vendor's MoveIt configuration) with the services the profile's interfaces.moveit names; "
            "objects perception measured go into the scene and leave it when stale; no answer refuses the sweep",
        ),
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
        condition=IfCondition(LaunchConfiguration("own_state_publisher")),
    )
    extrinsics = OpaqueFunction(
        function=camera_extrinsics, condition=UnlessCondition(LaunchConfiguration("own_state_publisher"))
    )
    harness = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare("captain_ros"), "launch", "harness.launch.py"])
        ),
        launch_arguments={
            "robot_profile": LaunchConfiguration("robot_profile"),
            "approval_mode": LaunchConfiguration("approval_mode"),
            "estop_deadline_s": LaunchConfiguration("estop_deadline_s"),
            "shadow_check": LaunchConfiguration("shadow_check"),
            "use_moveit": LaunchConfiguration("use_moveit"),
        }.items(),
    )  # its arguments (robot_profile, safety_config, watchdog, ...) pass through: real_arm.launch.py watchdog:=true
    monitor = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            PathJoinSubstitution([FindPackageShare("captain_ros"), "launch", "monitor.launch.py"])
        ),
        condition=IfCondition(LaunchConfiguration("use_rviz")),
    )
    # Fast DDS with config/fastdds.xml (service responses that survive slow discovery), unless the environment
    # names a profiles file of its own
    dds = [SetEnvironmentVariable(name, value) for name, value in fast_dds_profile_env(os.environ).items()]
    return LaunchDescription([*args, *dds, state_publisher, extrinsics, harness, monitor])
