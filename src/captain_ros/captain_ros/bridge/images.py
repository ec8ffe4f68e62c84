"""Images in chat messages stored once: base64 `image_url` parts become `image_ref` parts whose bytes are
stored as blobs by SHA-256 (captain_ros.bridge.store restores them); a part is replaced only if restoring it
reproduces it exactly, else it stays inline.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import Any

from captain_ros.bridge.schema import sha256
from captain_ros.bridge.store import IMAGE_REF

_MEDIA_TYPE = re.compile(r"[A-Za-z0-9.+-]+/[A-Za-z0-9.+-]+\Z")


def split_images(
    messages: list, stored_media_type: Callable[[str], str | None] = lambda _digest: None
) -> tuple[list, dict[str, tuple[bytes, str]]]:
    """The messages with every base64 `image_url` part replaced by an `image_ref` part, and the images
    {sha256: (bytes, media_type)}. A part is replaced only if EpisodeReader.restore_messages gives it back
    exactly (same data URL, same other image_url keys, no other part keys); otherwise it stays inline. The
    reader restores an image with its blob's media type, so bytes already stored (`stored_media_type`) or seen
    in this request under another media type stay inline too."""
    blobs: dict[str, tuple[bytes, str]] = {}
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in content:
            ref = _image_ref(part, blobs, stored_media_type)
            parts.append(part if ref is None else ref)
        out.append({**message, "content": parts})
    return out, blobs


def _image_ref(
    part: Any, blobs: dict[str, tuple[bytes, str]], stored_media_type: Callable[[str], str | None]
) -> dict | None:
    if not isinstance(part, dict) or part.get("type") != "image_url" or set(part) != {"type", "image_url"}:
        return None
    image = part["image_url"]
    url = image.get("url") if isinstance(image, dict) else None
    head, sep, text = url.partition(";base64,") if isinstance(url, str) and url.startswith("data:") else ("", "", "")
    media_type = head.removeprefix("data:")
    if not sep or not _MEDIA_TYPE.match(media_type):
        return None
    try:
        data = base64.b64decode(text)  # lenient; the re-encoding below must give `text` back exactly
    except (binascii.Error, ValueError):
        return None
    extra = {k: v for k, v in image.items() if k != "url"}
    restored = {
        "type": "image_url",
        "image_url": {"url": f"data:{media_type};base64,{base64.b64encode(data).decode()}", **extra},
    }
    if restored != part:  # not the canonical encoding: keep it inline rather than store something else
        return None
    digest = sha256(data)
    known = blobs[digest][1] if digest in blobs else stored_media_type(digest)
    if known is not None and known != media_type:
        return None
    blobs[digest] = (data, media_type)
    ref: dict[str, Any] = {"type": IMAGE_REF, "sha256": digest, "media_type": media_type}
    if extra:
        ref["extra"] = extra
    return ref
