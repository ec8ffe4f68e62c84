"""Cameras: RGB + metric depth with CameraInfo-convention intrinsics and optical-frame extrinsics."""

import numpy as np
import pytest

from captain_ros.twin.sim import Twin


@pytest.fixture(scope="module")
def scene():
    with Twin("put_red_cube_in_bowl") as twin:
        twin.reset("put_red_cube_in_bowl/official/0")
        yield twin, twin.observe()


def _project(frame, point):
    p = frame.rotation.T @ (point - frame.position_m)
    return frame.K[0, 0] * p[0] / p[2] + frame.K[0, 2], frame.K[1, 1] * p[1] / p[2] + frame.K[1, 2], p[2]


def test_images_have_the_promised_shapes_and_types(scene):
    _, frames = scene
    for frame in frames.values():
        assert frame.rgb.shape == (512, 512, 3) and frame.rgb.dtype == np.uint8
        assert frame.depth_m.shape == (512, 512) and frame.depth_m.dtype == np.float32
        assert frame.K[0, 2] == frame.K[1, 2] == 255.5  # pixel centres at integers, as CameraInfo


def test_a_known_point_projects_onto_its_object_with_its_depth(scene):
    twin, frames = scene
    head = frames["head"]
    top = twin.reader.position("red_cube") + [0.0, 0.0, 0.045]  # centre of the cube's top face
    u, v, z = _project(head, top)
    r, g, b = head.rgb[round(v), round(u)].astype(int)
    assert r > 120 and r > 2 * g and r > 2 * b, (r, g, b)
    assert head.depth_m[round(v), round(u)] == pytest.approx(z, abs=0.006)


def test_depth_back_projects_to_the_table_plane(scene):
    _, frames = scene
    head = frames["head"]
    # a table pixel away from objects: back-project and check z = 0 in the base frame
    v, u = 500, 20
    z = float(head.depth_m[v, u])
    ray = np.array([(u - head.K[0, 2]) / head.K[0, 0], (v - head.K[1, 2]) / head.K[1, 1], 1.0])
    point = head.position_m + head.rotation @ (ray * z)
    assert point[2] == pytest.approx(0.0, abs=0.003)
