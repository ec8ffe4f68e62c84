"""moveit_py/src/moveit/moveit_core/planning_scene/planning_scene.cpp (core/planning_scene.pyi), with
tests/captain_ros/ros/fake_move_group.py's collision model: the TCP as a sphere against the world's boxes, the contact
named (`_fake.STATE.body`, box) and skipped where the AllowedCollisionMatrix checked with allows that pair."""

from __future__ import annotations

import copy

from captain_ros.core.kinematics import Kinematics
from moveit import _fake
from moveit.core.collision_detection import AllowedCollisionMatrix, Contact


class PlanningScene:
    def __init__(self, robot_model, world=None) -> None:
        from moveit.core.robot_state import RobotState

        self._model = robot_model
        self._kin = Kinematics(profile=robot_model.profile)
        self._state = RobotState(robot_model)
        self._acm = AllowedCollisionMatrix([])  # the real one starts from the SRDF's disabled pairs
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

    @property
    def allowed_collision_matrix(self) -> AllowedCollisionMatrix:
        """getAllowedCollisionMatrix with reference_internal: the scene's own ACM, not a copy."""
        return self._acm

    @allowed_collision_matrix.setter
    def allowed_collision_matrix(self, acm: AllowedCollisionMatrix) -> None:
        self._acm = acm._copy()  # setAllowedCollisionMatrix copies

    def __copy__(self) -> PlanningScene:
        """PlanningScene::clone: diff() then decoupleParent(), which copies the parent's ACM (and world; the fake's
        world is _fake.STATE's)."""
        out = PlanningScene(self._model)
        out._state, out._acm, out.name = copy.copy(self._state), self._acm._copy(), self.name
        _fake.STATE.clones += 1
        return out

    def __deepcopy__(self, memo) -> PlanningScene:
        return self.__copy__()

    def hits(self, robot_state, acm: AllowedCollisionMatrix | None = None) -> list[str]:
        """(fake) the world boxes the TCP's sphere touches at `robot_state`, those `acm` allows for the body
        (`_fake.STATE.body`, the TCP link by default) left out."""
        tcp = self._kin.forward(robot_state.q())[0]
        body, world = self.body(), _fake.STATE.world.values()
        touching = [b.id for b in world if b.contains(tcp, margin_m=_fake.STATE.tcp_radius_m)]
        return [h for h in touching if acm is None or not acm.allows(body, h)]

    def body(self) -> str:
        """(fake) the robot link the TCP's sphere stands for in contacts and ACM lookups."""
        return _fake.STATE.body or self._model.profile.tcp_frame

    def check_collision(self, collision_request, collision_result, state=None, acm=None) -> None:
        """The three bound overloads: (request, result), (request, result, state), (request, result, state, acm);
        without `acm` the scene's own."""
        _fake.STATE.maybe_fail("check_collision")
        if acm is not None and state is None:
            raise TypeError("check_collision(): incompatible function arguments (acm needs a state)")
        hits = self.hits(self._state if state is None else state, self._acm if acm is None else acm)
        _fake.STATE.checked += 1
        _fake.STATE.acm_checks += acm is not None
        _fake.STATE.groups.add(collision_request.joint_model_group_name)
        collision_result.collision = bool(hits)
        if collision_request.contacts:
            body = self.body()
            found = hits[: collision_request.max_contacts]
            collision_result._contacts = {(body, h): [Contact(body, h)] for h in found}
            collision_result.contact_count = len(found)

    def is_state_colliding(self, robot_state=None, joint_model_group_name: str = "", verbose: bool = False) -> bool:
        return bool(self.hits(self._state if robot_state is None else robot_state, self._acm))
