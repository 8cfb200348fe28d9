"""Images named by URL in chat requests: data URLs, http(s) and allowed local files.

Every failure is a ValueError with a message for the client (the server answers 400):
a malformed data URL, an image format PIL cannot read, an image over the byte or pixel
limits, an unreachable URL, a file:// path outside --allowed-local-media-path. Bytes
are capped before decoding, and pixels before the pixel data is decoded, so a hostile
input costs at most the limits. Runs in the API process (off the event loop).
"""
from __future__ import annotations

import base64
import binascii
import io
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from vllm import envs


def _too_large(what: str) -> ValueError:
    return ValueError(f"The image {what} is too large: more than "
                      f"{envs.VLLM_MEDIA_MAX_BYTES} bytes (VLLM_MEDIA_MAX_BYTES).")


def _limit_bytes(data: bytes, what: str) -> bytes:
    if len(data) > envs.VLLM_MEDIA_MAX_BYTES:
        raise _too_large(what)
    return data


def decode_image(data: bytes) -> Any:
    """PIL image (RGB) of encoded image bytes; ValueError for what PIL cannot read or
    what exceeds the pixel limit."""
    from PIL import Image, UnidentifiedImageError
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as e:
        raise ValueError("Unsupported or corrupt image format: the bytes are not an image "
                         "this server can read (PNG, JPEG, GIF, BMP, WebP, ...).") from e
    except Image.DecompressionBombError as e:  # PIL's own cap, far above ours
        raise ValueError(f"The image is too large: {e}") from e
    width, height = image.size
    if width * height > envs.VLLM_MEDIA_MAX_PIXELS:
        raise ValueError(f"The image is too large: {width}x{height} pixels exceeds "
                         f"{envs.VLLM_MEDIA_MAX_PIXELS} (VLLM_MEDIA_MAX_PIXELS).")
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"Corrupt image data: {e}") from e
    return image.convert("RGB")


def load_data_url(url: str) -> Any:
    """`data:image/<fmt>;base64,<payload>`."""
    header, sep, payload = url[len("data:"):].partition(",")
    if not sep or ";base64" not in header:
        raise ValueError("Malformed data URL: expected 'data:image/<format>;base64,<data>'.")
    media_type = header.split(";")[0]
    if media_type and not media_type.startswith("image/"):
        raise ValueError(f"Unsupported media type {media_type!r} in a data URL: only image/* "
                         "is accepted.")
    if len(payload) > envs.VLLM_MEDIA_MAX_BYTES * 4 // 3 + 4:
        raise _too_large("in the data URL")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError("Malformed data URL: its payload is not valid base64.") from e
    return decode_image(_limit_bytes(data, "in the data URL"))


def load_http_url(url: str) -> Any:
    """GET `url` within VLLM_IMAGE_FETCH_TIMEOUT, at most VLLM_MEDIA_MAX_BYTES read."""
    limit = envs.VLLM_MEDIA_MAX_BYTES
    request = urllib.request.Request(url, headers={"User-Agent": "vllm"})
    try:
        with urllib.request.urlopen(request, timeout=envs.VLLM_IMAGE_FETCH_TIMEOUT) as resp:
            data = resp.read(limit + 1)
    except urllib.error.HTTPError as e:
        raise ValueError(f"Could not fetch the image URL {url!r}: HTTP {e.code}.") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ValueError(f"Could not fetch the image URL {url!r}: {reason}.") from e
    return decode_image(_limit_bytes(data, f"at {url!r}"))


def load_file_url(url: str, allowed_local_media_path: str) -> Any:
    """`file://<path>`, only inside --allowed-local-media-path (symlinks resolved)."""
    if not allowed_local_media_path:
        raise ValueError("file:// image URLs are refused: the server was not started with "
                         "--allowed-local-media-path.")
    path = os.path.realpath(urllib.parse.unquote(urllib.parse.urlparse(url).path))
    root = os.path.realpath(allowed_local_media_path)
    if os.path.commonpath([path, root]) != root:
        raise ValueError(f"The file {url!r} is outside the allowed local media path.")
    try:
        if os.path.getsize(path) > envs.VLLM_MEDIA_MAX_BYTES:
            raise _too_large(f"file {url!r}")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"Could not read the image file {url!r}: {e.strerror}.") from e
    return decode_image(data)


def load_image_url(url: str, allowed_local_media_path: str = "") -> Any:
    """The PIL image an image_url names (see the module docstring)."""
    if not isinstance(url, str) or not url:
        raise ValueError("image_url.url must be a non-empty string.")
    scheme = url.split(":", 1)[0].lower()
    if scheme == "data":
        return load_data_url(url)
    if scheme in ("http", "https"):
        return load_http_url(url)
    if scheme == "file":
        return load_file_url(url, allowed_local_media_path)
    raise ValueError(f"Unsupported image URL scheme {scheme!r}: use data:, http(s): or "
                     "file: (with --allowed-local-media-path).")
