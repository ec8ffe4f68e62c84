"""The operator view's text and marker geometry, from plain values (no ROS)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from captain_ros.core.contract import Budget, CallResult, FailureCategory
from captain_ros.core.operator_markers import (
    NS_CONTACTS,
    NS_MOTIONS,
    NS_PLANNED,
    NS_RECEIPTS,
    NS_STATUS,
    EpisodeView,
    OperatorView,
    OperatorViewConfig,
    Shape,
    contact_from_result,
    planned_sweep_marker,
    receipt_line,
    receipts_text,
    status_text,
)

FRAME = "panda_link0"


def running(episode_id: str = "ep1", requests: int = 3, actions: int = 2, seconds: float = 80.0) -> EpisodeView:
    budget = Budget(
        requests_used=requests,
        requests_limit=60,
        actions_used=actions,
        actions_limit=150,
        wall_time_used_s=seconds,
        wall_time_limit_s=1080.0,
    )
    return EpisodeView(episode_id, "put_red_cube_in_bowl", "running", requests, budget)


def contact_stop(motion_id: int = 2, point=(0.68, 0.02, 0.008), force: float = 6.4) -> CallResult:
    value = {
        "motion_id": motion_id,
        "stop_reason": "contact",
        "peak_force_n": force,
        "tcp_position_m": list(point),
        "executed_distance_m": 0.07,
    }
    receipt = f"move_to: contact after 7.0 cm, peak {force:.1f} N, jaw 80->80 mm"
    return CallResult.fail(
        "move_to", FailureCategory.CONTACT_STOP, "contact: 6.4 N", value=value, receipt=receipt, executed=True
    )


def reached(motion_id: int = 1, point=(0.68, 0.02, 0.08)) -> CallResult:
    value = {"motion_id": motion_id, "stop_reason": "target_reached", "peak_force_n": 0.4, "tcp_position_m": point}
    return CallResult.ok("move_to", value=value, receipt="move_to: target_reached after 20.0 cm", executed=True)


def grasp(holding: bool = True, width_m: float = 0.042) -> CallResult:
    value = {
        "jaw_before_m": 0.08,
        "jaw_after_m": width_m if holding else 0.0,
        "jaw_command_m": 0.0,
        "holding_object": holding,
        "tcp_position_m": [0.5, 0.1, 0.02],
    }
    return CallResult.ok("move_to", value=value, receipt="move_to: jaw closed 80->42 mm", executed=True)


def by_key(markers) -> dict:
    return {(m.ns, m.id): m for m in markers}


# ---------------------------------------------------------------------------------------------- text
def test_status_text_says_request_n_of_the_limit_actions_budget_left_and_outcome():
    text = status_text(running())
    assert "put_red_cube_in_bowl ep1: running" in text
    assert "request 3 of 60, actions 2 of 150" in text
    assert "budget left: 57 requests, 148 actions, 1000 s" in text
    assert "outcome" not in text
    done = EpisodeView("ep1", "put_red_cube_in_bowl", "finished", 3, running().budget, "false_finish")
    assert status_text(done).splitlines()[-1] == "outcome: false_finish"


def test_status_text_before_any_episode_and_without_limits():
    assert "no episode status yet" in status_text(None)
    assert "waiting" in status_text(EpisodeView(state="idle"))
    unlimited = Budget(requests_used=4, requests_limit=0, actions_used=1, actions_limit=0, wall_time_limit_s=0.0)
    text = status_text(EpisodeView("e", "t", "running", 4, unlimited))
    assert "request 4 (no limit), actions 1 (no limit)" in text and "budget left: no limits" in text


def test_receipt_lines_mark_failures_and_fit_on_one_line():
    assert receipt_line(reached()) == "ok  move_to: target_reached after 20.0 cm"
    bare = CallResult.fail("segment", FailureCategory.NOT_FOUND, "no red cube", receipt="")
    assert receipt_line(bare) == "ERR segment: FAILED not_found: no red cube"
    multi = CallResult.ok("observe", receipt="observe: obs-3\n2 detections")
    assert "\n" not in receipt_line(multi)
    text = receipts_text(["a" * 200, "short"], total=9, max_chars=50)
    lines = text.splitlines()
    assert lines[0] == "receipts: latest 2 of 9" and len(lines[1]) == 50 and lines[1].endswith("...")
    assert receipts_text([], 0, 50).startswith("receipts: none yet")


# ---------------------------------------------------------------------------------------------- contacts
def test_contacts_come_from_contact_stops_force_limits_and_holding_grasps_only():
    c = contact_from_result(contact_stop())
    assert c is not None and c.kind == "contact" and c.motion_id == 2
    assert c.point_m == (0.68, 0.02, 0.008) and c.force_n == pytest.approx(6.4)
    g = contact_from_result(grasp())
    assert g is not None and g.kind == "grasp" and math.isnan(g.force_n) and g.width_m == pytest.approx(0.042)
    assert contact_from_result(reached()) is None
    assert contact_from_result(grasp(holding=False)) is None
    not_executed = contact_stop()
    not_executed.executed = False
    assert contact_from_result(not_executed) is None
    for broken in (None, "text", {"stop_reason": "contact"}, {"stop_reason": "contact", "tcp_position_m": [1, "x", 2]}):
        assert contact_from_result(CallResult.ok("move_to", value=broken, executed=True)) is None


def test_a_contact_is_drawn_as_a_sphere_a_force_arrow_along_its_sweep_and_a_label():
    view = OperatorView(FRAME)
    view.on_planned(2, [(0.68, 0.02, 0.08), (0.68, 0.02, 0.04), (0.68, 0.02, 0.0)])  # a descent
    view.on_receipt(contact_stop(force=6.4))
    markers = by_key(view.update().markers)
    sphere, arrow, label = markers[(NS_CONTACTS, 0)], markers[(NS_CONTACTS, 1)], markers[(NS_CONTACTS, 2)]
    assert sphere.shape is Shape.SPHERE and sphere.position_m == (0.68, 0.02, 0.008) and sphere.frame_id == FRAME
    assert arrow.shape is Shape.ARROW and arrow.points_m[1] == (0.68, 0.02, 0.008)  # ends at the contact
    tail, head = np.array(arrow.points_m[0]), np.array(arrow.points_m[1])
    np.testing.assert_allclose(head - tail, [0.0, 0.0, -0.064], atol=1e-9)  # pressing down, 1 cm per newton
    assert label.shape is Shape.TEXT and label.text == "contact 6.4 N motion 2"


def test_a_sideways_push_points_its_arrow_along_the_push_and_an_unseen_sweep_defaults_to_down():
    config = OperatorViewConfig(arrow_m_per_n=0.01, arrow_max_m=0.3)
    view = OperatorView(FRAME, config)
    view.on_planned(5, [(0.4, 0.0, 0.1), (0.4, 0.2, 0.1)])  # along +y
    view.on_receipt(contact_stop(motion_id=5, point=(0.4, 0.15, 0.1), force=100.0))
    view.on_receipt(contact_stop(motion_id=6, force=1.0))  # its sweep was never seen
    markers = by_key(view.update().markers)
    push = np.subtract(markers[(NS_CONTACTS, 1)].points_m[1], markers[(NS_CONTACTS, 1)].points_m[0])
    np.testing.assert_allclose(push, [0.0, 0.3, 0.0], atol=1e-9)  # clipped to arrow_max_m
    down = np.subtract(markers[(NS_CONTACTS, 4)].points_m[1], markers[(NS_CONTACTS, 4)].points_m[0])
    np.testing.assert_allclose(down, [0.0, 0.0, -config.arrow_min_m], atol=1e-9)  # raised to arrow_min_m


def test_a_grasp_is_a_sphere_the_size_of_the_opening_without_a_force_arrow():
    view = OperatorView(FRAME)
    view.on_receipt(grasp(width_m=0.042))
    markers = by_key(view.update().markers)
    assert markers[(NS_CONTACTS, 0)].scale == (0.042, 0.042, 0.042)
    assert (NS_CONTACTS, 1) not in markers
    assert markers[(NS_CONTACTS, 2)].text == "grasp 42 mm (move_to)"


# ---------------------------------------------------------------------------------------------- planned sweeps
def test_a_planned_sweep_is_a_line_through_its_waypoints_and_a_hold_is_a_dot():
    waypoints = np.array([[0.3, 0.0, 0.5], [0.35, 0.0, 0.45], [0.4, 0.0, 0.4]])
    line = planned_sweep_marker(7, waypoints, FRAME)
    assert (line.ns, line.id, line.shape, line.frame_id) == (NS_PLANNED, 7, Shape.LINE_STRIP, FRAME)
    np.testing.assert_allclose(line.points_m, waypoints)
    hold = planned_sweep_marker(8, waypoints[:1], FRAME)
    assert hold.shape is Shape.SPHERE_LIST and hold.points_m == ((0.3, 0.0, 0.5),)
    assert planned_sweep_marker(9, np.repeat(waypoints[:1], 3, axis=0), FRAME).shape is Shape.SPHERE_LIST
    with pytest.raises(ValueError, match="at least one"):
        planned_sweep_marker(1, np.zeros((0, 3)), FRAME)


# ---------------------------------------------------------------------------------------------- the view
def test_the_view_shows_status_and_the_latest_receipts_above_the_base():
    view = OperatorView(FRAME, OperatorViewConfig(text_anchor_m=(-0.4, 0.0, 1.0), receipt_lines=2))
    view.on_status(running())
    for i in range(5):
        view.on_receipt(CallResult.ok("observe", receipt=f"observe: obs-{i}"))
    update = view.update()
    markers = by_key(update.markers)
    status, receipts = markers[(NS_STATUS, 0)], markers[(NS_RECEIPTS, 0)]
    assert status.shape is Shape.TEXT and status.position_m == (-0.4, 0.0, 1.0) and status.frame_id == FRAME
    assert "request 3 of 60" in status.text
    assert receipts.text.splitlines() == ["receipts: latest 2 of 5", "ok  observe: obs-3", "ok  observe: obs-4"]
    assert receipts.position_m[2] < status.position_m[2] and receipts.position_m[:2] == (-0.4, 0.0)
    assert update.clear == ()


def test_a_new_episode_clears_receipts_contacts_and_the_last_episodes_sweeps_once():
    view = OperatorView(FRAME)
    view.on_status(running("ep1"))
    view.on_receipt(contact_stop())
    view.on_status(running("ep1", requests=4))  # same episode: nothing is cleared
    assert view.update().clear == () and view.contacts
    view.on_status(running("ep2", requests=0, actions=0))
    update = view.update()
    assert set(update.clear) == {NS_CONTACTS, NS_PLANNED, NS_MOTIONS}
    assert not [m for m in update.markers if m.ns == NS_CONTACTS]
    assert by_key(update.markers)[(NS_RECEIPTS, 0)].text.startswith("receipts: none yet")
    assert view.update().clear == ()  # handed out once


def test_the_config_refuses_nonsense():
    with pytest.raises(ValueError, match="receipt_lines"):
        OperatorViewConfig(receipt_lines=0)
    with pytest.raises(ValueError, match="text_anchor_m"):
        OperatorViewConfig(text_anchor_m=(0.0, math.nan, 1.0))
