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
    """(geometry, detection) of a destination; `ref`, its earlier geometry, is kept unless it was bumped."""
    dets = find(text, camera)
    if not dets and text.split()[0] in ("black", "grey", "white"):
        dets = find(text.split()[-1], camera)  # their colour names vary with light
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
    """Detections of `text`; with `near`, those within `within` of it, else look-alike regions there."""
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
    """Top-down grasps, best first: across two faces where it fits the jaw, or on an open round vessel's rim (jaw
    half open); a round one not seen open (a can) gets both, across it first when seen from above."""
    c, (long, short) = np.array(g["center_m"]), g["extents_m"][:2]
    opts, base = [], dict(center=c[:2], bottom=g["bottom_z_m"], across=False)
    round_ = g["fitted_shape"] == "cylinder" or long - short < 0.1 * long
    rim = round_ and (g["open_top"] or g["kind"] in ("cup", "bowl") or short > 0.07)
    if rim:
        # 3 cm down the wall: 1.4 cm let LIBERO's bowls slip
        r, z = long / 2 - WALL / 2, g["top_z_m"] - min(0.03, 0.6 * g["extents_m"][2])
        for k in range(12):
            a = math.atan2(-c[1], -c[0]) + math.radians(30 * k)  # from the side facing the robot round
            u, yaw = np.array([math.cos(a), math.sin(a)]), (math.degrees(a) + 180) % 180 - 90
            opts.append(dict(base, kind="rim", xy=c[:2] + r * u, z=z, deep_enough_z=g["top_z_m"] - 0.014, open=0.04))
            opts[-1].update(yaw=yaw, width=WALL, to_center=-r * u, radial=u)
        opts.sort(key=lambda o: float(np.linalg.norm(o["xy"])))
    if not rim or (not g["open_top"] and g["kind"] != "bowl"):
        z = max(g["top_z_m"] - 0.022, g["bottom_z_m"] + 0.018)
        faces = [
            dict(base, kind="faces", round=rim, xy=c[:2], z=z, deep_enough_z=z + 0.006, open=JAW_MAX, radial=None)
            | dict(
                yaw=(g["yaw_deg"] + e + 90) % 180 - 90, width=long if e else short, to_center=0 * c[:2], across=e > 0
            )
            for e in (0, 90)
        ]
        # the hand may meet a neighbour: then slid 2 cm along the object, or turned 15 degrees
        for o in list(faces):
            a, w, h = math.radians(o["yaw"]), *((long, short) if o["across"] else (short, long))
            u = np.array([math.cos(a), math.sin(a)]) * (0 if rim or h < 0.06 else 0.02)
            faces += [dict(o, xy=c[:2] + k * u, to_center=-k * u, n=1) for k in (1, -1) if u.any()]
            faces += [
                dict(o, yaw=(o["yaw"] + t + 90) % 180 - 90, width=w if rim else w * 0.97 + h * 0.26, n=1)
                for t in (15, -15)
            ]
        # play: 5 mm a side, 3 mm round a body (its enclosing circle)
        faces = [o for o in faces if o["width"] <= JAW_MAX - (0.006 if rim else 0.01)]
        faces.sort(key=lambda o: (o.get("n", 0), abs(o["yaw"])))
        opts = faces + opts if from_above else opts + faces
    return opts


def faces_blind(o, v, cam):
    """From above a can's sides do not show between the pads: clear pad paths and tips above the table do."""
    return (
        o["round"]
        and cam == "wrist"
        and not v["obstacle_points_in_pad_paths"]
        and v["fingertip_height_above_table_m"] >= 0
    )


def clear_of(o, others):
    """Smallest gap (m) between grasp o's pads and detections reaching up to them (not what it stands on)."""
    tips = o["z"] - TIPS - 0.01

    def under(d):
        w, p, e = max(d["extents_m"][:2]), d["position_m"], d["extents_m"]
        return w >= 0.2 and np.linalg.norm(xy(p) - o["center"]) < w / 2 - 0.05 and o["bottom"] > p[2] - e[2] / 2 + 0.05

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
