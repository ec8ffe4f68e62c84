"""The helper library's core part: the poses and guarded moves, parking, looking from above, the detections and
measurements by name, and the records that later cells keep (placed_at, sizes, tries, seen).

The scripted expert (agent/expert.py) sends the text below the marker line as it stands, in the first cell of an
episode, and the agent's Python session defines it there; the other parts use its names, `math` and `np` among
them. Above the line, not sent: what the part takes from that session (the robot client), named for the linter and
type checkers only.

Importing this module runs it as the session does: JAW_MAX asks `robot` for the jaw's opening, so `robot` has to be
a built-in name then (the tests give it a stand-in).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the agent's session gives every cell the robot client
    from captain_ros.agent.expert_cells.session import robot


# ---------------------------------------- sent to the policy from this line on
import math

import numpy as np

PARK = [0.31, 0.0, 0.45]  # above the robot base: the arm out of the head camera's view of the table
VIEW = [0.40, 0.0, 0.60]  # above the table: the wrist camera sees all of it from here
WALL = 0.008  # wall thickness of bowls, cups, boxes and the drawer
_GEOMETRY = robot.robot_geometry()["value"]
JAW_MAX = float(_GEOMETRY["max_jaw_opening_m"])  # the jaw's full opening (80 mm on a Panda)
TIPS = float(_GEOMETRY["fingertips_below_tcp_m"])  # how far the fingertips reach past the TCP
if "placed_at" not in dir():  # what earlier cells recorded survives a second definition of this library
    placed_at = {}  # goal -> the destination's geometry, measured before the object was put on or in it
    sizes = {}  # goal -> the extents of the object it moves, measured before it was picked up
    tries = {}  # goal -> surveys so far
    seen = {}  # goal -> the destination as a survey first measured it


def pose(p, yaw=0.0, rpy=None, quat=None):
    """A TCP pose: fingers down with the jaw axis at `yaw` deg about z, or an explicit rpy (deg) or quaternion."""
    out = {"position": [round(float(v), 4) for v in p]}
    if quat is not None:
        out["quaternion"] = [float(v) for v in quat]
    elif rpy is not None:
        out["rpy_deg"] = [round(float(v), 2) for v in rpy]
    else:
        out["yaw_deg"] = round(float(yaw), 2)
    return out


def go(p, yaw=0.0, rpy=None, quat=None, *, mode="guarded", speed=None, force=None, check=False):
    """move_to a TCP pose; with check=True, check_motion first and return its objection instead of moving."""
    target = pose(p, yaw, rpy, quat)
    if check:
        ck = robot.check_motion(pose=target)
        if not ck["success"] or not ck["value"]["feasible"]:
            why = ck["value"]["reason"] if ck["success"] else ck["message"]
            return {
                "success": False,
                "executed": False,
                "failure_category": "not_feasible",
                "message": why,
                "value": None,
            }
    kw = {"mode": mode}
    if speed is not None:
        kw["speed_mps"] = speed
    if force is not None:
        kw["force_limit_n"] = force
    return robot.move_to(pose=target, **kw)


def state():
    return robot.get_robot_state()["value"]


def holding():
    return bool(robot.gripper_state()["value"]["holding_object"])


def ended_at(r):
    """Where a motion left the TCP (None if it never started)."""
    return np.array(r["value"]["tcp_position_m"]) if r.get("value") else None


def park():
    """Straight up to 25 cm with the current orientation, then to the parking pose; in manipulation mode (25 N at
    most), as the fingers may still rub on what they just let go of."""
    s = state()
    p = np.array(s["tcp_pose"]["position"])
    if np.linalg.norm(p - PARK) < 0.03:
        return True
    up = {"mode": "manipulation", "force": 25.0}
    if p[2] < 0.25 and not go([p[0], p[1], 0.25], quat=s["tcp_pose"]["quaternion"], **up)["success"]:
        return False
    return go(PARK, 0.0, **up)["success"]


def look_from_above():
    """The wrist camera from above the table: it tells apart what touches in the head camera's oblique view."""
    go(VIEW, 0.0, mode="manipulation", force=25.0)
    return robot.observe(cameras=["wrist"])


def find(text, camera="head"):
    """Detections answering `text` in the latest observation, best first ([] if none)."""
    r = robot.segment(text=text, camera=camera)
    return r["value"]["detections"] if r["success"] else []


def geom(det, dest=None):
    r = robot.measure_object_geometry(object=det, destination=dest)
    return r["value"] if r["success"] else None


def xy(p):
    return np.array(p[:2], dtype=float)


def fmt(p):
    return "(" + ", ".join(f"{float(v):.3f}" for v in p) + ")"


def distinct(dets, apart=0.05):
    """One detection per object: of detections whose centres lie within `apart` (parts of one object, such as a
    bowl's rim and its floor seen from above) the first, i.e. the best scored and largest, is kept."""
    kept = []
    for d in dets:
        if all(float(np.linalg.norm(xy(d["position_m"]) - xy(k["position_m"]))) > apart for k in kept):
            kept.append(d)
    return kept


def nearest(dets, p):
    """The detection whose centre is nearest the point p (x, y), or None."""
    return min(dets, key=lambda d: float(np.linalg.norm(xy(d["position_m"]) - xy(p))), default=None)
