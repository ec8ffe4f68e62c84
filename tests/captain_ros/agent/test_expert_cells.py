"""The scripted expert's helper library as modules (agent/expert_cells/): each part imports as real Python, the
expert sends exactly what its file holds below the marker line, and above that line there is nothing that runs
in the module and not in the agent's session (a docstring and imports for type checkers only).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import math
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from captain_ros.agent import expert

PARTS = ("core", "judging", "placing", "drawer", "fixtures")
PACKAGE = "captain_ros.agent.expert_cells"


def fake_robot() -> SimpleNamespace:
    """A stand-in for the session's robot client, enough for what the core part asks at definition time."""
    geometry = {"max_jaw_opening_m": 0.08, "fingertips_below_tcp_m": 0.004}
    return SimpleNamespace(robot_geometry=lambda: {"success": True, "value": geometry})


@pytest.fixture
def modules(monkeypatch) -> dict[str, ModuleType]:
    """Each part imported afresh, with a stand-in robot as a built-in name (the session's global in a cell)."""
    monkeypatch.setattr(builtins, "robot", fake_robot(), raising=False)
    for part in PARTS:
        monkeypatch.delitem(sys.modules, f"{PACKAGE}.{part}", raising=False)
    return {part: importlib.import_module(f"{PACKAGE}.{part}") for part in PARTS}


def split(module: ModuleType) -> tuple[str, str]:
    """(the text above the marker line, the text below it) of a part's file."""
    head, start, body = Path(module.__file__).read_text(encoding="utf-8").partition(expert.HELPER_SOURCE_START + "\n")
    assert start, f"{module.__name__} has no marker line"
    return head, body


def test_every_part_imports_and_defines_the_function_the_conversation_knows_it_by(modules):
    assert set(expert.HELPERS) == set(PARTS) == set(expert.HELPER_ORDER) == set(expert.HELPER_MARKERS)
    for part, module in modules.items():
        name = expert.HELPER_MARKERS[part].removeprefix("def ").removesuffix("(")
        assert callable(getattr(module, name)), (part, name)
    assert modules["core"].JAW_MAX == 0.08  # asked of the robot when the part is defined


def test_the_expert_sends_each_part_as_its_file_holds_it(modules):
    for part, module in modules.items():
        _, body = split(module)
        assert expert.HELPERS[part] == body.strip() == expert.helper_source(part)
        assert expert.HELPER_MARKERS[part] in expert.HELPERS[part]
        assert expert.HELPER_SOURCE_START not in expert.HELPERS[part]


def test_above_the_marker_only_a_docstring_and_what_the_part_takes_from_the_session(modules):
    """Nothing above the line runs differently from the session: imports under TYPE_CHECKING only, each of a name
    that the session has when the part is defined (the robot client, or a name of a part defined before it)."""
    order = expert.HELPER_ORDER
    for part, module in modules.items():
        head, _ = split(module)
        body = ast.parse(head).body
        assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), part  # the docstring
        rest = body[1:]
        assert ast.unparse(rest[0]) == "from typing import TYPE_CHECKING", part
        assert len(rest) == 2 and isinstance(rest[1], ast.If) and ast.unparse(rest[1].test) == "TYPE_CHECKING", part
        assert not rest[1].orelse, part
        for node in rest[1].body:
            assert isinstance(node, ast.Import | ast.ImportFrom), (part, ast.unparse(node))
            if isinstance(node, ast.Import):
                assert {a.name for a in node.names} <= {"math", "numpy"}, part
                continue
            names = {a.name for a in node.names}
            source = node.module.removeprefix(PACKAGE + ".")
            if source == "session":
                assert names == {"robot"}, part
            else:
                assert order.index(source) < order.index(part), (part, source)
                assert all(hasattr(modules[source], name) for name in names), (part, source, names)


