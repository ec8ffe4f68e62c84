"""perception_node's message handling without DDS: image encodings and colour/depth pairing."""

import numpy as np
import pytest
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from captain_ros.harness.backend import BackendError
from captain_ros.ros.convert import image_msg, stamp_msg
from captain_ros.ros.perception_node import PerceptionNode, image_to_array


def test_image_encodings_round_trip():
    rgb = np.random.default_rng(0).integers(0, 255, (4, 5, 3), dtype=np.uint8)
    np.testing.assert_array_equal(image_to_array(image_msg(Header(), rgb, "rgb8")), rgb)
    np.testing.assert_array_equal(image_to_array(image_msg(Header(), rgb[..., ::-1].copy(), "bgr8")), rgb)
    depth = np.linspace(0.3, 2.0, 20, dtype=np.float32).reshape(4, 5)
    np.testing.assert_array_equal(image_to_array(image_msg(Header(), depth.astype("<f4"), "32FC1")), depth)
    mm = (depth * 1000).astype("<u2")
    np.testing.assert_allclose(image_to_array(image_msg(Header(), mm, "16UC1")), mm / 1000.0)
    with pytest.raises(BackendError, match="unsupported image encoding 'yuv422'"):
        image_to_array(Image(encoding="yuv422", height=1, width=1, step=2, data=b"\x00\x00"))


def _image(t_s: float) -> Image:
    return Image(header=Header(stamp=stamp_msg(t_s)))


def test_colour_and_depth_are_paired_by_stamp():
    colors = [_image(2.4), _image(2.2), _image(2.0)]  # newest first
    depths = [_image(2.2), _image(2.0)]  # the depth of 2.4 s has not arrived yet
    color, depth, t = PerceptionNode._pair("head", colors, depths)
    assert t == pytest.approx(2.2) and color is colors[1] and depth is depths[0]
    with pytest.raises(BackendError, match="no colour and depth image pair"):
        PerceptionNode._pair("head", [_image(3.0)], [_image(2.9)])
