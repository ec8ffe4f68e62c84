"""The appearance library: models rendered alone from their MJCF files, queries that name them, regions picked by
their look; and the harness's segment() using it on the twin (LIBERO's own objects: tests/captain_ros/libero)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from captain_ros.perception.appearance import (
    HIST_BINS,
    AppearanceLibrary,
    build_library,
    head_noun,
    histogram,
    renderable,
    words,
)

RED_CAN = """<mujoco model="can">
  <compiler texturedir="textures"/>
  <asset>
    <texture name="label" file="label.png" type="2d"/>
    <texture name="label" file="label.png" type="2d"/>
    <material name="label" texture="label"/>
  </asset>
  <worldbody>
    <body name="object">
      <joint name="lid" type="hinge"/>
      <geom type="cylinder" size="0.03 0.05" material="label" group="1" contype="0" conaffinity="0"/>
      <geom type="box" size="0.03 0.03 0.05" group="0" rgba="0.8 0.8 0.8 0.3"/>
    </body>
  </worldbody>
</mujoco>"""
BLUE_BLOCK = """<mujoco model="block">
  <worldbody><body name="object"><freejoint/>
    <geom type="box" size="0.03 0.03 0.03" rgba="0.1 0.25 0.9 1" group="1"/>
  </body></worldbody>
</mujoco>"""


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    (root / "can" / "textures").mkdir(parents=True)
    label = np.zeros((32, 32, 3), np.uint8)
    label[:] = (30, 30, 210)  # BGR: red
    cv2.imwrite(str(root / "can" / "textures" / "label.png"), label)
    (root / "can" / "tomato_cans.xml").write_text(RED_CAN)
    (root / "sky_block.xml").write_text(BLUE_BLOCK)
    return {"tomato_cans": root / "can" / "tomato_cans.xml", "sky_block": root / "sky_block.xml"}


@pytest.fixture(scope="module")
def library(models) -> AppearanceLibrary:
    return build_library(models, source="test models", progress=False)


def test_an_asset_is_made_loadable_on_its_own(models):
    text = renderable(models["tomato_cans"])
    assert str(models["tomato_cans"].parent / "textures" / "label.png") in text  # absolute, from texturedir
    assert "<joint" not in text and text.count('name="label"') == 2  # one texture and its material
    assert "<freejoint" not in renderable(models["sky_block"])


def test_the_library_renders_each_model_and_survives_a_round_trip(library, models, tmp_path):
    assert library.names == ("sky_block", "tomato_cans")
    assert library.histograms.shape == (2, int(np.prod(HIST_BINS)))
    np.testing.assert_allclose(library.histograms.sum(axis=1), 1.0)
    path = tmp_path / "lib.npz"
    library.save(path)
    again = AppearanceLibrary.load(path)
    assert again.names == library.names and again.source == "test models"
    np.testing.assert_array_equal(again.histograms, library.histograms)
    stale = tmp_path / "stale.npz"  # made by code that compared other histograms
    np.savez_compressed(stale, names=np.array(library.names), histograms=library.histograms, source=np.array("x"))
    with pytest.raises(ValueError, match=r"holds unknown histograms.*build it again"):
        AppearanceLibrary.load(stale)
    with pytest.raises(ValueError, match="histograms of"):
        AppearanceLibrary(library.names, library.histograms[:1], "x")
    broken = dict(models, missing=tmp_path / "nowhere.xml")
    assert build_library(broken, source="test", progress=False).names == library.names  # left out, said


def test_queries_name_models_by_their_words_without_other_colours():
    names = ("akita_black_bowl", "red_akita_black_bowl", "cookies", "alphabet_soup", "red_alphabet_soup")
    lib = AppearanceLibrary(names, np.full((5, int(np.prod(HIST_BINS))), 1.0 / np.prod(HIST_BINS)), "names only")
    assert [lib.names[i] for i in lib.models_for("the black bowl")] == ["akita_black_bowl"]
    assert [lib.names[i] for i in lib.models_for("a box of cookies")] == ["cookies"]  # half the words, plural folded
    assert [lib.names[i] for i in lib.models_for("red alphabet soup")] == ["red_alphabet_soup"]
    assert lib.models_for("purple elephant") == [] and lib.models_for("the") == []
    assert words("Cookies, 2 of them!") == {"cookie", "them"}
    # libero_goal's "the bowl": the bowls, not the bowl drainer (no colour word, so it alone passed the colour rule
    # and the black bowl was never looked for)
    names = ("akita_black_bowl", "bowl_drainer", "white_bowl", "wooden_cabinet", "wooden_cabinet_base", "flat_stove")
    lib = AppearanceLibrary(names, np.full((6, int(np.prod(HIST_BINS))), 1.0 / np.prod(HIST_BINS)), "names only")
    assert [lib.names[i] for i in lib.models_for("the bowl")] == ["akita_black_bowl", "white_bowl"]
    assert [lib.names[i] for i in lib.models_for("bowl drainer")] == ["bowl_drainer"]
    assert [lib.names[i] for i in lib.models_for("the cabinet")] == ["wooden_cabinet"]
    names = ("cookies", "white_storage_box", "yellow_cookies")  # libero_spatial's "cookie box" is the cookies
    lib = AppearanceLibrary(names, np.full((3, int(np.prod(HIST_BINS))), 1.0 / np.prod(HIST_BINS)), "names only")
    assert [lib.names[i] for i in lib.models_for("the cookie box")] == ["cookies"]
    assert head_noun("the bowls on it") == "bowl" and head_noun("") == ""


def test_a_query_picks_the_region_that_looks_like_its_model(library):
    rgb = np.full((60, 90, 3), 200, np.uint8)
    rgb[10:50, 5:40] = (190, 25, 25)  # a red thing
    rgb[10:50, 50:85] = (25, 60, 200)  # a blue thing
    red, blue = np.zeros((60, 90), bool), np.zeros((60, 90), bool)
    red[10:50, 5:40], blue[10:50, 50:85] = True, True
    (score, mask, name), *rest = library.find(rgb, [blue, red], "tomato can")
    assert mask is red and name == "tomato cans" and 0 < score <= 1 and rest == []  # the blue one is too far
    assert library.find(rgb, [blue, red], "sky block")[0][1] is blue
    with pytest.raises(KeyError):
        library.find(rgb, [blue, red], "toaster")
    assert histogram(rgb, red).argmax() != histogram(rgb, blue).argmax()


def test_a_thing_merged_with_its_container_in_depth_is_found_as_a_part_of_the_region(library):
    """A blue block inside a red tin is one depth region that looks like the tin: the block is the part of it whose
    colours the block's model explains better; a query whose whole region matches gets no parts."""
    rgb = np.full((60, 90, 3), 200, np.uint8)
    rgb[5:55, 5:85] = (190, 25, 25)  # the tin
    rgb[20:40, 30:50] = (25, 60, 200)  # the block inside it
    region = np.zeros((60, 90), bool)
    region[5:55, 5:85] = True
    ((_, whole, name),) = library.find(rgb, [region], "tomato cans")
    assert whole is region and name == "tomato cans"  # the whole region answers its own model
    ((_, part, name),) = library.find(rgb, [region], "sky block")
    assert name == "sky block" and part.sum() == 20 * 20 and part[20:40, 30:50].all()
    rgb[20:40, 30:50] = (190, 25, 25)  # no block: no part looks like one
    assert library.find(rgb, [region], "sky block") == []