def test_the_parts_defined_in_one_session_in_the_expert_s_order_work_together():
    session: dict = {"robot": fake_robot()}
    for part in expert.HELPER_ORDER:
        exec(compile(expert.HELPERS[part], f"<{part}>", "exec"), session)
    assert session["pose"]([0.4, 0.1, 0.2], 90) == {"position": [0.4, 0.1, 0.2], "yaw_deg": 90.0}
    bowl = {"center_m": [0.5, 0.0, 0.03], "fitted_shape": "cylinder", "extents_m": [0.16, 0.16, 0.06]}
    assert math.isclose(session["inside"]([0.52, 0.0], bowl, 0.01), 0.05)  # judging uses the core's xy and np
    assert session["fmt"]([0.5, 0.0, 0.03]) == "(0.500, 0.000, 0.030)"
    assert session["JAW_MAX"] == 0.08 and session["placed_at"] == {}


def test_a_grasp_is_judged_clear_of_neighbours_that_reach_up_to_its_pads_only():
    """A bowl raised on a cookie box (LIBERO spatial): the box is under the bowl's rim grasp, below the fingers all
    the way down, so it is no obstacle; a second bowl beside it, as tall, is."""
    session: dict = {"robot": fake_robot()}
    for part in expert.HELPER_ORDER:
        exec(compile(expert.HELPERS[part], f"<{part}>", "exec"), session)
    bowl = {
        "center_m": [0.5, 0.2, 0.1],
        "extents_m": [0.12, 0.12, 0.05],
        "top_z_m": 0.125,
        "bottom_z_m": 0.075,
        "fitted_shape": "cylinder",
        "open_top": True,
        "kind": "bowl",
        "yaw_deg": 0.0,
    }
    rim = session["grasp_options"](bowl)[0]
    assert rim["kind"] == "rim" and math.isclose(rim["z"], 0.095)  # 3 cm down the wall
    box = {"position_m": [0.5, 0.2, 0.0375], "extents_m": [0.2, 0.14, 0.075]}  # its top is the bowl's bottom
    beside = {"position_m": [0.5, 0.2 + 0.13, 0.1], "extents_m": [0.12, 0.12, 0.05]}
    assert session["clear_of"](rim, [box]) == 1.0  # nothing in the pads' way
    assert session["clear_of"](rim, [box, beside]) == session["clear_of"](rim, [beside]) < 0.1  # counted
    on_table = {**bowl, "center_m": [0.5, 0.2, 0.025], "top_z_m": 0.05, "bottom_z_m": 0.0}
    low = session["grasp_options"](on_table)[0]
    assert session["clear_of"](low, [box]) < 0  # a box as tall as the bowl beside it: in the pads' way
    # a bowl on a wooden cabinet: the cabinet's region takes in the bowl and reaches as high, but it stands under it
    cabinet = {"position_m": [0.45, 0.25, 0.06], "extents_m": [0.4, 0.3, 0.12]}
    assert session["clear_of"](rim, [cabinet]) == 1.0
    assert session["clear_of"](rim, [{**cabinet, "position_m": [0.45, 0.36, 0.06]}]) < 0  # beside it: in the way
    assert session["clear_of"](low, [cabinet]) < 0  # a tray round a bowl on the table: its walls are in the way


