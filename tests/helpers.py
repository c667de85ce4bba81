"""Small real inputs made on the spot (no fixtures files)."""

from __future__ import annotations

import io

import numpy as np
import simplejpeg
from PIL import Image


def jpeg_bytes(level: int = 128, w: int = 32, h: int = 24) -> bytes:
    return simplejpeg.encode_jpeg(np.full((h, w, 3), level, np.uint8))


def png_bytes(level: int = 64, w: int = 20, h: int = 10) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w), level, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()
