import json
import math

import numpy as np
import pytest

from captain_ros.core.contract import (
    CAPABILITIES,
    CAPABILITY_BY_NAME,
    FAILURE_DESCRIPTIONS,
    PHYSICAL_CAPABILITIES,
    RECEIPT_MAX_CHARS,
    Budget,
    CallResult,
    FailureCategory,
)


def test_api_is_22_capabilities_plus_finish():
    names = [c.name for c in CAPABILITIES]
    assert len(names) == 23 and len(set(names)) == 23
    assert names[-1] == "finish"
    assert {"move_to", "hold", "recover", "release"} == PHYSICAL_CAPABILITIES
    assert CAPABILITY_BY_NAME["measure_object_geometry"].group == "measurement"


def test_every_failure_category_is_documented():
    assert set(FAILURE_DESCRIPTIONS) == set(FailureCategory) - {FailureCategory.NONE}


def test_result_dict_has_the_contract_keys():
    result = CallResult.ok("get_robot_state", value={"q": np.arange(3.0)}, receipt="ok")
    d = result.to_dict()
    assert list(d) == ["success", "executed", "failure_category", "message", "value", "diagnostics", "budget"]
    assert d["failure_category"] is None
    assert d["value"] == {"q": [0.0, 1.0, 2.0]}
    assert d["budget"]["requests_limit"] == 60 and d["budget"]["actions_limit"] == 150


def test_failed_result_needs_a_category_and_success_cannot_carry_one():
    with pytest.raises(ValueError, match="needs a failure category"):
        CallResult(capability="move_to", success=False)
    with pytest.raises(ValueError, match="cannot carry"):
        CallResult(capability="move_to", success=True, failure_category=FailureCategory.UNREACHABLE)
    with pytest.raises(ValueError):
        CallResult(capability="move_to", success=False, failure_category="not_a_category")


def test_fail_builds_a_receipt_that_names_the_category():
    result = CallResult.fail("segment", FailureCategory.NOT_FOUND, "no 'purple cube' in the head image")
    assert result.receipt.startswith("segment: FAILED not_found")
    assert result.to_dict()["failure_category"] == "not_found"


def test_receipt_is_capped_at_300_characters():
    result = CallResult.ok("observe", receipt="x" * 1000)
    assert len(result.receipt) == RECEIPT_MAX_CHARS
    assert result.receipt.endswith("...")


def test_non_finite_values_become_null_in_json():
    result = CallResult.ok("measure_image_points", value={"points": [[0.1, math.nan, math.inf]]})
    assert json.loads(result.value_json()) == {"points": [[0.1, None, None]]}


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        (Budget(), None),
        (Budget(requests_used=60), "requests"),
        (Budget(actions_used=150), "physical actions"),
        (Budget(wall_time_used_s=1080.0), "wall time"),
        (Budget(requests_used=10**6, requests_limit=0), None),
    ],
)
def test_budget_exhaustion(budget, expected):
    assert budget.exhausted() == expected