def test_a_closed_can_gets_grasps_across_its_body():
    """LIBERO's alphabet soup (7.1 cm across, 8 cm tall, its lid closed) reads as a 'cup': its rim grasps stop on
    the lid. Grasps across its body come after them, or first when the wrist camera saw the closed top from above;
    an open vessel gets none, nor a can too wide for the jaw's play."""
    session = _session()
    can = {
        "center_m": [0.48, -0.24, 0.04],
        "extents_m": [0.071, 0.071, 0.08],
        "top_z_m": 0.08,
        "bottom_z_m": 0.0,
        "fitted_shape": "cylinder",
        "open_top": False,
        "kind": "cup",
        "yaw_deg": 0.0,
    }
    kinds = [o["kind"] for o in session["grasp_options"](can)]
    assert kinds == ["rim"] * 12 + ["faces"] * 6  # two across it, then each turned 15 degrees either way
    above = session["grasp_options"](can, from_above=True)
    assert [o["kind"] for o in above] == ["faces"] * 6 + ["rim"] * 12
    assert {o["width"] for o in above if o["kind"] == "faces"} == {0.071}  # round: as wide whichever way
    assert above[0]["open"] == session["JAW_MAX"] and above[0]["width"] == 0.071 and above[0]["round"]
    assert math.isclose(above[0]["z"], 0.058)  # 2.2 cm below the lid
    cup = {**can, "open_top": True}
    assert {o["kind"] for o in session["grasp_options"](cup, from_above=True)} == {"rim"}
    wide = {**can, "extents_m": [0.076, 0.076, 0.08]}
    assert {o["kind"] for o in session["grasp_options"](wide, from_above=True)} == {"rim"}


def test_a_box_whose_hand_meets_a_neighbour_gets_grasps_slid_along_it_and_turned():
    """libero_object/1: the palm, 10.4 cm out along the jaw, came down on a can beside the cream cheese (8.0 x 4.2
    cm). After the grasps across its faces come the same grasp slid 2 cm along the box either way, then turned 15
    degrees either way (what the jaw must then span grows with the turn; too wide for it: left out)."""
    session = _session()
    box = {
        "center_m": [0.655, -0.097, 0.009],
        "extents_m": [0.080, 0.042, 0.018],
        "top_z_m": 0.018,
        "bottom_z_m": 0.0,
        "fitted_shape": "box",
        "open_top": False,
        "kind": "box",
        "yaw_deg": 0.0,
    }
    opts = session["grasp_options"](box)
    assert [(round(o["yaw"]), round(o["width"], 3)) for o in opts] == [
        (0, 0.042),
        (0, 0.042),
        (0, 0.042),
        (15, 0.062),  # 4.2 cm x cos 15 + 8 cm x sin 15
        (-15, 0.062),
    ]  # the 90-degree grasp (8 cm) does not fit the jaw with its play
    slid = [o["xy"] - np.array(box["center_m"][:2]) for o in opts[1:3]]
    np.testing.assert_allclose(np.abs([d[0] for d in slid]), [0.02, 0.02], atol=1e-9)  # along the box's length
    np.testing.assert_allclose([d[1] for d in slid], [0, 0], atol=1e-9)
    for o, d in zip(opts[1:3], slid, strict=True):
        np.testing.assert_allclose(o["to_center"], -d)  # released where the box's centre lands on the destination
    assert all(o["z"] == opts[0]["z"] and not o["across"] for o in opts)


def _session() -> dict:
    session: dict = {"robot": fake_robot()}
    for part in expert.HELPER_ORDER:
        exec(compile(expert.HELPERS[part], f"<{part}>", "exec"), session)
    return session


