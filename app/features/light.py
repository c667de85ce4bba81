"""Light activity signals the aligner needs, cheap enough for every event.

image: luminance and change from the previous frame of the same stream;
audio: RMS energy per 50 ms hop; text: tokens (jieba for Chinese) and caption
presence. Model-based features build on these (see ``app/features/``).
"""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from app.errors import InvalidInputError
from app.lru import LRU
from schemas.codec import pack_array
from schemas.events import AudioChunk, FrameEvent, TextEvent

__all__ = [
    "AUDIO_HOP_US",
    "THUMB",
    "check_pixels",
    "ImageSignals",
    "audio_signals",
    "decode_gray_thumb",
    "decode_resized",
    "pcm_to_mono",
    "text_signals",
    "tokenize",
]

#: Side of the grey thumbnail used for change detection, pixels.
THUMB = 16
#: Audio energy hop: 50 ms, i.e. the 20 Hz default grid.
AUDIO_HOP_US = 50_000
#: Largest decoded image we accept, pixels (a decompression bomb guard: 40 MP
#: is above 8K video).
MAX_PIXELS = 40_000_000
#: Streams whose previous thumbnail we remember per worker.
_MAX_STREAMS = 4096

Image.MAX_IMAGE_PIXELS = MAX_PIXELS


def check_pixels(w: int, h: int) -> None:
    if w * h > MAX_PIXELS:
        raise InvalidInputError("bad_image", f"{w}x{h} exceeds {MAX_PIXELS} pixels")


def decode_resized(data: bytes, fmt: str | None, side: int, mode: str,
                   draft_side: int) -> Image.Image:
    """Decode a JPEG or PNG to a ``side`` x ``side`` PIL image in ``mode`` ("L" or "RGB").

    JPEG uses libjpeg-turbo's DCT scaling (simplejpeg ``min_*``), which decodes a
    1080p frame at 1/8 size for a fraction of a full decode; PNG gets PIL's
    ``draft`` at ``draft_side``. Any failure is ``bad_image``.
    """
    try:
        if fmt == "jpeg":
            h, w, _, _ = simplejpeg.decode_jpeg_header(data)
            check_pixels(w, h)
            arr = simplejpeg.decode_jpeg(data, colorspace="GRAY" if mode == "L" else "RGB",
                                         fastdct=True, fastupsample=True, min_height=side,
                                         min_width=side)
            img = Image.fromarray(arr[:, :, 0] if mode == "L" else arr)
        else:
            img = Image.open(io.BytesIO(data))
            check_pixels(img.width, img.height)
            img.draft(mode, (draft_side, draft_side))
            img = img.convert(mode)
        return img.resize((side, side), Image.Resampling.BILINEAR)
    except InvalidInputError:
        raise
    except (ValueError, OSError, UnidentifiedImageError, Image.DecompressionBombError) as exc:
        # simplejpeg raises ValueError on corrupt data; PIL raises OSError subclasses.
        raise InvalidInputError("bad_image", f"cannot decode {fmt or 'image'}: {exc}") from None


def decode_gray_thumb(data: bytes, fmt: str | None) -> np.ndarray:
    """Decode a JPEG or PNG into a THUMB x THUMB float32 grey image in 0..1."""
    small = decode_resized(data, fmt, THUMB, "L", THUMB * 4)
    return np.asarray(small, dtype=np.float32) / 255.0


class ImageSignals:
    """Luminance and change; remembers each stream's previous thumbnail (bounded LRU)."""

    def __init__(self, max_streams: int = _MAX_STREAMS) -> None:
        self._prev: LRU[str, np.ndarray] = LRU(max_streams)

    def __call__(self, ev: FrameEvent, thumb: np.ndarray | None = None) -> dict[str, Any]:
        if thumb is None:
            thumb = decode_gray_thumb(ev.data, ev.fmt)
        prev = self._prev.get(ev.stream_id)
        change = 0.0 if prev is None else float(np.mean(np.abs(thumb - prev)))
        self._prev.put(ev.stream_id, thumb)
        return {"luma": float(thumb.mean()), "change": change}


def pcm_to_mono(data: bytes, ch: int) -> np.ndarray:
    """Interleaved s16le PCM to mono float32 in -1..1."""
    x = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    if ch > 1:
        x = x.reshape(-1, ch).mean(axis=1)
    return x


def audio_signals(ev: AudioChunk, mono: np.ndarray | None = None) -> dict[str, Any]:
    """RMS energy per 50 ms hop (the last hop may be shorter)."""
    x = pcm_to_mono(ev.data, ev.ch) if mono is None else mono
    hop = max(1, ev.sr * AUDIO_HOP_US // 1_000_000)
    n = -(-len(x) // hop)
    padded = np.zeros(n * hop, dtype=np.float32)
    padded[: len(x)] = x
    frames = padded.reshape(n, hop)
    counts = np.full(n, hop, dtype=np.float32)
    counts[-1] = len(x) - (n - 1) * hop
    rms = np.sqrt((frames**2).sum(axis=1) / counts).astype(np.float32)
    return {"rms": pack_array(rms), "hop_us": AUDIO_HOP_US}


_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_WORD = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """jieba for text with Chinese characters, a Unicode word split otherwise."""
    if _CJK.search(text):
        import jieba  # loaded lazily: 1.4 s the first time (docs/broker.md)

        return [t for t in jieba.lcut(text) if t.strip() and not _is_punct(t)]
    return [w.lower() for w in _WORD.findall(text)]


def _is_punct(tok: str) -> bool:
    return not any(c.isalnum() for c in tok)


def text_signals(ev: TextEvent) -> dict[str, Any]:
    return {"tokens": tokenize(ev.text), "caption": 1.0 if ev.text.strip() else 0.0}
