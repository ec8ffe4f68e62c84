"""moveit_py/src/moveit/moveit_core/robot_model/ (core/robot_model.pyi): the profile as the robot model."""

from __future__ import annotations

from captain_ros.core.robot import load_profile
from moveit import _fake


class JointModelGroup:
    def __init__(self, name: str, joints: list[str]) -> None:
        self._name, self._joints = name, list(joints)

    @property
    def name(self) -> str:
        return self._name

    @property
    def active_joint_model_names(self) -> list[str]:
        return list(self._joints)

    @property
    def joint_model_names(self) -> list[str]:
        return list(self._joints)


class RobotModel:
    def __init__(self, urdf_xml_path: str = "", srdf_xml_path: str = "") -> None:
        self.profile = load_profile(_fake.STATE.profile)

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def joint_model_group_names(self) -> list[str]:
        return [_fake.STATE.group]

    def has_joint_model_group(self, joint_model_group_name: str) -> bool:
        return joint_model_group_name == _fake.STATE.group

    def get_joint_model_group(self, joint_model_group_name: str) -> JointModelGroup | None:
        if not self.has_joint_model_group(joint_model_group_name):
            return None
        return JointModelGroup(joint_model_group_name, list(self.profile.arm_joints))
