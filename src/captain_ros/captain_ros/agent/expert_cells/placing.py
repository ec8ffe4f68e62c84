"""The helper library's placing part: a destination's geometry (kept once something stands on it), the target
among look-alikes and merged regions, the grasps of a measured object and how clear of its neighbours they are.

The scripted expert (agent/expert.py) sends the text below the marker line as it stands, in the first cell that
needs this part, and the agent's Python session defines it there. Above the line, not sent: what the part takes
from that session (the core part, defined before it), named for the linter and type checkers only.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the agent's session: the core part
    import math

    import numpy as np

    from captain_ros.agent.expert_cells.core import JAW_MAX, TIPS, WALL, find, geom, nearest, xy


# ---------------------------------------- sent to the policy from this line on
def destination(text, ref=None, camera="head"):
    """(geometry, detection) of a destination. With `ref` (its geometry from before an object was put on or in
    it) that geometry is kept unless an object of its size is seen a little way off (it was bumped): what stands
    on it hides part of it and shades it, and the arm may hide it."""
    dets = find(text, camera)
    if not dets and text.split()[0] in ("black", "grey", "white"):
        dets = find(text.split()[-1], camera)  # the colour name of black, grey and white objects varies with light
    if ref is None:
        return (geom(dets[0]["detection_id"]), dets[0]) if dets else (None, None)
    near = nearest(dets, ref["center_m"])
    g = geom(near["detection_id"]) if near is not None else None
    if (
        g is not None
        and 0.04 < float(np.linalg.norm(xy(g["center_m"]) - xy(ref["center_m"]))) < 0.10
        and all(abs(a - b) < 0.015 for a, b in zip(g["extents_m"][:2], ref["extents_m"][:2], strict=True))
    ):
        return g, near  # it has moved
    return ref, None


def find_target(text, near=None, within=0.12, camera="head"):
    """Detections of `text`; with `near`, those within `within` of it, or else other regions there that may be it:
    the same kind of object (a colour reads differently in a container's shadow) or, for a black, grey or white
    object, any region of those colours (they merge with black, grey and white neighbours)."""
    named = find(text, camera)
    if near is None:
        return named

    def close(dets):
        return [d for d in dets if float(np.linalg.norm(xy(d["position_m"]) - xy(near))) < within]

    if close(named):
        return close(named)
    words = text.split()
    for q in [words[-1]] + (["black", "grey", "white"] if words[0] in ("black", "grey", "white") else []):
        if close(find(q, camera)):
            return close(find(q, camera))
    return named


def grasp_options(g, from_above=False):
    """Top-down grasps of a measured object, best first: across two faces of a box-like object that fits the jaw
    (JAW_MAX), or on the rim of an open round vessel (one pad inside, one outside its wall, the jaw half open).
    A round object whose top did not read as open (a can, a bottle, or a cup seen from the side) gets the rim grasps
    and grasps across its body where it fits the jaw (a rim grasp's descent stops on a closed lid): after the rim
    grasps, or before them when the top was seen from above (from_above: the wrist camera), where an open top shows."""
    c, (long, short) = np.array(g["center_m"]), g["extents_m"][:2]
    opts = []
    round_ = g["fitted_shape"] == "cylinder" or long - short < 0.1 * long
    rim = round_ and (g["open_top"] or g["kind"] in ("cup", "bowl") or short > 0.07)
    if rim:
        r = long / 2 - WALL / 2
        for k in range(12):
            a = math.atan2(-c[1], -c[0]) + math.radians(30 * k)  # from the side facing the robot round
            radial = np.array([math.cos(a), math.sin(a)])
            opts.append(
                {
                    "kind": "rim",
                    "xy": c[:2] + r * radial,
                    # deep on the wall (3 cm, at most 60% of the vessel's height): a grip 1.4 cm down held LIBERO's
                    # bowls on the thin rim alone, and they slipped out on the way up; where the wall curves in
                    # under the inner pad first, the descent may stop on it as deep as 1.4 cm
                    "z": g["top_z_m"] - min(0.03, 0.6 * g["extents_m"][2]),
                    "deep_enough_z": g["top_z_m"] - 0.014,
                    "open": 0.04,
                    "yaw": (math.degrees(a) + 180) % 180 - 90,
                    "width": WALL,
                    "to_center": -r * radial,
                    "radial": radial,
                    "center": c[:2],
                    "bottom": g["bottom_z_m"],
                    "across": False,
                }
            )
        opts.sort(key=lambda o: float(np.linalg.norm(o["xy"])))
    if not rim or (not g["open_top"] and g["kind"] != "bowl"):
        faces = []
        for extra in (0.0, 90.0):
            faces.append(
                {
                    "kind": "faces",
                    "round": rim,  # across a round body (whose sides a view from above does not show)
                    "xy": c[:2],
                    "z": max(g["top_z_m"] - 0.022, g["bottom_z_m"] + 0.018),
                    "deep_enough_z": max(g["top_z_m"] - 0.022, g["bottom_z_m"] + 0.018) + 0.006,
                    "yaw": (g["yaw_deg"] + extra + 90) % 180 - 90,
                    "open": JAW_MAX,
                    "width": short if extra == 0 else long,
                    "to_center": np.zeros(2),
                    "radial": None,
                    "center": c[:2],
                    "bottom": g["bottom_z_m"],
                    "across": extra != 0,
                }
            )
        # 5 mm of play, at least, on each side of the jaw; 3 mm across a round body, whose enclosing circle is
        # already a little wider than it (inspect_contact_geometry then checks the pads' contact)
        play = 0.006 if rim else 0.01
        faces = [o for o in faces if o["width"] <= JAW_MAX - play]
        faces.sort(key=lambda o: abs(o["yaw"]))
        opts = faces + opts if from_above else opts + faces
    return opts


def clear_of(o, others):
    """Smallest gap (m) between the pads of grasp o and the footprints of other detections that reach up to the
    pads (a centimetre below the fingertips at the grasp height): what the object stands on lies below the fingers
    all the way down, as a cookie box under a bowl does. A fixture it stands on (20 cm across or more, the object
    5 cm or more inside its footprint and its bottom 5 cm or more above the fixture's) is no obstacle either: its
    region often takes in what stands on it, and reaches up as high."""
    tips = o["z"] - TIPS - 0.01

    def under(d):
        span, low = max(d["extents_m"][:2]), d["position_m"][2] - d["extents_m"][2] / 2
        inside = float(np.linalg.norm(xy(d["position_m"]) - o["center"])) < span / 2 - 0.05
        return span >= 0.2 and inside and o["bottom"] > low + 0.05

    others = [d for d in others if d["position_m"][2] + d["extents_m"][2] / 2 > tips and not under(d)]
    if o["radial"] is None:
        a = math.radians(o["yaw"])
        jaw = np.array([math.sin(a), -math.cos(a)])
    else:
        jaw = o["radial"]
    pads = [o["xy"] + s * (o["open"] / 2 + 0.009) * jaw for s in (-1, 1)]
    gaps = [
        float(np.linalg.norm(p - xy(d["position_m"]))) - max(d["extents_m"][:2]) / 2 - 0.01
        for p in pads
        for d in others
    ]
    return min(gaps) if gaps else 1.0