def test_the_drawer_of_a_cabinet_of_three_is_found_at_its_own_height():
    """LIBERO's wooden cabinet (22.3 cm tall) has three drawers, their handle bars at 4.1, 11.0 and 18.4 cm (its
    MJCF); the twin's cabinet has one, its bar at 66% of its height. A region in front of the face counts for the
    drawer whose band its top lies in: the middle drawer pulled out is not the top drawer's closed handle."""
    session = _session()
    cab = {"mid": [0.6, -0.1], "n": [0.0, 1.0], "t": [1.0, 0.0], "width": 0.23, "height": 0.223}
    for level, bar in (("bottom", 0.0411), ("middle", 0.1104), ("top", 0.1839)):
        assert abs(session["drawer_at"](cab, level)[0] - bar) < 0.005, level
    assert session["drawer_at"](cab)[:2] == (0.66 * 0.223, 0.49 * 0.223)  # one drawer: the twin's model, unchanged
    session["np"] = __import__("numpy")
    cab = {k: session["np"].array(v) if isinstance(v, list) else v for k, v in cab.items()}
    top_handle = {"detection_id": "det-1", "position_m": [0.6, -0.08, 0.184], "extents_m": [0.09, 0.02, 0.016]}
    middle_out = {"detection_id": "det-2", "position_m": [0.6, -0.02, 0.114], "extents_m": [0.22, 0.19, 0.065]}
    footprints = {
        "det-1": [[0.555, -0.09], [0.645, -0.09], [0.645, -0.07], [0.555, -0.07]],
        "det-2": [[0.49, -0.1], [0.71, -0.1], [0.71, 0.09], [0.49, 0.09]],
    }
    session["find"] = lambda text, camera="head": [top_handle, middle_out] if text == "brown drawer" else []
    session["geom"] = lambda det, dest=None: {"footprint_xy_m": footprints[det]}
    opening, parts = session["drawer_opening"](cab, "middle")
    assert parts == 1 and abs(opening - (0.19 - session["HANDLE_OUT"])) < 1e-9  # the drawer, not the top handle
    opening, parts = session["drawer_opening"](cab, "top")
    assert (opening, parts) == (0.0, 1)  # the closed top drawer's handle: shut


def test_a_stove_knob_is_the_narrow_end_of_the_stove_s_region_and_its_ridge_the_top_of_it():
    """LIBERO's flat stove reads as one region: a 19 cm square burner and, at one end, the knob (a 9 cm disc with a
    ridge 5 cm high across it). Hand-made depth points: the knob's axis, the ridge's top and its direction come from
    the narrow end of the region, the burner's centre from the rest."""
    import numpy as np

    rng = np.random.default_rng(0)
    burner = [[0.40 + x, 0.21 + y, 0.045, 0.045] for x, y in rng.uniform(-0.095, 0.095, (300, 2))]
    disc = [[0.25 + x, 0.21 + y, 0.01, 0.01] for x, y in rng.uniform(-0.03, 0.03, (60, 2)) if x * x + y * y < 9e-4]
    ridge = [
        [0.25 + x, 0.21 + y, 0.05, 0.05]
        for x, y in zip(rng.uniform(-0.05, 0.05, 60), rng.uniform(-0.01, 0.01, 60), strict=True)
    ]
    points = [{"point_m": p[:3], "height_above_table_m": p[3]} for p in burner + disc + ridge]
    points += [{"point_m": [0.3, -0.2, 0.0], "height_above_table_m": 0.0}] * 50  # the table round it
    det = {"detection_id": "det-1", "bbox_px": [300, 150, 430, 280], "observation_handle": "obs-1", "camera": "head"}
    region = {
        "center_m": [0.35, 0.21, 0.02],
        "extents_m": [0.29, 0.19, 0.05],
        "yaw_deg": 0.0,
        "top_z_m": 0.05,
        "bottom_z_m": 0.0,
    }
    session = _session()
    session["geom"] = lambda det, dest=None: region
    session["robot"] = SimpleNamespace(
        measure_image_points=lambda **kw: {"success": True, "value": {"points": points}},
    )
    knob = session["stove_knob"](det)
    assert np.linalg.norm(knob["center"] - [0.25, 0.21]) < 0.01
    assert abs(knob["ridge_deg"]) < 10 and abs(knob["top"] - 0.05) < 0.005
    assert np.linalg.norm(knob["burner"] - [0.40, 0.21]) < 0.03
    pedestal = {**det, "detection_id": "det-2", "extents_m": [0.36, 0.22, 0.015]}  # named "stove" by the library
    stove = {**det, "extents_m": [0.29, 0.19, 0.05]}
    session["find"] = lambda text, camera="head": {"stove": [pedestal], "grey": [stove]}.get(text, [])
    on, on_det = session["fixture_top"]("stove", pedestal, region)  # "put the bowl on the stove": on its burner
    assert np.linalg.norm(np.array(on["center_m"][:2]) - [0.40, 0.21]) < 0.03 and on["extents_m"][:2] == [0.19, 0.19]
    assert on_det is stove and session["find_stove"]("stove")[0] is stove
    assert session["fixture_top"]("plate", det, region) == (region, det)
    square = {**region, "center_m": [0.40, 0.21, 0.02], "extents_m": [0.19, 0.19, 0.05]}
    session["geom"] = lambda det, dest=None: square
    assert session["stove_knob"](det) is None  # a square region: a burner without a knob beside it


