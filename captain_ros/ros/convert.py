"""Conversions between the ROS-free core types and captain_interfaces messages."""

from __future__ import annotations

import json
import math

from std_msgs.msg import Header

from captain_interfaces.msg import Budget as BudgetMsg
from captain_interfaces.msg import CallResult as CallResultMsg
from captain_ros.core.contract import Budget, CallResult, FailureCategory


def budget_to_msg(budget: Budget) -> BudgetMsg:
    return BudgetMsg(
        requests_used=budget.requests_used,
        requests_limit=budget.requests_limit,
        actions_used=budget.actions_used,
        actions_limit=budget.actions_limit,
        wall_time_used_s=float(budget.wall_time_used_s),
        wall_time_limit_s=float(budget.wall_time_limit_s),
    )


def budget_from_msg(msg: BudgetMsg) -> Budget:
    return Budget(
        requests_used=msg.requests_used,
        requests_limit=msg.requests_limit,
        actions_used=msg.actions_used,
        actions_limit=msg.actions_limit,
        wall_time_used_s=msg.wall_time_used_s,
        wall_time_limit_s=msg.wall_time_limit_s,
    )


def call_result_to_msg(result: CallResult, stamp_s: float | None = None) -> CallResultMsg:
    header = Header(frame_id=result.frame_id)
    if stamp_s is not None and math.isfinite(stamp_s):
        header.stamp.sec = int(stamp_s)
        header.stamp.nanosec = round((stamp_s - int(stamp_s)) * 1e9) % 1_000_000_000
    return CallResultMsg(
        header=header,
        call_id=result.call_id,
        episode_id=result.episode_id,
        capability=result.capability,
        success=result.success,
        executed=result.executed,
        failure_category=result.failure_category.value,
        message=result.message,
        receipt=result.receipt,
        value_json=result.value_json(),
        diagnostics_json=result.diagnostics_json(),
        budget=budget_to_msg(result.budget),
        duration_s=float(result.duration_s),
    )


def call_result_from_msg(msg: CallResultMsg) -> CallResult:
    """Rebuild a core result; a message that breaks the contract becomes a backend_error result."""
    try:
        category = FailureCategory(msg.failure_category)
        value = json.loads(msg.value_json) if msg.value_json else None
        diagnostics = json.loads(msg.diagnostics_json) if msg.diagnostics_json else {}
        return CallResult(
            capability=msg.capability,
            success=msg.success,
            executed=msg.executed,
            failure_category=category,
            message=msg.message,
            receipt=msg.receipt,
            value=value,
            diagnostics=diagnostics,
            budget=budget_from_msg(msg.budget),
            call_id=msg.call_id,
            episode_id=msg.episode_id,
            duration_s=msg.duration_s,
            frame_id=msg.header.frame_id,
        )
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        return CallResult.fail(
            msg.capability or "unknown",
            FailureCategory.BACKEND_ERROR,
            f"malformed CallResult message from the server: {exc}",
            call_id=msg.call_id,
            episode_id=msg.episode_id,
            executed=msg.executed,
        )
