"""HTTP clients for external perception models, where one is deployed (SAM-style text-prompted
segmentation, a pointing VLM). The protocol is plain JSON over POST:

  POST <segment_url>  {"text": "red cube", "image_png_b64": "<PNG of the RGB image>"}
       -> {"masks": [{"mask_png_b64": "<PNG, 0 = background, non-zero = object>", "score": 0.93}, ...]}
  POST <pointing_url> {"text": "red cube", "image_png_b64": "..."}
       -> {"points": [{"u": 0.41, "v": 0.63, "score": 0.88}, ...]}   (u, v: fractions of width, height)

Any transport error, timeout, non-200 answer or malformed reply becomes a backend_error naming the
server and what was wrong; a well-formed empty answer is not_found."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import cv2
import numpy as np

from captain_ros.core.contract import FailureCategory
from captain_ros.perception.observation import PerceptionError


def _png_b64(image: np.ndarray) -> str:
    ok, data = cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR) if image.ndim == 3 else image)
    if not ok:
        raise PerceptionError(FailureCategory.BACKEND_ERROR, "could not encode the image as PNG")
    return base64.b64encode(data.tobytes()).decode("ascii")


def _post(url: str, payload: dict, timeout_s: float) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise PerceptionError(FailureCategory.BACKEND_ERROR, f"{url} answered HTTP {exc.code}: {exc.reason}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PerceptionError(FailureCategory.BACKEND_ERROR, f"{url} is unreachable: {reason}") from None
    except ValueError as exc:
        raise PerceptionError(FailureCategory.BACKEND_ERROR, f"{url} sent invalid JSON: {exc}") from None


class HttpSegmenter:
    name = "http"

    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url, self.timeout_s = url, timeout_s

    def masks(self, rgb: np.ndarray, text: str) -> list[tuple[float, np.ndarray]]:
        reply = _post(self.url, {"text": text, "image_png_b64": _png_b64(rgb)}, self.timeout_s)
        out = []
        try:
            for i, item in enumerate(reply["masks"]):
                raw = np.frombuffer(base64.b64decode(item["mask_png_b64"]), dtype=np.uint8)
                mask = cv2.imdecode(raw, cv2.IMREAD_GRAYSCALE)
                if mask is None or mask.shape != rgb.shape[:2]:
                    raise ValueError(f"mask {i} is not a PNG of the image's size {rgb.shape[1]}x{rgb.shape[0]}")
                out.append((float(item.get("score", 1.0)), mask > 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise PerceptionError(FailureCategory.BACKEND_ERROR, f"{self.url} sent a malformed reply: {exc}") from None
        return sorted(out, key=lambda item: -item[0])


class HttpPointer:
    name = "http"

    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url, self.timeout_s = url, timeout_s

    def points(self, rgb: np.ndarray, text: str) -> list[tuple[float, float, float]]:
        """(score, u, v) best first; u, v fractions of width and height."""
        reply = _post(self.url, {"text": text, "image_png_b64": _png_b64(rgb)}, self.timeout_s)
        try:
            out = [(float(p.get("score", 1.0)), float(p["u"]), float(p["v"])) for p in reply["points"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise PerceptionError(FailureCategory.BACKEND_ERROR, f"{self.url} sent a malformed reply: {exc}") from None
        if any(not (0.0 <= u <= 1.0 and 0.0 <= v <= 1.0) for _, u, v in out):
            raise PerceptionError(FailureCategory.BACKEND_ERROR, f"{self.url} sent points outside the image")
        return sorted(out, key=lambda item: -item[0])