def test_a_cabinet_of_three_drawers_is_measured_from_its_top_face_and_its_handle_bar():
    """LIBERO's wooden cabinet reads as one region with the wine rack standing against it (a footprint 50 cm long
    for a 23 cm cabinet). Hand-made depth points: the top face gives the front face's centre and direction, the
    points 1.5-4.5 cm out from it the handle bar's height (gripped 5 mm off its centre, the bar jammed the drawer in
    its runners), and the points in front of the face at the drawer's height how far it is out."""
    import numpy as np

    rng = np.random.default_rng(1)
    top = [[x, y, 0.216] for x in np.linspace(0.57, 0.79, 23) for y in np.linspace(-0.35, -0.17, 19)]  # a depth grid
    rack = [
        [x, y, z]
        for x, y, z in zip(
            rng.uniform(0.30, 0.45, 80), rng.uniform(-0.33, -0.18, 80), rng.uniform(0.05, 0.30, 80), strict=True
        )
    ]
    bars = [
        [x, -0.166 + dy, z + dz]
        for z in (0.034, 0.1034, 0.177)
        for x, dy, dz in zip(
            rng.uniform(0.64, 0.72, 15), rng.uniform(0.019, 0.034, 15), rng.uniform(0.0, 0.008, 15), strict=True
        )
    ]
    points = [{"point_m": p, "height_above_table_m": p[2] + 0.007} for p in top + rack + bars]
    det = {
        "detection_id": "det-4",
        "bbox_px": [0, 180, 190, 420],
        "observation_handle": "obs-1",
        "camera": "head",
        "mask_pixels": 36000,
    }
    region = {
        "center_m": [0.555, -0.245, 0.11],
        "extents_m": [0.50, 0.22, 0.213],
        "yaw_deg": 0.3,
        "top_z_m": 0.29,  # the wine rack's top: the region's highest points
        "bottom_z_m": -0.007,
        "footprint_xy_m": [[0.3, -0.36], [0.81, -0.36], [0.81, -0.13], [0.3, -0.13]],
    }
    session = _session()
    session["find"] = lambda text, camera="head": [det] if text == "cabinet" else []
    session["geom"] = lambda d, dest=None: region
    session["robot"] = SimpleNamespace(
        measure_image_points=lambda **kw: {"success": True, "value": {"points": points}},
    )
    cab = session["cabinet"]("middle")
    assert np.linalg.norm(cab["mid"] - [0.68, -0.166]) < 0.015 and cab["n"] @ [0.0, 1.0] > 0.99
    assert abs(cab["width"] - 0.22) < 0.02 and abs(cab["height"] - 0.223) < 0.002
    cheese = {**det, "detection_id": "det-9", "mask_pixels": 900}  # a small box the library called "slide cabinet"
    session["find"] = lambda text, camera="head": [cheese, det] if text == "cabinet" else []
    top, top_det = session["fixture_top"]("cabinet", cheese, region)  # "put the bowl on top of the cabinet"
    assert top_det is det  # the largest region that has a top face: its top face
    assert abs(top["top_z_m"] - 0.216) < 0.003  # not the region's top, the wine rack's (0.29)
    assert np.linalg.norm(np.array(top["center_m"][:2]) - [0.68, -0.26]) < 0.015
    assert abs(top["extents_m"][0] - 0.22) < 0.02 and abs(top["extents_m"][1] - 0.18) < 0.02
    for level, bar in (("middle", 0.1034), ("top", 0.177)):
        assert abs(session["handle_height"](cab, session["drawer_at"](cab, level)[0]) - bar) < 0.004, level
    opening, _ = session["drawer_opening"](cab, "middle")
    assert opening is not None and opening < 0.01  # shut: only its handle stands out
    drawer = [
        [x, -0.166 + dy, 0.14] for x, dy in zip(rng.uniform(0.58, 0.78, 60), rng.uniform(0.0, 0.188, 60), strict=True)
    ]
    points += [{"point_m": p, "height_above_table_m": p[2] + 0.007} for p in drawer]
    opening, _ = session["drawer_opening"](session["cabinet"]("middle"), "middle")
    assert abs(opening - 0.15) < 0.01  # pulled out 15 cm; the cabinet kept as first measured
    assert session["cabinet"]() is not None and "det" not in session["cabinet"]()  # one drawer: the twin's way


