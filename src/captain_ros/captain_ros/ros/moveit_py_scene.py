"""MoveIt 2's planning scene through moveit-py (`moveit.planning.MoveItPy`): the motion node's `use_moveit` where the
profile's `interfaces.moveit.api` is "moveit_py", or "auto" and moveit-py imports (ros/move_group_scene.open_scene).

The same three things as ros/move_group_scene.MoveItScene (move_group's services), in this process instead:
  check(q_waypoints)  each sampled configuration (core/moveit_scene.sample_indices) checked with
                      PlanningScene.check_collision(CollisionRequest, CollisionResult, RobotState) in the planning
                      group (the request move_group's /check_state_validity makes), under the scene monitor's
                      read_only() lock; the other joints (the fingers) keep the monitored current state's values.
                      A guarded sweep's touch rule (core/moveit_scene.TouchRule: the gripper links may touch the
                      measured objects) is allowed in the check itself: check_collision(..., state, acm) with a
                      copy of the scene's AllowedCollisionMatrix plus set_entry(link, object, True) per pair
  apply(add, remove)  PlanningSceneMonitor.process_collision_object(CollisionObject) per object: the same messages
                      (ros/move_group_scene.collision_box), REMOVE by id; a False return refuses the update
  plan(start, goal)   PlanningComponent.set_start_state(robot_state=) / set_goal_state(motion_plan_constraints=) with
                      the same joint goal (ros/move_group_scene.joint_goal), then plan(single_plan_parameters=
                      PlanRequestParameters) in the profile's pipeline and planner
Anything moveit-py raises becomes SceneCheckError, so the harness refuses the sweep (fail closed).

The names are moveit2's moveit_py bindings (github.com/moveit/moveit2, moveit_py/ at commit 8fcb5d2327767af3c764b13):
moveit_py/src/moveit/moveit_ros/moveit_cpp/moveit_cpp.cpp (MoveItPy(node_name, launch_params_filepaths, ...),
get_planning_scene_monitor, get_planning_component, get_robot_model, shutdown),
moveit_py/src/moveit/moveit_ros/planning_scene_monitor/planning_scene_monitor.cpp (read_only,
process_collision_object -> bool), moveit_py/src/moveit/moveit_core/planning_scene/planning_scene.cpp (current_state,
check_collision with and without `acm`, allowed_collision_matrix, __copy__ = PlanningScene::clone),
moveit_py/src/moveit/moveit_core/collision_detection/collision_matrix.cpp (AllowedCollisionMatrix(names,
default_entry), set_entry(name1, name2, allowed), get_entry, remove_entry, clear),
moveit_py/src/moveit/moveit_core/collision_detection/collision_common.cpp (CollisionRequest:
joint_model_group_name, contacts, max_contacts, max_contacts_per_pair; CollisionResult: collision, contacts),
moveit_py/src/moveit/moveit_core/robot_state/robot_state.cpp (joint_positions as a dict, update, __copy__),
moveit_py/src/moveit/moveit_ros/moveit_cpp/planning_component.cpp (set_start_state, set_goal_state, plan,
PlanRequestParameters(moveit_py, ns) and its fields), moveit_py/src/moveit/moveit_core/planning_interface/
planning_response.cpp (bool(response), error_code, trajectory), moveit_py/src/moveit/moveit_core/robot_trajectory/
robot_trajectory.cpp (get_robot_trajectory_msg), moveit_py/src/moveit/moveit_core/robot_model/ (has_joint_model_group,
get_joint_model_group, active_joint_model_names); the stubs are moveit_py/moveit/*.pyi.

Limits, from those bindings: CollisionResult.contacts maps body pairs to collision_detection::Contact, a type the
bindings do not register, so reading it raises TypeError when there are contacts; a collision is then reported as
UNNAMED. That is why the touch rule goes into the ACM rather than into judge: what the services path lets judge drop
(a gripper link touching a measured object) is not a collision here, and whatever still collides (the arm's other
links touching an object, anything touching the integrator's scene objects, self-collision) is refused unnamed. The
ACM's copy comes from a clone of the scene per guarded check (moveit_py binds no copy of an ACM alone). The calls are
synchronous in this process, so `timeout_s` does not bound them (planning is bounded by `planning_time_s`). Tested
only against tests/captain_ros/ros/fake_moveit_py (a fake `moveit` package built from these names, its ACM
included); moveit-py has no PyPI build and does not install here, so MoveIt's own FCL checking with that ACM is not
run.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from moveit_msgs.msg import CollisionObject

from captain_ros.core.moveit_scene import (
    SceneBox,
    SceneCheckError,
    StateVerdict,
    TouchRule,
    joint_path,
    sample_indices,
)
from captain_ros.core.robot import MoveItInterface
from captain_ros.ros.move_group_scene import collision_box, error_code_name, joint_goal

NODE_NAME = "moveit_py"  # MoveItPy's default node name: the key of its parameters in the params file
PLAN_PARAMS_NS = "plan_request_params"  # PlanRequestParameters' namespace (moveit_py's tutorials' name)
MAX_CONTACTS = 100  # per checked state; one per pair (move_group's state validation asks the same way)


def importable() -> bool:
    """Whether moveit-py's MoveItPy imports here (interfaces.moveit.api "auto" takes it then)."""
    try:
        from moveit.planning import MoveItPy  # noqa: F401
    except ImportError:
        return False
    return True


