"""Compile the twin: the robot of a profile (its URDF) plus table, lights, cameras and objects (MjSpec).

The URDF supplies kinematics, limits, inertias and primitive geometry; this module adds what a
URDF cannot say: actuators (position servos with the URDF's effort limits), gravity
compensation (as the Franka controller does), the wrist force/torque sensor, camera
intrinsics, contact parameters, and the scene. Servo gains and colours come from the profile's `twin`
section; any serial arm with a parallel gripper whose profile has one compiles here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

from captain_ros.core import robot
from captain_ros.twin.objects import SceneObject, build_object

TABLE_HALF_M = (0.65, 0.75, 0.02)  # table top half-extents; its top surface is z = 0
TABLE_CENTER_XY_M = (0.45, 0.0)
IMAGE_SIZE_PX = 512
CAMERA_FOVY_DEG = {"head": 52.0, "wrist": 75.0}
WRIST_FT_SITE = "wrist_ft"


@dataclass(frozen=True)
class PhysicsConfig:
    timestep_s: float = 0.002
    arm_damping_ratio: float = 1.0
    arm_armature: float = 0.1
    pad_friction: tuple[float, float, float] = (1.5, 0.02, 0.002)


LINK_COLOR = (0.92, 0.92, 0.90, 1.0)  # links the profile gives no colour


def build_spec(
    objects: Sequence[SceneObject], physics: PhysicsConfig = PhysicsConfig(), profile: robot.RobotProfile | None = None
) -> mujoco.MjSpec:
    profile = profile or robot.default_profile()
    if profile.twin is None:
        raise ValueError(f"robot profile '{profile.name}' has no twin section: it has no MuJoCo twin")
    spec = mujoco.MjSpec.from_string(profile.urdf_text)
    spec.modelname = "captain_twin"
    spec.compiler.fusestatic = False  # keep the TCP, flange and camera frames as bodies
    spec.compiler.discardvisual = False  # keep the render-only table box and floor (URDF visuals are gone)
    _options(spec, physics)
    _robot(spec, physics, profile)
    _scene(spec)
    names = set()
    for obj in objects:
        if obj.name in names:
            raise ValueError(f"scene has two objects named '{obj.name}'")
        names.add(obj.name)
        build_object(spec.worldbody, obj)
    return spec


def compile_model(
    objects: Sequence[SceneObject], physics: PhysicsConfig = PhysicsConfig(), profile: robot.RobotProfile | None = None
) -> mujoco.MjModel:
    return build_spec(objects, physics, profile).compile()


def _options(spec: mujoco.MjSpec, physics: PhysicsConfig) -> None:
    spec.option.timestep = physics.timestep_s
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.option.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    spec.option.impratio = 10.0  # firmer frictional contacts for grasping
    spec.option.iterations = 50
    spec.option.ls_iterations = 20
    # objects at rest sleep until something touches them (MuJoCo 4): most of a tabletop is at rest
    spec.option.enableflags |= int(mujoco.mjtEnableBit.mjENBL_SLEEP)
    # never silently reset a diverged state: the twin reports it as an infrastructure fault
    spec.option.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_AUTORESET)
    spec.visual.global_.offwidth = IMAGE_SIZE_PX
    spec.visual.global_.offheight = IMAGE_SIZE_PX
    spec.visual.map.znear = 0.005
    spec.visual.map.zfar = 5.0
    spec.visual.headlight.ambient = [0.35, 0.35, 0.35]
    spec.visual.headlight.diffuse = [0.35, 0.35, 0.35]
    spec.visual.headlight.specular = [0.0, 0.0, 0.0]
    spec.visual.quality.shadowsize = 0
    spec.visual.quality.offsamples = 0  # no MSAA: it costs 2x on a software rasterizer
    spec.stat.extent = 1.0
    spec.stat.center = [0.45, 0.0, 0.2]


def _robot(spec: mujoco.MjSpec, physics: PhysicsConfig, profile: robot.RobotProfile) -> None:
    limits, twin = profile.joint_limits, profile.twin
    moving = set(profile.arm_links()) - {profile.base_frame}
    for body in spec.bodies:
        if body.name in moving:
            body.gravcomp = 1.0
        for geom in body.geoms:
            geom.rgba = list(twin.link_colors.get(body.name, LINK_COLOR))
            geom.group = 1
            if body.name in profile.pad_links:
                geom.friction = list(physics.pad_friction)
                geom.condim = 4
                geom.priority = 1  # the pads' friction wins over the object's
                # stiff, hard pads: the jaw width reads the object's width (45 mm cube -> 45 mm, not 43)
                geom.solref = [0.004, 1.0]
                geom.solimp = [0.95, 0.99, 0.001, 0.5, 2.0]
    # joint dynamics and position servos with the URDF's effort limits
    for name, kp in zip(profile.arm_joints, twin.arm_kp, strict=True):
        joint = spec.joint(name)
        joint.armature = physics.arm_armature
        lim = limits[name]
        act = spec.add_actuator(name=f"{name}_servo", target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        kv = 2 * physics.arm_damping_ratio * math.sqrt(kp * physics.arm_armature * 10)
        act.set_to_position(kp=kp, kv=kv)
        act.ctrlrange = [lim.lower, lim.upper]
        act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
        act.forcerange = [-lim.effort, lim.effort]
        act.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
    finger = limits[profile.finger_joints[0]]
    for name in profile.finger_joints:
        spec.joint(name).armature = 0.01
        spec.joint(name).damping = [2.0, 0.0, 0.0]
    # one servo on the first finger; the URDF's <mimic> (an equality constraint in MuJoCo) moves the second
    grip = spec.add_actuator(name="gripper_servo", target=profile.finger_joints[0], trntype=mujoco.mjtTrn.mjTRN_JOINT)
    grip.set_to_position(kp=twin.gripper_kp, kv=40.0)
    grip.ctrlrange = [finger.lower, finger.upper]
    grip.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
    grip.forcerange = [-twin.gripper_force_n, twin.gripper_force_n]
    grip.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
    # wrist force/torque sensor between the flange and the hand (hand side), in the hand frame
    hand = spec.body(profile.hand_frame)
    hand.add_site(name=WRIST_FT_SITE, pos=[0, 0, 0])
    spec.add_sensor(
        name="wrist_force", type=mujoco.mjtSensor.mjSENS_FORCE, objtype=mujoco.mjtObj.mjOBJ_SITE, objname=WRIST_FT_SITE
    )
    spec.add_sensor(
        name="wrist_torque",
        type=mujoco.mjtSensor.mjSENS_TORQUE,
        objtype=mujoco.mjtObj.mjOBJ_SITE,
        objname=WRIST_FT_SITE,
    )
    spec.body(profile.tcp_frame).add_site(name="tcp", pos=[0, 0, 0])
    # cameras at the URDF's optical frames; MuJoCo cameras look along -z with y up, optical
    # frames along +z with y down: a half turn about x
    for cam, frame in profile.camera_frames.items():
        body = spec.body(frame)
        if body is None:  # a real arm's camera frames may live on /tf only; the twin renders at a URDF link
            raise robot.ProfileError(
                f"{profile.source}: camera_frames.{cam} '{frame}' is not a link of the URDF: the twin renders each "
                "camera at its optical frame's link, so a twin's URDF must have it"
            )
        body.add_camera(name=cam, quat=[0, 1, 0, 0], fovy=CAMERA_FOVY_DEG[cam])
    # the base stands on the table
    spec.add_exclude(bodyname1="world", bodyname2=profile.base_frame)
    for link in twin.base_contact_excludes:
        spec.add_exclude(bodyname1=profile.base_frame, bodyname2=link)


def _scene(spec: mujoco.MjSpec) -> None:
    world = spec.worldbody
    # The table top collides as a plane (box-plane contacts cost a fraction of box-box ones; the
    # physics target needs it). The box is what cameras see. Beyond the table's edge the plane
    # still supports objects: such an object is far outside every goal, so outcomes do not change.
    world.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=list(TABLE_HALF_M),
        pos=[*TABLE_CENTER_XY_M, -TABLE_HALF_M[2]],
        rgba=[0.62, 0.50, 0.38, 1.0],
        contype=0,
        conaffinity=0,
    )
    world.add_geom(
        name="table_top",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[*TABLE_HALF_M[:2], 0.01],
        pos=[*TABLE_CENTER_XY_M, 0.0],
        rgba=[0, 0, 0, 0],
        friction=[0.8, 0.01, 0.001],
        condim=3,
        group=3,
    )
    world.add_geom(
        name="floor",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[3, 3, 0.1],
        pos=[0, 0, -0.75],
        rgba=[0.35, 0.37, 0.40, 1.0],
        contype=0,
        conaffinity=0,
    )
    world.add_light(
        name="key",
        pos=[0.4, -0.3, 1.8],
        dir=[0.0, 0.15, -1.0],
        diffuse=[0.6, 0.6, 0.6],
        specular=[0.1, 0.1, 0.1],
        castshadow=False,
        type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL,
    )
    world.add_light(
        name="fill",
        pos=[1.2, 0.5, 1.2],
        dir=[-0.6, -0.3, -0.7],
        diffuse=[0.25, 0.25, 0.25],
        specular=[0, 0, 0],
        castshadow=False,
        type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL,
    )


def intrinsics(
    model: mujoco.MjModel, camera: str, width_px: int = IMAGE_SIZE_PX, height_px: int = IMAGE_SIZE_PX
) -> np.ndarray:
    """3x3 K in sensor_msgs/CameraInfo conventions (pixel centres at integer coordinates)."""
    fovy = math.radians(model.cam(camera).fovy[0])
    f = 0.5 * height_px / math.tan(fovy / 2)
    return np.array([[f, 0.0, (width_px - 1) / 2], [0.0, f, (height_px - 1) / 2], [0.0, 0.0, 1.0]])
