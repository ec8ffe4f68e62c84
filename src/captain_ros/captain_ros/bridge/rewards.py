"""The episode adapter's numbers: terminal return R_i (CaPtain Eq. 7), per-request costs c_t (App. A.2, E),
the staged sub-goal reward, and validity (AgenticRoboRL: infrastructure failures are excluded).

Costs are recorded per request with the episode (the `step` record's `costs`), so a trainer can change
how it weighs them without re-running rollouts; the totals here are the paper's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Eq. 7: success with finish, success without (missed finish), other failure, budget exhausted, false finish
OUTCOME_REWARD = {
    "success": 1.0,
    "missed_finish": 0.25,
    "failure": 0.0,
    "budget_exhausted": -0.1,
    "false_finish": -0.3,
    "infrastructure_failure": 0.0,  # invalid: never trained on
}


@dataclass(frozen=True)
class RewardConfig:
    """CaPtain App. A.2 / E constants."""

    excess_action_factor: float = 1.5  # actions beyond this x the task's median (expert/SFT episodes) cost
    excess_action_cost: float = -0.008
    failed_action_cost: float = -0.02  # a failed or rejected physical action
    post_success_action_cost: float = -0.008  # per physical action after the host first judged success
    post_success_request_cost: float = -0.005  # per request after the host first judged success
    post_success_cap: float = -0.45  # the post-success costs of one episode together, at most this
    subgoal_scale: float = 0.15  # a failed hard-task episode at rung d of n gets scale * d / (n + 1)
    default_median_actions: float = 12.0  # for a task with no measured median (the expert's mean here)
    median_actions: dict[str, float] = field(default_factory=dict)  # task -> median physical actions


@dataclass
class CostTracker:
    """Accumulates c_t request by request (the post-success cap spans the episode)."""

    task: str
    config: RewardConfig = RewardConfig()
    actions: int = 0
    post_success_total: float = 0.0

    def request(self, physical_calls: list[dict], solved_before: bool) -> dict[str, float]:
        """Costs of one request from its physical robot calls (dicts with `success`, `failure_category`)."""
        c = self.config
        allowance = c.excess_action_factor * c.median_actions.get(self.task, c.default_median_actions)
        counted = [call for call in physical_calls if call.get("failure_category") != "budget_exhausted"]
        excess = sum(1 for i in range(len(counted)) if self.actions + i + 1 > allowance)
        self.actions += len(counted)
        failed = sum(1 for call in counted if not call.get("success"))
        post = 0.0
        if solved_before:
            post = c.post_success_request_cost + c.post_success_action_cost * len(counted)
            post = max(post, c.post_success_cap - self.post_success_total)  # the costs are negative
            self.post_success_total += post
        costs = {
            "excess_actions": excess * c.excess_action_cost,
            "failed_actions": failed * c.failed_action_cost,
            "post_success": post,
        }
        costs = {k: v + 0.0 for k, v in costs.items()}  # no -0.0 in the records
        costs["total"] = sum(costs.values())
        return costs


def subgoal_reward(outcome: str, hard: bool, rungs_reached: int, rungs: int, config: RewardConfig) -> float:
    """App. E: a failed episode of a hard task that reached rung d of n gets scale * d / (n + 1) (< a missed
    finish's 0.25). False finishes get none: they stay the worst class."""
    if not hard or rungs <= 0 or outcome not in ("failure", "budget_exhausted"):
        return 0.0
    return config.subgoal_scale * min(rungs_reached, rungs) / (rungs + 1)


def terminal_reward(outcome: str) -> float:
    try:
        return OUTCOME_REWARD[outcome]
    except KeyError:
        raise ValueError(f"unknown outcome {outcome!r}; one of {', '.join(OUTCOME_REWARD)}") from None
