"""moveit_py/src/moveit/moveit_core/planning_scene/planning_scene.cpp (core/planning_scene.pyi), with
tests/ros/fake_move_group.py's collision model: the TCP as a sphere against the world's boxes."""

from __future__ import annotations

import copy

from captain_ros.core.kinematics import Kinematics
from moveit import _fake
from moveit.core.collision_detection import Contact


class PlanningScene:
    def __init__(self, robot_model, world=None) -> None:
        from moveit.core.robot_state import RobotState

        self._model = robot_model
        self._kin = Kinematics(profile=robot_model.profile)
        self._state = RobotState(robot_model)
        self.name = "fake"

    @property
    def robot_model(self):
        return self._model

    @property
    def planning_frame(self) -> str:
        return self._model.profile.base_frame

    @property
    def current_state(self):
        return self._state

    @current_state.setter
    def current_state(self, robot_state) -> None:
        self._state = copy.copy(robot_state)

    def hits(self, robot_state) -> list[str]:
        """(fake) the world boxes the TCP's sphere touches at `robot_state`."""
        tcp = self._kin.forward(robot_state.q())[0]
        world = _fake.STATE.world.values()
        return [b.id for b in world if b.contains(tcp, margin_m=_fake.STATE.tcp_radius_m)]

    def check_collision(self, collision_request, collision_result, state=None, acm=None) -> None:
        _fake.STATE.maybe_fail("check_collision")
        hits = self.hits(self._state if state is None else state)
        _fake.STATE.checked += 1
        _fake.STATE.groups.add(collision_request.joint_model_group_name)
        collision_result.collision = bool(hits)
        if collision_request.contacts:
            tcp = self._model.profile.tcp_frame
            found = hits[: collision_request.max_contacts]
            collision_result._contacts = {(tcp, h): [Contact(tcp, h)] for h in found}
            collision_result.contact_count = len(found)

    def is_state_colliding(self, robot_state=None, joint_model_group_name: str = "", verbose: bool = False) -> bool:
        return bool(self.hits(self._state if robot_state is None else robot_state))
