"""The helper library's fixtures part, for LIBERO's kitchen fixtures: a cabinet of three drawers measured from its top
face and its handle bars (the drawer part uses them for a drawer named top, middle or bottom), and a stove's knob
from depth points over the stove's detection (the burner and the knob beside it read as one region): its axis, the
top of its ridge and the ridge's direction; the models an engineer would know (how far the knob turns on).

IN-DOMAIN: the model knowledge here is LIBERO's (its asset MJCF files: the wooden cabinet's three even drawers and
its handle bars, the flat stove's 19 cm burner with the knob beside it, the knob's ridge, its turn-on angle and stop;
the way the knob turns on and the slow sweep it needs were found by trying it in LIBERO's simulator). No simulator
state reaches the policy: every position comes from the depth points of the episode's images.

The scripted expert (agent/expert.py) sends the text below the marker line as it stands, in the first cell that
needs this part, and the agent's Python session defines it there. Above the line, not sent: what the part takes
from that session (the core part, defined before it), named for the linter and type checkers only.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the agent's session: the robot client and the core part
    import math

    import numpy as np

    from captain_ros.agent.expert_cells.core import distinct, find, geom
    from captain_ros.agent.expert_cells.session import robot


# ---------------------------------------- sent to the policy from this line on
if "cab_face" not in dir():
    cab_face = {}  # a cabinet of three drawers as first measured from its top face (its drawers shut)


def top_face(det, g):
    """A cabinet from the depth points of its top face: the most populated 1 cm band of heights (a flat top is one
    band; what stands against it, LIBERO's wine rack with its slanted planks, spreads over many, and may be taller),
    the largest cluster of its points. The region as a whole runs on into that neighbour: its footprint is too long
    for the cabinet and its top may be the neighbour's. The front is the long side facing the robot, its centre on
    the top's edge (the drawer faces lie under it); the height is above the cabinet's bottom ("bottom")."""
    u0, v0, u1, v1 = det["bbox_px"]
    grid = [[(u0 + (u1 - u0) * i / 31) / 511, (v0 + (v1 - v0) * k / 31) / 511] for i in range(32) for k in range(32)]
    r = robot.measure_image_points(observation_handle=det["observation_handle"], camera=det["camera"], points=grid)
    if not r["success"]:
        return None
    q = np.array([p["point_m"] for p in r["value"]["points"] if p["point_m"] is not None]).reshape(-1, 3)
    q = q[q[:, 2] > g["bottom_z_m"] + 0.08]  # a cabinet's top, not the table or what stands on it
    if len(q) < 20:
        return None
    counts, edges = np.histogram(q[:, 2], bins=np.arange(q[:, 2].min(), q[:, 2].max() + 0.02, 0.01))
    top = float(edges[int(np.argmax(counts))] + 0.005)
    top = float(np.median(q[np.abs(q[:, 2] - top) < 0.01, 2]))
    pts = q[np.abs(q[:, 2] - top) < 0.006][:, :2]
    pts = pts[np.linalg.norm(pts - np.median(pts, axis=0), axis=1) < 0.17]
    if len(pts) < 20:
        return None

    def span(v):  # 3rd to 97th percentile, widened to the whole of a flat top: a few stray points do not count
        lo, hi = np.percentile(v, [3, 97])
        return float(lo - (hi - lo) * 0.03), float(hi + (hi - lo) * 0.03)

    best = None
    for deg in range(0, 90, 2):  # the smallest rectangle round the points
        a = math.radians(deg)
        t, n = np.array([math.cos(a), math.sin(a)]), np.array([-math.sin(a), math.cos(a)])
        (s0, s1), (w0, w1) = span(pts @ t), span(pts @ n)
        if best is None or (s1 - s0) * (w1 - w0) < best[0]:
            best = ((s1 - s0) * (w1 - w0), t, n, (s0, s1), (w0, w1))
    _, t, n, (s0, s1), (w0, w1) = best
    if s1 - s0 < w1 - w0:
        t, n, (s0, s1), (w0, w1) = n, -t, (w0, w1), (-w1, -w0)
    c = t * (s0 + s1) / 2 + n * (w0 + w1) / 2
    if n @ -c < 0:
        n = -n
    # the front edge (facing the robot) is in full view, the far one may be cut by the image's border: the direction
    # of the front edge's points (the outermost of each stretch along it) is the cabinet's
    s, w = pts @ t, pts @ n
    edge = [pts[(s >= a) & (s < a + (s1 - s0) / 8)] for a in np.linspace(s0, s1, 9)[:-1]]
    edge = np.array([e[int(np.argmax(e @ n))] for e in edge if len(e) >= 2])
    if len(edge) >= 4:
        _, vecs = np.linalg.eigh((edge - edge.mean(axis=0)).T @ (edge - edge.mean(axis=0)))
        t = vecs[:, 1] if vecs[:, 1] @ t > 0 else -vecs[:, 1]
        n = np.array([-t[1], t[0]]) if np.array([-t[1], t[0]]) @ n > 0 else np.array([t[1], -t[0]])
        (s0, s1), (w0, w1) = span(pts @ t), span(pts @ n)
        w1 = float((edge @ n).max())
        front = pts[pts @ n > w1 - 0.02] @ t  # its ends, too: the middle of the face is the drawers' (a pull 6 mm
        s0, s1 = float(front.min()), float(front.max())  # off it bound a drawer after 8 cm)
        c = t * (s0 + s1) / 2 + n * (w0 + w1) / 2
    s, w = np.array([s0, s1]), np.array([w0, w1])
    return {
        "id": det["detection_id"],
        "det": det,
        "center": c,
        "depth": float(np.ptp(w)),
        "mid": c + n * float(np.ptp(w)) / 2,
        "n": n,
        "t": t,
        "width": float(np.ptp(s)),
        "height": top - float(g["bottom_z_m"]),
        "bottom": float(g["bottom_z_m"]),
        "top": top,
    }


def face_points(cab, n=48):
    """Depth points (x, y, z) on an n x n grid over the detection of a cabinet measured from its top face, widened
    by half (a drawer pulled out may read as a region of its own), as (along the face from its middle, out from the
    face, z) rows."""
    det = cab["det"]
    u0, v0, u1, v1 = det["bbox_px"]
    w, h = u1 - u0, v1 - v0
    u0, v0, u1, v1 = max(0, u0 - w / 2), max(0, v0 - h / 4), min(511, u1 + w / 2), min(511, v1 + h / 4)
    grid = [
        [(u0 + (u1 - u0) * i / (n - 1)) / 511, (v0 + (v1 - v0) * k / (n - 1)) / 511] for i in range(n) for k in range(n)
    ]
    r = robot.measure_image_points(observation_handle=det["observation_handle"], camera=det["camera"], points=grid)
    pts = [p["point_m"] for p in r["value"]["points"] if p["point_m"] is not None] if r["success"] else []
    q = np.array(pts, dtype=float).reshape(-1, 3)
    return np.column_stack([(q[:, :2] - cab["mid"]) @ cab["t"], (q[:, :2] - cab["mid"]) @ cab["n"], q[:, 2]])


def handle_height(cab, z, out=0.0):
    """The height of a drawer's handle bar, expected at z (the cabinet model's), the drawer `out` m out: for a cabinet
    measured from its top face, the top of the depth points 1.5-4.5 cm out from the drawer's face near its middle
    within 2.5 cm of z, less half the bar (a bar gripped 5 mm off its centre jammed the drawer in its runners)."""
    if "det" not in cab:
        return z
    q = face_points(cab)
    band = (q[:, 1] > out + 0.015) & (q[:, 1] < out + 0.045)  # in front of the drawer's face, `out` m out
    bar = q[(np.abs(q[:, 0]) < 0.05) & band & (np.abs(q[:, 2] - z) < 0.025)]
    return float(np.percentile(bar[:, 2], 75)) - 0.008 if len(bar) >= 3 else z  # seen from above: its top, 1.6 cm thick


# the jaw's path round the knob's axis: deg from the arm of the ridge it straddles, in the direction that turns the
# knob on (LIBERO's stove: on past 0.5 rad, 29 deg, and its stop at 120 deg; counter-clockwise seen from above)
KNOB_SWEEP = (0.0, 15.0, 30.0, 45.0, 60.0, 75.0)
KNOB_ON = 1.0  # +1: counter-clockwise seen from above
KNOB_ARM = 0.035  # m from the axis to the jaw's centre, on the ridge's arm (LIBERO's reaches 5-6 cm)
KNOB_JAW = 0.045  # m: the jaw open round the ridge (LIBERO's is 2.4 cm thick, its visual 2.7)
if "knobs" not in dir():
    knobs = {}  # goal -> the knob's ridge direction (deg) before it was turned


def knob_points(det):
    """Depth points (x, y, z, height above the table) on a grid over a detection's box, inside its footprint and
    above the table."""
    g = geom(det["detection_id"])
    u0, v0, u1, v1 = det["bbox_px"]
    grid = [[(u0 + (u1 - u0) * i / 31) / 511, (v0 + (v1 - v0) * k / 31) / 511] for i in range(32) for k in range(32)]
    r = robot.measure_image_points(observation_handle=det["observation_handle"], camera=det["camera"], points=grid)
    if g is None or not r["success"]:
        return None, g
    c, a = np.array(g["center_m"][:2]), math.radians(g["yaw_deg"])
    u, v = np.array([math.cos(a), math.sin(a)]), np.array([-math.sin(a), math.cos(a)])
    pts = []
    for p in r["value"]["points"]:
        if p["point_m"] is None or p["height_above_table_m"] < 0.008:
            continue
        d = np.array(p["point_m"][:2]) - c
        if abs(d @ u) <= g["extents_m"][0] / 2 + 0.01 and abs(d @ v) <= g["extents_m"][1] / 2 + 0.01:
            pts.append([*p["point_m"], p["height_above_table_m"]])
    return np.array(pts).reshape(-1, 4), g


def stove_knob(det):
    """The knob of a stove whose burner and knob read as one region: along the region's long side the burner is as
    wide as the region, the knob the narrow part at one end (LIBERO's flat stove: a 19 cm square burner, a 7 cm knob
    beside it). Returns {"center", "burner", "top", "ridge_deg", "points"} (the ridge: the knob's points within 2 cm
    of its top) or None when the region has no narrow end."""
    pts, g = knob_points(det)
    if pts is None or len(pts) < 20 or g["extents_m"][0] < 1.25 * g["extents_m"][1]:
        return None
    a = math.radians(g["yaw_deg"])
    u, v = np.array([math.cos(a), math.sin(a)]), np.array([-math.sin(a), math.cos(a)])
    s, w = (pts[:, :2] - g["center_m"][:2]) @ u, (pts[:, :2] - g["center_m"][:2]) @ v
    ends = []
    for sign in (1.0, -1.0):  # the outer 6 cm of each end of the long side
        at = sign * s > g["extents_m"][0] / 2 - 0.06
        ends.append((float(np.ptp(w[at])) if at.sum() >= 5 else 1.0, sign))
    (narrow, sign), (wide, _) = sorted(ends)
    if narrow > 0.7 * wide:
        return None
    short = g["extents_m"][1]
    knob = pts[sign * s > g["extents_m"][0] / 2 - (g["extents_m"][0] - short) + 0.01]  # beyond the burner's square
    if len(knob) < 8:
        return None
    top = float(np.percentile(knob[:, 2], 95))  # in the robot's frame
    ridge = knob[knob[:, 2] > top - 0.02]
    centre = np.median(knob[:, :2], axis=0)
    direction = 0.0
    if len(ridge) >= 5:
        q = ridge[:, :2] - ridge[:, :2].mean(axis=0)
        _, vecs = np.linalg.eigh(q.T @ q)
        direction = math.degrees(math.atan2(vecs[1, 1], vecs[0, 1]))
    return {
        "center": centre,
        "burner": np.median(pts[sign * s <= g["extents_m"][0] / 2 - (g["extents_m"][0] - short) + 0.01][:, :2], axis=0),
        "top": top,
        "ridge_deg": (direction + 90.0) % 180.0 - 90.0,
        "points": len(knob),
    }


def find_stove(text):
    """A stove's detection and its knob: among the regions its name finds, else the grey and the black ones (a
    stove's metal reads as either, and a library of renders may name another region for it), the first of a stove's
    size whose narrow end is a knob (stove_knob)."""
    for query in (text, "grey", "black"):
        for det in distinct(find(query))[:3]:
            long, short, high = det["extents_m"]
            if 0.2 < long < 0.45 and long > 1.25 * short and 0.03 < high < 0.12:  # a burner and a knob beside it
                knob = stove_knob(det)
                if knob is not None:
                    return det, knob
    return None, None


def fixture_top(text, det, g):
    """(geometry, detection) of the part of a fixture's region that things are put on: a stove's burner (its region
    has the knob at one end; find_stove), a cabinet's top face (its region may run on into a neighbour; top_face);
    (g, det) for anything else, or when that part is not found."""
    part = None
    if "stove" in text.split():
        found, knob = find_stove(text)
        if knob is not None:
            det, g = found, geom(found["detection_id"])
            part = (knob["burner"], g["extents_m"][1], g["extents_m"][1], g["yaw_deg"])
    elif "cabinet" in text.split():
        for found in sorted(find(text), key=lambda d: -d["mask_pixels"])[:2]:  # the largest: a library of renders
            fg = geom(found["detection_id"])  # named a small box "slide cabinet" (the bottle went onto it)
            cab = top_face(found, fg) if fg is not None else None
            if cab is not None:
                det, g = found, {**fg, "top_z_m": cab["top"]}  # the region's top may be its neighbour's
                part = (cab["center"], cab["width"], cab["depth"], math.degrees(math.atan2(cab["t"][1], cab["t"][0])))
                break
    if part is None:
        return g, det
    c, long, short, yaw = part
    a = math.radians(yaw)
    u, v = np.array([math.cos(a), math.sin(a)]) * long / 2, np.array([-math.sin(a), math.cos(a)]) * short / 2
    corners = [c + u + v, c - u + v, c - u - v, c + u - v]
    height = g["top_z_m"] - g["bottom_z_m"]
    top = {
        **g,
        "center_m": [float(c[0]), float(c[1]), g["bottom_z_m"] + height / 2],
        "extents_m": [long, short, height],
        "yaw_deg": (yaw + 90.0) % 180.0 - 90.0,
        "footprint_xy_m": [[float(x), float(y)] for x, y in corners],
        "fitted_shape": "box",
        "kind": "box",
        "open_top": False,
    }
    return top, det