class MoveItPyScene:
    """moveit-py's planning scene for the harness (harness.PlanningScene), as MoveItScene over services."""

    api = "moveit_py"

    def __init__(self, settings: MoveItInterface, joint_names: tuple[str, ...], frame_id: str) -> None:
        from moveit import core
        from moveit.planning import MoveItPy, PlanRequestParameters

        self.settings, self.joint_names, self.frame_id = settings, tuple(joint_names), frame_id
        self._collision = core.collision_detection
        self._plan_parameters = PlanRequestParameters
        self.free_space_min_m = settings.free_space_min_m
        self.validity_name = "moveit_py PlanningScene.check_collision"
        self.apply_name = "moveit_py PlanningSceneMonitor.process_collision_object"
        self.plan_name = "moveit_py PlanningComponent.plan"
        self.unnamed = (settings.planning_group, "MoveIt's scene (moveit_py names no contacts)")  # see the module doc
        params = settings.moveit_py_params_file
        with self._failing("start (MoveItPy)"):
            # without a params file, MoveItPy's default: the --params-file arguments of this process
            self.moveit = (
                MoveItPy(node_name=NODE_NAME, launch_params_filepaths=[params])
                if params
                else MoveItPy(node_name=NODE_NAME)
            )
            self.psm = self.moveit.get_planning_scene_monitor()

    @contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        """Anything moveit-py raises -> SceneCheckError naming what was asked (the harness refuses the sweep)."""
        try:
            yield
        except SceneCheckError:
            raise
        except Exception as exc:
            raise SceneCheckError(f"moveit_py {what} failed: {type(exc).__name__}: {exc}") from exc

    def missing(self, timeout_s: float) -> list[str]:
        """What moveit-py's robot model lacks (configure names it): the planning group, or arm joints in it.
        `timeout_s` is unused: MoveItPy loaded its model when it started."""
        group = self.settings.planning_group
        try:
            model = self.moveit.get_robot_model()
            if not model.has_joint_model_group(group):
                return [f"planning group '{group}' in moveit_py's robot model '{model.name}'"]
            names = list(model.get_joint_model_group(group).active_joint_model_names)
        except Exception as exc:
            return [f"moveit_py's robot model ({type(exc).__name__}: {exc})"]
        lacking = [j for j in self.joint_names if j not in names]
        return [f"joints {', '.join(lacking)} in planning group '{group}' of moveit_py"] if lacking else []

    def _state(self, scene, q: np.ndarray):
        """The scene's current state (every joint as monitored) with the arm's joints at `q`."""
        state = copy.copy(scene.current_state)
        state.joint_positions = {j: float(v) for j, v in zip(self.joint_names, q, strict=True)}
        state.update()
        return state

    def _contacts(self, result) -> tuple[tuple[str, str], ...]:
        try:
            pairs = tuple((str(a), str(b)) for a, b in result.contacts)
        except TypeError:  # collision_detection::Contact is not a bound type: the map cannot be read
            pairs = ()
        return pairs or (self.unnamed,)

    @staticmethod
    def _touch_acm(scene, may_touch: TouchRule | None):
        """The AllowedCollisionMatrix a guarded sweep is checked with: a copy of the scene's own (the SRDF's
        disabled pairs, the integrator's entries) with every pair of `may_touch` (core/moveit_scene.TouchRule:
        a gripper link and a measured object) allowed; None without a rule (the scene's own applies). The copy
        is the ACM of a clone of the scene (`copy.copy(scene)`: PlanningScene::clone, whose decoupleParent copies
        the ACM; moveit_py binds no copy of an AllowedCollisionMatrix itself), so the monitored scene is not
        changed; the clone stays alive as long as the returned ACM (its reference_internal getter)."""
        pairs = may_touch.pairs() if may_touch is not None else []
        if not pairs:
            return None
        acm = copy.copy(scene).allowed_collision_matrix
        for link, obj in pairs:
            acm.set_entry(link, obj, True)
        return acm

    def check(self, q_waypoints: np.ndarray, may_touch: TouchRule | None = None) -> list[StateVerdict]:
        """moveit-py's verdict on the sampled configurations (judged by core/moveit_scene.judge). A guarded sweep's
        `may_touch` pairs are allowed in the check itself (`_touch_acm`): moveit-py cannot name the contacts, so
        judge could not drop them afterwards; whatever still collides is refused."""
        indices = sample_indices(len(q_waypoints), self.settings.max_states)
        verdicts = []
        with self._failing("state check (PlanningScene.check_collision)"), self.psm.read_only() as scene:
            acm = self._touch_acm(scene, may_touch)
            for i in indices:
                request = self._collision.CollisionRequest()
                request.joint_model_group_name = self.settings.planning_group
                request.contacts, request.max_contacts, request.max_contacts_per_pair = True, MAX_CONTACTS, 1
                result = self._collision.CollisionResult()
                state = self._state(scene, q_waypoints[i])
                if acm is None:
                    scene.check_collision(request, result, state)
                else:
                    scene.check_collision(request, result, state, acm)
                collided = bool(result.collision)
                verdicts.append(StateVerdict(i, not collided, self._contacts(result) if collided else ()))
        return verdicts

    def apply(self, add: list[SceneBox], remove: list[str]) -> None:
        objects = [CollisionObject(id=oid, operation=CollisionObject.REMOVE) for oid in remove]
        objects += [collision_box(box, self.frame_id) for box in add]
        with self._failing("scene update (PlanningSceneMonitor.process_collision_object)"):
            refused = [obj.id for obj in objects if not self.psm.process_collision_object(obj)]
        if refused:
            raise SceneCheckError(
                f"moveit_py did not apply the scene update for {', '.join(refused)} ({len(add)} add, "
                f"{len(remove)} remove)"
            )

    def plan(self, q_start: np.ndarray, q_goal: np.ndarray) -> tuple[np.ndarray | None, str]:
        """A free-space joint path from `q_start` to `q_goal` planned by moveit-py (the profile's pipeline and
        planner, a joint goal within 1 mrad): (path, '') or (None, why not, naming MoveIt's error code)."""
        if self.free_space_min_m <= 0:
            raise SceneCheckError("free-space planning is off (interfaces.moveit.free_space_min_m is 0)")
        s = self.settings
        with self._failing("free-space planning (PlanningComponent.plan)"):
            component = self.moveit.get_planning_component(s.planning_group)
            with self.psm.read_only() as scene:
                start = self._state(scene, q_start)
            if not component.set_start_state(robot_state=start):
                return None, "moveit_py refused the start state"
            if not component.set_goal_state(motion_plan_constraints=[joint_goal(self.joint_names, q_goal)]):
                return None, "moveit_py refused the joint goal"
            params = self._plan_parameters(self.moveit, PLAN_PARAMS_NS)
            params.planning_pipeline, params.planner_id = s.pipeline_id, s.planner_id
            params.planning_attempts, params.planning_time = 1, s.planning_time_s
            params.max_velocity_scaling_factor = params.max_acceleration_scaling_factor = 1.0  # timed again here
            response = component.plan(single_plan_parameters=params)
            code = int(response.error_code.val)
            if not response:
                name = error_code_name(code)
                return None, f"moveit_py found no free-space path ({name or 'error'} {code}, {s.pipeline_id})"
            traj = response.trajectory.get_robot_trajectory_msg().joint_trajectory
            names, points = list(traj.joint_names), [list(p.positions) for p in traj.points]
        try:
            return joint_path(names, points, self.joint_names), ""
        except ValueError as exc:
            return None, f"moveit_py's free-space path is unusable: {exc}"

    def close(self) -> None:
        try:
            self.moveit.shutdown()
        except Exception:  # closing must not fail the node's cleanup
            pass
