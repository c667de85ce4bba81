"""Small real inputs made on the spot (no fixture files), shared by the test modules."""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageDraw, ImageFont

from app.consumed import RawMsg
from app.features.audio import SR
from schemas.events import AudioChunk, FrameEvent, encode_event


def jpeg_bytes(level: int = 128, w: int = 32, h: int = 24) -> bytes:
    return simplejpeg.encode_jpeg(np.full((h, w, 3), level, np.uint8))


def png_bytes(level: int = 64, w: int = 20, h: int = 10) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w), level, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def jpeg_of(arr: np.ndarray) -> bytes:
    return simplejpeg.encode_jpeg(np.ascontiguousarray(arr), quality=90)


def chart(seed: int = 0, text: str = "") -> np.ndarray:
    """A drawn bar chart (a safe, structured image), 640x360."""
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (640, 360), "white")
    d = ImageDraw.Draw(img)
    for i in range(8):
        h = int(rng.integers(40, 300))
        d.rectangle([40 + i * 70, 340 - h, 90 + i * 70, 340],
                    fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
    if text:
        d.text((40, 20), text, fill="black", font=ImageFont.load_default(size=48))
    return np.asarray(img)


def frame_event(arr: np.ndarray, stream: str = "s", ts: int = 0) -> FrameEvent:
    return FrameEvent(stream_id=stream, ts=ts, data=jpeg_of(arr), fmt="jpeg")


def raw_msg(ev, offset: int = 0, value: bytes | None = None) -> RawMsg:
    return RawMsg(topic="t", partition=0, offset=offset, key=ev.stream_id.encode(),
                  value=encode_event(ev) if value is None else value, timestamp_ms=0)


def _resonator(x: np.ndarray, f: float, bw: float, sr: int) -> np.ndarray:
    r = np.exp(-np.pi * bw / sr)
    a1, a2 = -2 * r * np.cos(2 * np.pi * f / sr), r * r
    y = np.zeros_like(x)
    y1 = y2 = 0.0
    for i, v in enumerate(x):
        y0 = v - a1 * y1 - a2 * y2
        y[i], y2, y1 = y0, y1, y0
    return y


def speechlike(sr: int = SR, secs: float = 2.0) -> np.ndarray:
    """Voiced syllables at 4 Hz: a glottal pulse train with a wandering pitch
    through three formant resonators, vowel changing per syllable."""
    n = int(sr * secs)
    t = np.arange(n) / sr
    phase = np.cumsum((130 + 25 * np.sin(2 * np.pi * 0.7 * t)) / sr)
    src = (np.diff(np.floor(phase), prepend=0) > 0).astype(float)
    vowels = [(730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480)]
    syl = sr // 4
    out = np.zeros(n)
    for k in range(0, n, syl):
        seg = src[k:k + syl]
        y = sum(_resonator(seg, f, 80 + 40 * j, sr) / (j + 1)
                for j, f in enumerate(vowels[(k // syl) % 4]))
        out[k:k + syl] = y * np.sin(np.pi * np.arange(len(seg)) / syl) ** 0.7
    return (0.5 * out / np.abs(out).max()).astype(np.float32)


def audio_chunk(x: np.ndarray, sr: int, ch: int = 1, stream: str = "a", ts: int = 0) -> AudioChunk:
    pcm = (np.repeat(x[:, None], ch, axis=1) * 32767).astype("<i2")
    return AudioChunk(stream_id=stream, ts=ts, data=pcm.tobytes(), sr=sr, ch=ch)


SRT = """1
00:00:00,200 --> 00:00:00,900
欢迎 hello

2
00:00:01,200 --> 00:00:01,800
second cue

3
00:00:02,100 --> 00:00:02,700
third cue
"""


def _pick_codecs() -> tuple[str, str, str]:
    """(container suffix, video encoder, audio encoder) this av build can write."""
    have = av.codecs_available
    for suffix, vids, auds in ((".mp4", ("libx264", "h264", "mpeg4"), ("aac", "libmp3lame")),
                               (".mkv", ("mpeg4", "mjpeg", "libx264"),
                                ("libmp3lame", "mp3", "pcm_s16le", "libopus"))):
        v = next((c for c in vids if c in have and _can_encode(c)), None)
        a = next((c for c in auds if c in have and _can_encode(c)), None)
        if v and a:
            return suffix, v, a
    pytest.skip("this av build has no usable video and audio encoders")


def _can_encode(name: str) -> bool:
    try:
        av.Codec(name, "w")
    except (av.FFmpegError, ValueError):
        return False
    return True


def make_video(path_stem: Path, *, seconds: float = 3.0, fps: int = 15, sr: int = 16000,
               size: tuple[int, int] = (160, 120), video: bool = True,
               audio: bool = True) -> Path:
    """A real little file: coloured frames changing every 5 frames and a gated 440 Hz tone."""
    suffix, vcodec, acodec = _pick_codecs()
    path = path_stem.with_suffix(suffix)
    with av.open(str(path), "w") as out:
        # every stream is added before the first mux (that writes the header)
        vs = out.add_stream(vcodec, rate=fps) if video else None
        aus = out.add_stream(acodec, rate=sr) if audio else None
        if vs is not None:
            vs.width, vs.height = size
            vs.pix_fmt = "yuv420p"
        if aus is not None:
            aus.layout = "mono"
        if vs is not None:
            for i in range(round(seconds * fps)):
                img = np.zeros((size[1], size[0], 3), np.uint8)
                img[..., i // 5 % 3] = 200
                img[: size[1] // 2, :, 1] = (i * 7) % 256
                f = av.VideoFrame.from_ndarray(img, format="rgb24")
                f.pts = i
                for p in vs.encode(f):
                    out.mux(p)
            for p in vs.encode():
                out.mux(p)
        if aus is not None:
            fmt = aus.codec_context.codec.audio_formats[0].name
            n = int(seconds * sr)
            t = np.arange(n) / sr
            x = 0.3 * np.sin(2 * np.pi * 440 * t) * (np.sin(2 * np.pi * 0.5 * t) > 0)
            step = aus.codec_context.frame_size or 1024
            for k in range(0, n, step):
                blk = x[k:k + step]
                if fmt.startswith("s16"):
                    f = av.AudioFrame.from_ndarray((blk * 32767).astype(np.int16)[None, :],
                                                   format="s16", layout="mono")
                else:
                    f = av.AudioFrame.from_ndarray(blk.astype(np.float32)[None, :],
                                                   format="fltp" if fmt.endswith("p") else "flt",
                                                   layout="mono")
                f.sample_rate, f.pts = sr, k
                for p in aus.encode(f):
                    out.mux(p)
            for p in aus.encode():
                out.mux(p)
    return path


def write_srt(path: Path) -> Path:
    path.write_text(SRT, encoding="utf-8")
    return path