def test_a_container_is_searched_for_the_thing_even_when_a_look_alike_stands_elsewhere():
    """Something put in a basket is there even when a region elsewhere also looks like it: the parts of regions
    that look like a container (CONTAINER_WORDS) follow the whole regions that match; a region that looks like
    something else (not a container) is not searched once a whole region matches."""
    rgb = np.full((60, 150, 3), 200, np.uint8)
    patches = {"sky_block": (25, 60, 200), "red_basket": (190, 25, 25), "green_can": (30, 170, 40)}
    names = tuple(patches)
    hist = []
    for colour in patches.values():
        swatch = np.zeros((8, 8, 3), np.uint8)
        swatch[:] = colour
        hist.append(histogram(swatch, np.ones((8, 8), bool)))
    lib = AppearanceLibrary(names, np.array(hist), "colour swatches")
    look_alike, host = np.zeros((60, 150), bool), np.zeros((60, 150), bool)
    look_alike[10:30, 5:25] = True
    rgb[look_alike] = patches["sky_block"]
    host[5:55, 40:100] = True
    rgb[host] = patches["red_basket"]
    rgb[20:40, 60:80] = patches["sky_block"]  # the block in the basket
    (_, first, _), (_, second, name) = lib.find(rgb, [look_alike, host], "sky block")
    assert first is look_alike and name == "sky block" and second.sum() == 400 and second[20:40, 60:80].all()
    rgb[host] = patches["green_can"]  # the same, in something that is not a container
    rgb[20:40, 60:80] = patches["sky_block"]
    assert [m is look_alike for _, m, _ in lib.find(rgb, [look_alike, host], "sky block")] == [True]


