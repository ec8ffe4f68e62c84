"""The helper library's drawer part: the cabinet's front face from the head camera, and how far its drawer is
open; the cabinet model an engineer would know (the handle bar, the drawer's travel).

The scripted expert (agent/expert.py) sends the text below the marker line as it stands, in the first cell that
needs this part, and the agent's Python session defines it there. Above the line, not sent: what the part takes
from that session (the core part, defined before it), named for the linter and type checkers only.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the agent's session: the core part
    import math

    import numpy as np

    from captain_ros.agent.expert_cells.core import find, geom, xy
    from captain_ros.agent.expert_cells.fixtures import cab_face, face_points, top_face


# ---------------------------------------- sent to the policy from this line on
HANDLE_BAR = 0.030  # the cabinet's handle bar: its centre 3 cm in front of the drawer face, 1.6 cm thick
HANDLE_OUT = 0.038  # the front of the handle bar from the drawer face
TRAVEL = 0.16  # the drawer's travel


def cabinet(level=""):
    """The cabinet's carcass in the head camera: the centre of its front face (the drawer side, facing the robot),
    the outward normal n and the direction t along the face, its width and height. With a drawer `level` (a cabinet
    of three drawers) from its top face instead (top_face), and its height above its own bottom."""
    cabs = sorted(find("cabinet"), key=lambda d: -d["mask_pixels"])
    g = geom(cabs[0]["detection_id"]) if cabs else None
    if g is None:
        return None
    if level:
        top = top_face(cabs[0], g)
        if top is not None and cab_face:  # it stands where it was first measured: an open drawer adds to its top
            return {**cab_face, "id": top["id"], "det": top["det"]}
        if top is not None:
            cab_face.update(top)
        return top
    c = xy(g["center_m"])
    a = math.radians(g["yaw_deg"])
    t = np.array([math.cos(a), math.sin(a)])  # the long side is the front (30 cm; the depth is partly hidden)
    n = np.array([-t[1], t[0]])
    if n @ -c < 0:
        n = -n
    fp = np.array(g["footprint_xy_m"]) - c
    s = fp @ t
    mid = c + t * (s.max() + s.min()) / 2 + n * float((fp @ n).max())
    return {
        "id": cabs[0]["detection_id"],
        "mid": mid,
        "n": n,
        "t": t,
        "width": float(s.max() - s.min()),
        "height": float(g["top_z_m"]),
    }


def drawer_at(cab, level=""):
    """(the handle bar's height, the drawer floor's, and the lowest and highest top of a region that is this drawer
    or its handle) for the drawer `level` of the cabinet. "": a cabinet of one drawer (the bar at 66% of its height,
    the floor at 49%); "top", "middle" or "bottom": one of three drawers stacked evenly, its bar at the middle of its
    third and its floor 5% of its third above the third's lower edge (LIBERO's wooden cabinet: bars at 18, 50 and
    82% of its height)."""
    h = cab["height"]
    if not level:
        return 0.66 * h, 0.49 * h, 0.5 * h, h + 0.02
    i, b = ("bottom", "middle", "top").index(level), cab.get("bottom", 0.0)
    return b + (i + 0.5) / 3 * h, b + (i + 0.15) / 3 * h, b + (i + 0.3) / 3 * h, b + (i + 1) / 3 * h + 0.02


def drawer_opening(cab, level=""):
    """How far the drawer stands out of the front face (m), and from how many regions: the furthest region in front
    of the face at drawer height (the handle, 3.8 cm proud of the drawer) among the brown, black, white, grey ones."""
    reach, parts = None, 0
    low, high = drawer_at(cab, level)[2:]
    if "det" in cab:  # a cabinet measured from its top face: the depth points in front of its face at drawer height
        q = face_points(cab)
        q = q[(np.abs(q[:, 0]) < cab["width"] / 2 - 0.01) & (q[:, 2] > low) & (q[:, 2] < high)]
        q = q[(q[:, 1] > 0.005) & (q[:, 1] < TRAVEL + HANDLE_OUT + 0.03)]
        reach, parts = (float(q[:, 1].max()), len(q)) if len(q) else (None, 0)
        return (None if reach is None else max(0.0, reach - HANDLE_OUT)), parts
    for colour in ("brown", "black", "white", "grey"):
        for d in find(colour + " drawer"):
            p = xy(d["position_m"]) - cab["mid"]
            top = d["position_m"][2] + d["extents_m"][2] / 2
            if p @ cab["n"] <= 0.005 or abs(p @ cab["t"]) > cab["width"] / 2 or not low < top < high:
                continue  # not in front of the face at drawer height (above the cabinet: the arm)
            g = geom(d["detection_id"])
            far = float(((np.array(g["footprint_xy_m"]) - cab["mid"]) @ cab["n"]).max()) if g else 1.0
            if far > TRAVEL + HANDLE_OUT + 0.03:
                continue  # further out than the drawer goes: something else
            reach = far if reach is None else max(reach, far)
            parts += 1
    return (None if reach is None else max(0.0, reach - HANDLE_OUT)), parts
