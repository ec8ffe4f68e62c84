"""The HTTP segmentation and pointing clients against a local stand-in server (the built-in
segmenter is the real component tested beside it). The stand-in answers from the image it is sent:
red pixels for any text, so the client's decoding, depth backing and errors are what is tested."""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cv2
import numpy as np
import pytest

from captain_ros.core.config import load_config
from captain_ros.core.contract import FailureCategory
from captain_ros.harness.harness import Harness
from captain_ros.harness.twin_backend import TwinBackend

MODE = {"value": "ok"}


def _red(image_b64: str) -> np.ndarray:
    bgr = cv2.imdecode(np.frombuffer(base64.b64decode(image_b64), np.uint8), cv2.IMREAD_COLOR)
    hsv = cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV)
    return ((hsv[..., 0] < 8) | (hsv[..., 0] > 165)) & (hsv[..., 1] > 120) & (hsv[..., 2] > 60)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = MODE["value"]
        if mode == "500":
            self.send_error(500, "model crashed")
            return
        red = _red(body["image_png_b64"])
        if self.path == "/segment":
            if mode == "empty":
                reply = {"masks": []}
            else:
                mask = red if mode != "small" else red[:100]
                _, png = cv2.imencode(".png", mask.astype(np.uint8) * 255)
                reply = {"masks": [{"mask_png_b64": base64.b64encode(png.tobytes()).decode(), "score": 0.9}]}
        else:
            v, u = np.nonzero(red)
            reply = {"points": [{"u": u.mean() / (red.shape[1] - 1), "v": v.mean() / (red.shape[0] - 1), "score": 0.8}]}
        data = b"{not json" if mode == "garbage" else json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def remote(server, twin, kinematics):
    MODE["value"] = "ok"
    base = load_config()
    config = replace(
        base,
        perception=replace(
            base.perception, segmenter="http", segment_url=f"{server}/segment", pointing_url=f"{server}/point"
        ),
    )
    harness = Harness(TwinBackend(twin), config, kinematics)
    assert harness.call("observe", cameras=["head"]).success
    return harness


def test_remote_segmenter_and_pointer_give_depth_backed_detections(remote, twin):
    seg = remote.call("segment", text="red cube")
    assert seg.success, seg.message
    center = twin.reader.position("red_cube") + [0, 0, 0.0225]
    np.testing.assert_allclose(seg.value["detections"][0]["position_m"], center, atol=0.005)
    point = remote.call("point", text="red cube")
    assert point.success and "pointing model" in point.value["source"]
    np.testing.assert_allclose(point.value["position_m"], center, atol=0.005)


@pytest.mark.parametrize(
    ("mode", "category", "words"),
    [
        ("500", FailureCategory.BACKEND_ERROR, "HTTP 500"),
        ("garbage", FailureCategory.BACKEND_ERROR, "invalid JSON"),
        ("small", FailureCategory.BACKEND_ERROR, "image's size"),
        ("empty", FailureCategory.NOT_FOUND, "0 mask(s)"),
    ],
)
def test_remote_failures_are_reported(remote, mode, category, words):
    MODE["value"] = mode
    result = remote.call("segment", text="red cube")
    assert result.failure_category is category and words in result.message


def test_unreachable_server(twin, kinematics):
    base = load_config()
    config = replace(
        base, perception=replace(base.perception, segmenter="http", segment_url="http://127.0.0.1:9/segment")
    )
    harness = Harness(TwinBackend(twin), config, kinematics)
    harness.call("observe", cameras=["head"])
    result = harness.call("segment", text="red cube")
    assert result.failure_category is FailureCategory.BACKEND_ERROR and "unreachable" in result.message
