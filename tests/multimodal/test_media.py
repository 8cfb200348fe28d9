"""Image loading from URLs (vllm/multimodal/media.py): limits and errors, no server."""
from __future__ import annotations

import base64
import io

import pytest

from tests.multimodal.conftest import random_image
from vllm.multimodal.media import load_image_url


def _png_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_data_url_round_trip_and_pixel_limit(monkeypatch):
    image = random_image(7, 20, 10)
    loaded = load_image_url(_png_url(image))
    assert loaded.size == (20, 10) and loaded.tobytes() == image.tobytes()
    monkeypatch.setenv("VLLM_MEDIA_MAX_PIXELS", "100")
    with pytest.raises(ValueError, match="too large: 20x10 pixels"):
        load_image_url(_png_url(image))


@pytest.mark.parametrize("url,match", [
    ("data:text/plain;base64,aGk=", "Unsupported media type"),
    ("data:image/png,rawbytes", "Malformed data URL"),
    ("ftp://host/x.png", "Unsupported image URL scheme 'ftp'"),
    ("file:///etc/hostname", "--allowed-local-media-path"),
])
def test_refusals(url, match):
    with pytest.raises(ValueError, match=match):
        load_image_url(url)


def test_file_url_symlink_escape_is_refused(tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    outside = tmp_path / "secret.png"
    outside.write_bytes(b"x")
    (allowed / "link.png").symlink_to(outside)
    with pytest.raises(ValueError, match="outside the allowed"):
        load_image_url(f"file://{allowed}/link.png", str(allowed))