def test_the_pieces_of_a_print_in_a_container_are_joined_when_no_piece_alone_looks_like_the_thing():
    """A two-colour carton in a basket, its halves split by a stripe of the basket's colour: neither half alone looks
    like the carton (the blue half looks like the blue can, the yellow one like the sticker), the two joined do."""
    colours = {"blue": (25, 60, 200), "yellow": (230, 200, 30), "red": (190, 25, 25)}

    def hist(*names):
        swatch = np.zeros((8, 8 * len(names), 3), np.uint8)
        for i, name in enumerate(names):
            swatch[:, 8 * i : 8 * (i + 1)] = colours[name]
        return histogram(swatch, np.ones(swatch.shape[:2], bool))

    names = ("juice_carton", "blue_can", "yellow_sticker", "red_basket")
    lib = AppearanceLibrary(names, np.array([hist("blue", "yellow"), hist("blue"), hist("yellow"), hist("red")]), "x")
    rgb = np.zeros((60, 90, 3), np.uint8)
    host = np.zeros((60, 90), bool)
    host[5:55, 5:85] = True
    rgb[host] = colours["red"]
    rgb[15:45, 25:40], rgb[15:45, 43:58] = colours["blue"], colours["yellow"]  # a 3 px stripe of red between
    ((_, part, name),) = lib.find(rgb, [host], "juice carton")
    assert name == "juice carton" and part[15:45, 25:58].all() and part.sum() == 30 * 33


def test_a_bowl_on_a_fixture_as_dark_as_it_is_found_as_the_fixtures_raised_part():
    """A black bowl on a black stove (LIBERO spatial): one depth region, and by colour the whole looks like the
    stove. With its cloud, what stands more than RAISED_M above the region's flat top is judged alone: it looks like
    the bowl and stands in for the region; a query for the stove still gets the whole region, and a region smaller
    than a fixture is never split."""
    colours = {"b": (20, 20, 22), "w": (215, 215, 215)}

    def hist(pattern):
        swatch = np.array([[colours[c] for c in pattern]] * 4, np.uint8)
        return histogram(swatch, np.ones(swatch.shape[:2], bool))

    lib = AppearanceLibrary(("black_bowl", "flat_stove"), np.array([hist("bbw"), hist("b")]), "swatches")
    h, w = 50, 60
    rgb = np.zeros((h, w, 3), np.uint8)
    rgb[:] = colours["b"]
    region = np.ones((h, w), bool)
    rows, cols = np.mgrid[0:h, 0:w]
    heights = np.where(rows < 30, 0.25, 0.25 * (h - rows) / (h - 30))  # a flat top, then the front face down
    bowl = (rows >= 5) & (rows < 20) & (cols >= 20) & (cols < 35)
    heights = np.where(bowl, 0.27 + 0.002 * (rows - 5), heights)
    rgb[bowl & (cols % 3 == 0)] = colours["w"]  # its print: a third of it white
    points = np.stack([0.3 + cols * 0.01, -0.2 + rows * 0.005, heights], axis=-1)  # 60 cm wide, 25 cm deep

    class Cloud:  # what raised_parts reads of a CameraCloud
        pass

    cloud = Cloud()
    cloud.points, cloud.height_m = points, heights
    ((_, part, name),) = lib.find(rgb, [region], "black bowl", cloud)
    assert name == "black bowl" and not (part & ~bowl).any() and part.sum() >= 0.9 * bowl.sum()  # its foot is lost
    assert all((m & ~bowl).any() or m.sum() < 0.5 * bowl.sum() for _, m, _ in lib.find(rgb, [region], "black bowl"))
    ((_, whole, name),) = lib.find(rgb, [region], "flat stove", cloud)
    assert whole is region and name == "flat stove"
    cloud.points = np.stack([0.3 + cols * 0.002, -0.2 + rows * 0.002, heights], axis=-1)  # 12 cm: no fixture
    assert all(
        (m & ~bowl).any() or m.sum() < 0.5 * bowl.sum() for _, m, _ in lib.find(rgb, [region], "black bowl", cloud)
    )


def test_segment_names_twin_objects_by_their_look_and_falls_back_for_other_names(harness, library):
    """On the twin: the red cube looks like the red 'tomato cans' model, so segment('tomato cans') finds it, measured
    from depth like any detection; a name the library does not know goes to the colour/shape segmenter."""
    harness.perception.appearance = library
    assert harness.call("observe").success
    found = harness.call("segment", text="tomato cans")
    assert found.success, found.message
    best = found.value["detections"][0]
    cube = harness.backend.twin.reader.position("red_cube")  # the test knows; the policy looked
    assert np.linalg.norm(np.array(best["position_m"][:2]) - cube[:2]) < 0.03 and best["named"] == "tomato cans"
    assert "tomato cans" in found.receipt
    bowl = harness.call("segment", text="black bowl")  # not in the library: colour and shape
    assert bowl.success and bowl.value["detections"][0]["named"] == "black bowl"
