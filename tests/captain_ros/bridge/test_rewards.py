"""CaPtain Eq. 7 returns, App. E costs and the staged sub-goal reward, against hand-computed values."""

from __future__ import annotations

import pytest

from captain_ros.bridge.rewards import CostTracker, RewardConfig, subgoal_reward, terminal_reward

MOVE_OK = {"capability": "move_to", "success": True, "failure_category": None}
MOVE_FAILED = {"capability": "move_to", "success": False, "failure_category": "unreachable"}
REFUSED_BUDGET = {"capability": "move_to", "success": False, "failure_category": "budget_exhausted"}


def test_the_outcome_classes_are_ordered_as_in_eq_7():
    values = [terminal_reward(o) for o in ("success", "missed_finish", "failure", "budget_exhausted", "false_finish")]
    assert values == [1.0, 0.25, 0.0, -0.1, -0.3]
    with pytest.raises(ValueError, match="unknown outcome 'won'"):
        terminal_reward("won")


def test_failed_actions_and_actions_beyond_the_allowance_cost():
    tracker = CostTracker("t", RewardConfig(median_actions={"t": 2.0}))  # allowance 1.5 x 2 = 3 actions
    assert tracker.request([MOVE_OK, MOVE_OK], solved_before=False)["total"] == 0.0
    costs = tracker.request([MOVE_OK, MOVE_FAILED], solved_before=False)  # actions 3 and 4: the 4th is excess
    assert costs["excess_actions"] == pytest.approx(-0.008)
    assert costs["failed_actions"] == pytest.approx(-0.02)
    assert tracker.request([REFUSED_BUDGET], solved_before=False)["total"] == 0.0  # never ran: not counted


def test_post_success_costs_per_request_and_action_are_capped_per_episode():
    tracker = CostTracker("t", RewardConfig(median_actions={"t": 100.0}))
    assert tracker.request([], solved_before=True)["post_success"] == pytest.approx(-0.005)
    assert tracker.request([MOVE_OK, MOVE_OK], solved_before=True)["post_success"] == pytest.approx(-0.021)
    total = -0.026
    for _ in range(200):
        total += tracker.request([MOVE_OK], solved_before=True)["post_success"]
    assert total == pytest.approx(-0.45)  # the cap


def test_the_subgoal_ladder_pays_failed_hard_episodes_below_a_missed_finish():
    config = RewardConfig()
    assert subgoal_reward("failure", True, 3, 3, config) == pytest.approx(0.15 * 3 / 4)
    assert subgoal_reward("budget_exhausted", True, 1, 3, config) == pytest.approx(0.15 / 4)
    assert subgoal_reward("failure", False, 3, 3, config) == 0.0  # not a hard task
    assert subgoal_reward("false_finish", True, 3, 3, config) == 0.0  # stays the worst class
    assert subgoal_reward("failure", True, 99, 6, config) < terminal_reward("missed_finish")


def test_place_and_move_rungs_earn_the_staged_reward_only_while_they_still_hold_at_the_end():
    from captain_ros.twin.tasks import credited_rungs, get_task, rungs_held_at_end

    stack = get_task("stack_three_blocks")  # hard: green on blue, then red on green
    assert stack.hard and len(stack.ladder()) == 6
    assert rungs_held_at_end(stack) == [False, False, True, False, False, True]  # the two place rungs
    reached = [True, True, True, True, False, False]  # green placed, red grasped
    assert credited_rungs(reached, [False, False, True, True, False, False], rungs_held_at_end(stack)) == 4
    # green knocked off blue again by the end: its grasp and lift count, the place and everything after it do not
    assert credited_rungs(reached, [False, False, False, True, False, False], rungs_held_at_end(stack)) == 2
    assert credited_rungs([False] * 6, [True] * 6, rungs_held_at_end(stack)) == 0  # never reached: nothing
    drawer = get_task("put_cube_in_drawer")  # hard: open the drawer, then the cube in it
    assert drawer.hard and rungs_held_at_end(drawer) == [False, True, True, False, False, True]
    # handle reached, drawer moved and opened, cube grasped; the drawer slid shut again by the end
    assert credited_rungs([True] * 4 + [False] * 2, [False] * 6, rungs_held_at_end(drawer)) == 1
    with pytest.raises(ValueError, match="lengths differ"):
        credited_rungs([True], [True, True], [False])
