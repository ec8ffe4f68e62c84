import pytest

pytest.importorskip("captain_interfaces")

from captain_interfaces.msg import CallResult as CallResultMsg
from captain_ros.core.contract import Budget, CallResult, FailureCategory
from captain_ros.ros.convert import call_result_from_msg, call_result_to_msg


def test_failure_categories_in_the_message_match_the_core():
    declared = {getattr(CallResultMsg, n) for n in dir(CallResultMsg) if n.startswith("FAILURE_")}
    assert declared == {c.value for c in FailureCategory}


def test_round_trip_keeps_every_field():
    original = CallResult.fail(
        "move_to",
        FailureCategory.CONTACT_STOP,
        "stopped at first contact 4.1 cm before the target",
        executed=True,
        value={"executed_distance_m": 0.118, "peak_force_n": 7.5},
        diagnostics={"substeps": 412},
        budget=Budget(requests_used=3, actions_used=2, wall_time_used_s=12.5),
        episode_id="ep-7",
        duration_s=1.25,
        frame_id="panda_link0",
    )
    msg = call_result_to_msg(original, stamp_s=12.75)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (12, 750_000_000)
    back = call_result_from_msg(msg)
    assert back == original


def test_malformed_message_becomes_a_backend_error_not_an_exception():
    msg = CallResultMsg(capability="segment", success=True, value_json="{not json", call_id="c1")
    result = call_result_from_msg(msg)
    assert not result.success
    assert result.failure_category is FailureCategory.BACKEND_ERROR
    assert "malformed" in result.message and result.call_id == "c1"

    msg = CallResultMsg(capability="segment", success=False, failure_category="exploded")
    assert call_result_from_msg(msg).failure_category is FailureCategory.BACKEND_ERROR
