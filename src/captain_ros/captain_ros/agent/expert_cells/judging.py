"""The helper library's judging part: whether an object is in or on a destination within TASK.md's tolerances,
and a round vessel's rim fitted from depth points when it reads as one region with what it stands on.

The scripted expert (agent/expert.py) sends the text below the marker line as it stands, in the first cell that
needs this part, and the agent's Python session defines it there. Above the line, not sent: what the part takes
from that session (the core part, defined before it, and the robot client), named for the linter and type checkers only.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the agent's session: the robot client, and the core part
    import math

    import numpy as np

    from captain_ros.agent.expert_cells.core import WALL, fmt, xy
    from captain_ros.agent.expert_cells.session import robot


# ---------------------------------------- sent to the policy from this line on
def inside(p, g, margin):
    """How far (m) the point p lies inside the footprint of geometry g shrunk by `margin` (negative: outside)."""
    d = xy(p) - xy(g["center_m"])
    if g["fitted_shape"] == "cylinder":
        return g["extents_m"][0] / 2 - margin - float(np.linalg.norm(d))
    a = math.radians(g["yaw_deg"])
    u = np.array([math.cos(a), math.sin(a)])
    v = np.array([-u[1], u[0]])
    return min(g["extents_m"][0] / 2 - margin - abs(d @ u), g["extents_m"][1] / 2 - margin - abs(d @ v))


def support_of(d, mode):
    """(height an object rests at, margin its centre must keep inside the footprint) for a destination geometry:
    TASK.md's tolerances plus the walls (a bowl's floor is 78% of its rim's radius)."""
    if mode == "in":
        margin = WALL + 0.005 + (0.22 * d["extents_m"][0] / 2 if d["kind"] == "bowl" else 0.0)
        return d["bottom_z_m"] + WALL, margin
    if d["kind"] == "plate":
        return d["bottom_z_m"] + 0.6 * d["extents_m"][2], WALL + 0.01
    return d["top_z_m"], 0.01


def judge(g, d, mode):
    """Whether a measured object g is 'in' or 'on' the destination geometry d within TASK.md's tolerances."""
    rest, margin = support_of(d, mode)
    clear = inside(g["center_m"], d, margin)
    dz = g["bottom_z_m"] - rest
    level = abs(dz) <= 0.015 if mode == "on" else (dz >= -0.015 and g["bottom_z_m"] <= d["top_z_m"] - 0.005)
    text = (
        f"centre {abs(clear) * 100:.1f} cm {'inside' if clear >= 0 else 'OUTSIDE'} the allowed area, "
        f"bottom {dz * 100:+.1f} cm from the support surface"
    )
    return bool(clear >= 0 and level), text


def rim_fit(det, size):
    """A round vessel from depth points on a grid over its detection's box, when it reads as one region with what it
    stands on: the points near its top are its upper wall; a circle fitted to them gives the rim's centre and a
    plane fitted to them its tilt. Returns (centre of its base (x, y), rim radius, tilt in degrees, top), or None."""
    u0, v0, u1, v1 = det["bbox_px"]
    grid = [[(u0 + (u1 - u0) * i / 23) / 511, (v0 + (v1 - v0) * k / 23) / 511] for i in range(24) for k in range(24)]
    r = robot.measure_image_points(observation_handle=det["observation_handle"], camera=det["camera"], points=grid)
    if not r["success"]:
        return None
    pts = [p for p in r["value"]["points"] if p["point_m"] is not None]
    top = max(p["height_above_table_m"] for p in pts)
    wall = np.array([p["point_m"] for p in pts if p["height_above_table_m"] > top - 0.45 * size[2]])
    if len(wall) < 12:
        return None
    x, y, z = wall[:, 0], wall[:, 1], wall[:, 2]
    ones = np.ones(len(x))
    a, b, c = np.linalg.lstsq(np.column_stack([x, y, ones]), x**2 + y**2, rcond=None)[0]  # x^2+y^2 = a x + b y + c
    rim = np.array([a / 2, b / 2])
    sx, sy, _ = np.linalg.lstsq(np.column_stack([x, y, ones]), z, rcond=None)[0]  # the wall band's plane
    axis = np.array([-sx, -sy, 1.0]) / float(np.linalg.norm([-sx, -sy, 1.0]))
    base = rim - axis[:2] * 0.8 * size[2]  # the band lies about a fifth of the height below the rim
    return base, float(np.sqrt(c + rim @ rim)), float(np.degrees(np.arccos(axis[2]))), top


def verdict(g, d, mode, size=None, det=None):
    """judge() for a fresh measurement g of an object of known `size`. Black, grey and white objects that touch
    read as one region, larger than the object: then a round vessel's centre comes from its rim (rim_fit)."""
    if size is None or all(a - b <= 0.02 for a, b in zip(g["extents_m"], size, strict=False)):
        return judge(g, d, mode)
    ext = " x ".join(f"{e * 100:.1f}" for e in g["extents_m"])
    fit = rim_fit(det, size) if det is not None and abs(size[0] - size[1]) < 0.01 else None
    if fit is None or abs(fit[1] - (size[0] / 2 - WALL / 2)) > 0.012:
        return False, f"the region measures {ext} cm, more than the object, and no rim could be fitted"
    base, radius, tilt, top = fit
    rest, margin = support_of(d, mode)
    clear = inside(base, d, margin)
    dz = top - size[2] - rest
    # a fitted rim is good to about a centimetre, less so when the vessel rests tilted on the destination's rim
    ok = clear >= 0.01 + 0.001 * tilt and -0.015 <= dz <= 0.025
    return ok, (
        f"one {ext} cm region with the destination; its rim (radius {radius * 100:.1f} cm, tilted {tilt:.0f} deg, "
        f"top {top:.3f} m) puts its base at {fmt(base)}, {abs(clear) * 100:.1f} cm "
        f"{'inside' if clear >= 0 else 'OUTSIDE'} the allowed area, {dz * 100:+.1f} cm from resting height"
    )


def body_inside(handle, d, size):
    """(whether, words) depth straight down into an open box (the wrist camera's observation `handle`, from above
    it) shows a body of an object's `size` on its floor inside its walls: where no view names the object (from
    above, an upright bottle shows only its cap). The floor is where most points inside the walls lie."""
    grid = [[i / 39, k / 39] for i in range(40) for k in range(40)]
    r = robot.measure_image_points(observation_handle=handle, camera="wrist", points=grid)
    margin = support_of(d, "in")[1] + 0.01
    pts = [p["point_m"] for p in (r["value"]["points"] if r["success"] else []) if p["point_m"]]
    up = sorted(p[2] for p in pts if inside(p, d, margin) > 0)
    if len(up) < 30:
        return False, f"from straight above, {len(up)} points inside its walls: too few to tell"
    floor = up[len(up) // 5]
    low, high = max(0.01, min(size) - 0.01), max(size) + 0.02
    body = [z for z in up if low <= z - floor <= high]
    return len(body) >= 15, (
        f"from straight above, {len(body)} of the {len(up)} points inside its walls stand {low * 100:.1f}-"
        f"{high * 100:.1f} cm above its floor (z {floor:.3f} m), as the object would"
    )
