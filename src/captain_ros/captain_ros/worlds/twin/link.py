"""The twin world's link: the harness core on an in-process MuJoCo twin (unit tests, benchmarks, the bridge's rollout
workers), scored by the twin's own goals."""

from __future__ import annotations

from captain_ros.agent.link import CoreLink, EpisodeStart, LinkError, Score
from captain_ros.core.config import HarnessConfig
from captain_ros.core.robot import RobotProfile


class InProcessLink(CoreLink):
    """The harness core on an in-process twin: one twin at a time, rebuilt when the task changes (a twin left
    open beside another was seen to render wrong observations)."""

    def __init__(self, config: HarnessConfig, suite: dict | None = None, profile: RobotProfile | None = None):
        from captain_ros.core.kinematics import Kinematics

        self.config, self.suite = config, suite
        self.kinematics = Kinematics(profile=profile)
        self.profile = self.kinematics.profile
        self.twin = self.harness = None

    def reset(self, task: str, start_id: str | None, split: str, episode_id: str) -> EpisodeStart:
        from captain_ros.harness.twin_backend import TwinBackend
        from captain_ros.twin.sim import SimulationFault, Twin
        from captain_ros.twin.tasks import TaskError

        try:
            if self.twin is None or self.twin.task.name != task:
                self.close()
                self.twin = Twin(task, suite=self.suite, profile=self.profile)
                safety = self.config.safety
                backend = TwinBackend(self.twin, safety.control_period_s, stop_decel_radps2=safety.stop_decel_radps2)
                self.harness = self._timed_harness(backend, self.kinematics)
            start = self.twin.reset(start_id, split=split)
            self.harness.new_episode(episode_id)
        except TaskError as exc:
            raise ValueError(str(exc)) from None
        except SimulationFault as exc:
            raise LinkError(f"simulator fault at reset: {exc}") from exc
        spec = self.twin.task
        return EpisodeStart(episode_id, spec.name, str(start), spec.instruction, spec.success_criteria())

    def score(self) -> Score:
        from captain_ros.twin.sim import SimulationFault

        try:
            return Score(self.twin.success(), list(self.twin.snapshot().subgoals_reached))
        except (SimulationFault, FloatingPointError) as exc:  # a state gone non-finite cannot be judged
            raise LinkError(f"simulator fault while scoring: {exc}") from exc

    def close(self) -> None:
        if self.twin is not None:
            self.twin.close()
        self.twin = self.harness = None