def test_a_body_of_the_object_s_size_on_an_open_box_s_floor_is_seen_from_depth():
    """libero_object: an upright ketchup let go in the basket shows only its cap straight down, and no view names
    it. The depth inside the walls tells: points standing as high as the object on the floor; an empty basket, its
    walls, or the object beside the basket, do not count."""
    import numpy as np

    basket = {
        "center_m": [0.6, 0.26, 0.07],
        "extents_m": [0.17, 0.13, 0.14],
        "bottom_z_m": 0.0,
        "top_z_m": 0.14,
        "fitted_shape": "box",
        "yaw_deg": 0.0,
        "open_top": True,
        "kind": "box",
    }
    ketchup = (0.063, 0.033, 0.146)

    def scene(*bodies):
        """The wrist camera's 40 x 40 grid straight down: the basket's floor (0.8 cm up) and walls, the table, and
        boxes given as (x0, x1, y0, y1, top)."""
        points = []
        for x in np.linspace(0.45, 0.75, 40):
            for y in np.linspace(0.11, 0.41, 40):
                in_basket = abs(x - 0.6) <= 0.085 and abs(y - 0.26) <= 0.065
                wall = in_basket and (abs(x - 0.6) > 0.077 or abs(y - 0.26) > 0.057)
                z = 0.14 if wall else (0.008 if in_basket else 0.0)
                for x0, x1, y0, y1, top in bodies:
                    if x0 <= x <= x1 and y0 <= y <= y1:
                        z = top
                points.append({"point_m": [float(x), float(y), z]})
        return {"success": True, "value": {"points": points}}

    session: dict = {"robot": fake_robot()}
    for part in expert.HELPER_ORDER:
        exec(compile(expert.HELPERS[part], f"<{part}>", "exec"), session)
    for bodies, expected in [
        ([(0.57, 0.63, 0.245, 0.275, 0.008 + 0.146)], True),  # upright in it
        ([(0.57, 0.633, 0.24, 0.273, 0.008 + 0.033)], True),  # lying in it
        ([(0.57, 0.633, 0.24, 0.273, 0.008 + 0.012)], False),  # something flatter than it
        ([], False),  # empty
        ([(0.45, 0.51, 0.12, 0.15, 0.146)], False),  # standing beside it
        ([(0.58, 0.60, 0.25, 0.26, 0.008 + 0.146)], False),  # a corner of something: too few points
    ]:
        session["robot"].measure_image_points = lambda observation_handle, camera, points, b=bodies: scene(*b)
        ok, why = session["body_inside"]("obs-9", basket, ketchup)
        assert ok is expected, (bodies, why)
        assert "points inside its walls stand 2.3-16.6 cm above its floor (z 0.008 m)" in why
    session["robot"].measure_image_points = lambda **_: {"success": False, "value": None}  # no depth: not seen
    assert session["body_inside"]("obs-9", basket, ketchup) == (
        False,
        "from straight above, 0 points inside its walls: too few to tell",
    )
