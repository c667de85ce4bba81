"""Seeded synthetic frames: the INT8 calibration set and a separate accuracy set.

Static INT8 quantization needs the activations' ranges on inputs like the
real ones. No photographs ship with the project (nothing is downloaded at run
time), so the frames are generated, deterministically for a seed:

* calibration (:func:`calibration_frames`): photo-like colour textures with a
  natural 1/f^a spectrum, "landscapes" (a sky gradient over textured ground),
  soft-edged objects on a textured background, warm smooth colour fields (skin
  and wood tones, so Open-NSFW's colour-sensitive channels are calibrated;
  no shapes of bodies or faces), screen cards (bars, banners, text) like the
  streams' overlays, and dark/bright/low-contrast variants of all of these;
* accuracy (:func:`accuracy_frames`): other generators and another seed: bar
  charts with text, plasma (sums of sinusoids), mosaics (nearest-centre
  cells), stripes and checkers, blurred block noise, flat fields; and
  (:func:`warm_frames`) the warm-field generator with another seed, the one
  synthetic kind Open-NSFW scores above a few percent (reported apart).

Synthetic frames are not photographs: they cover colour, texture and edge
statistics, not objects. docs/benchmarks.md says what that means for the
accuracy figures. Every frame is SIDE x SIDE uint8 RGB, after a JPEG round
trip at a seeded quality (60-95), as decoded video frames are.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

__all__ = ["ACCURACY_SEED", "CALIBRATION_SEED", "SIDE", "accuracy_frames", "calibration_frames",
           "warm_frames"]

SIDE = 256
#: Fixed seeds: the INT8 models' file names carry a digest of this recipe.
CALIBRATION_SEED = 20261203
ACCURACY_SEED = 777

_Gen = Callable[[np.random.Generator], np.ndarray]


def _finish(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Clip, then a JPEG round trip at quality 60-95 (blocking and ringing as in video)."""
    arr = np.clip(img, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=int(rng.integers(60, 96)))
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), dtype=np.uint8)


def _pink(rng: np.random.Generator, alpha: float, side: int = SIDE) -> np.ndarray:
    """Zero-mean, unit-std noise with a 1/f^alpha amplitude spectrum (natural images: ~1-2)."""
    f = np.sqrt(np.fft.fftfreq(side)[:, None] ** 2 + np.fft.rfftfreq(side)[None, :] ** 2)
    f[0, 0] = 1.0
    spec = (rng.standard_normal(f.shape) + 1j * rng.standard_normal(f.shape)) / f ** alpha
    spec[0, 0] = 0.0
    x = np.fft.irfft2(spec, s=(side, side))
    return (x - x.mean()) / (x.std() + 1e-9)


def _colour_texture(rng: np.random.Generator) -> np.ndarray:
    """Three correlated 1/f fields mixed into RGB around a random mean colour."""
    fields = np.stack([_pink(rng, rng.uniform(1.0, 2.2)) for _ in range(3)], axis=-1)
    mix = rng.normal(0, 1, (3, 3)) * 0.4 + np.eye(3) * rng.uniform(0.2, 1.0)
    mean = rng.uniform(40, 215, 3)
    return mean + fields @ mix.T * rng.uniform(15, 55)


def _landscape(rng: np.random.Generator) -> np.ndarray:
    horizon = int(rng.integers(SIDE // 4, 3 * SIDE // 4))
    y = np.linspace(0, 1, SIDE)[:, None, None]
    top, bottom = rng.uniform(120, 255, 3), rng.uniform(60, 220, 3)
    sky = top * (1 - y) + bottom * y
    ground = _colour_texture(rng) * rng.uniform(0.5, 1.0)
    img = np.broadcast_to(sky, (SIDE, SIDE, 3)).copy()
    edge = horizon + (8 * _pink(rng, 2.0)[0]).astype(int)
    rows = np.arange(SIDE)[:, None]
    img[rows >= edge[None, :]] = ground[rows >= edge[None, :]]
    return img


def _objects(rng: np.random.Generator) -> np.ndarray:
    bg = Image.fromarray(np.clip(_colour_texture(rng), 0, 255).astype(np.uint8))
    layer = Image.new("RGBA", (SIDE, SIDE), (0, 0, 0, 0))
    d = ImageDraw.Draw(layer)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = (int(v) for v in rng.integers(-40, SIDE, 2))
        w, h = (int(v) for v in rng.integers(20, 140, 2))
        fill = (*(int(c) for c in rng.integers(0, 256, 3)), int(rng.integers(160, 256)))
        kind = rng.integers(3)
        if kind == 0:
            d.ellipse([x0, y0, x0 + w, y0 + h], fill=fill)
        elif kind == 1:
            d.rectangle([x0, y0, x0 + w, y0 + h], fill=fill)
        else:
            pts = [(int(x0 + rng.integers(0, w)), int(y0 + rng.integers(0, h))) for _ in range(5)]
            d.polygon(pts, fill=fill)
    layer = layer.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 3.0))))
    bg.paste(layer, (0, 0), layer)
    return np.asarray(bg, dtype=np.float32)


def _warm_field(rng: np.random.Generator) -> np.ndarray:
    """Smoothly shaded warm tones (skin, sand, wood hues) with soft texture."""
    base = np.array([rng.uniform(150, 245), rng.uniform(95, 190), rng.uniform(70, 160)])
    yy, xx = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    shade = 1 + 0.35 * np.sin(2 * np.pi * (rng.uniform(0.3, 1.5) * xx + rng.uniform(0, 1)))
    shade *= 1 + 0.25 * np.cos(2 * np.pi * (rng.uniform(0.3, 1.5) * yy + rng.uniform(0, 1)))
    tex = _pink(rng, 2.0)[..., None] * rng.uniform(4, 18)
    return base * shade[..., None] * rng.uniform(0.6, 1.0) + tex


def _card(rng: np.random.Generator) -> np.ndarray:
    """A screen overlay card: colour field, gradient, bars, a banner and text."""
    img = Image.new("RGB", (SIDE, SIDE), tuple(int(c) for c in rng.integers(30, 230, 3)))
    d = ImageDraw.Draw(img)
    for j in range(int(rng.integers(4, 10))):
        bh = int(rng.integers(SIDE // 8, SIDE - 40))
        x0 = 8 + j * (SIDE - 16) // 10
        d.rectangle([x0, SIDE - bh, x0 + SIDE // 14, SIDE - 4],
                    fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    d.rectangle([0, 0, SIDE, SIDE // 6], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    d.text((8, 8), f"LIVE {rng.integers(1000)}",
           fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    arr = np.asarray(img, dtype=np.float32)
    return arr + np.linspace(-30, 30, SIDE)[None, :, None]


_CALIBRATION: tuple[_Gen, ...] = (_colour_texture, _landscape, _objects, _warm_field, _card)


def calibration_frames(n: int = 160, seed: int = CALIBRATION_SEED) -> Iterator[np.ndarray]:
    """``n`` calibration frames (lazily), the generators in turn; every third one darkened,
    brightened or flattened (exposure and contrast vary in real video)."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        img = _CALIBRATION[i % len(_CALIBRATION)](rng)
        if i % 3 == 2:
            gain, lift = rng.uniform(0.35, 1.4), rng.uniform(-20, 40)
            img = (img - 128) * rng.uniform(0.4, 1.2) + 128 if rng.random() < 0.5 \
                else img * gain + lift
        yield _finish(img, rng)


# -- the accuracy set: other generators, another seed ---------------------------------

def _chart(rng: np.random.Generator) -> np.ndarray:
    img = Image.new("RGB", (SIDE, SIDE), "white" if rng.random() < 0.5 else
                    tuple(int(c) for c in rng.integers(150, 256, 3)))
    d = ImageDraw.Draw(img)
    for i in range(8):
        h = int(rng.integers(20, 200))
        d.rectangle([16 + i * 29, 240 - h, 36 + i * 29, 240],
                    fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    d.text((16, 12), f"Q{rng.integers(1, 5)} results", fill="black")
    return np.asarray(img, dtype=np.float32)


def _plasma(rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    out = np.zeros((SIDE, SIDE, 3))
    for c in range(3):
        for _ in range(4):
            fx, fy = rng.uniform(-6, 6, 2)
            out[..., c] += np.sin(2 * np.pi * (fx * xx + fy * yy) + rng.uniform(0, 6.3))
    return 128 + out * rng.uniform(15, 30)


def _mosaic(rng: np.random.Generator) -> np.ndarray:
    k = int(rng.integers(6, 40))
    centres = rng.uniform(0, SIDE, (k, 2))
    colours = rng.uniform(0, 255, (k, 3))
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    d = (yy[..., None] - centres[:, 0]) ** 2 + (xx[..., None] - centres[:, 1]) ** 2
    return colours[np.argmin(d, axis=-1)]


def _stripes(rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    period = int(rng.integers(4, 48))
    a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    mask = ((xx // period + (yy // period) * int(rng.integers(0, 2))) % 2).astype(bool)
    return np.where(mask[..., None], a, b)


def _blocks(rng: np.random.Generator) -> np.ndarray:
    small = rng.uniform(0, 255, (int(rng.integers(4, 33)),) * 2 + (3,)).astype(np.uint8)
    img = Image.fromarray(small).resize((SIDE, SIDE), Image.Resampling.BICUBIC)
    return np.asarray(img.filter(ImageFilter.GaussianBlur(2)), dtype=np.float32)


def _flat(rng: np.random.Generator) -> np.ndarray:
    return np.broadcast_to(rng.uniform(0, 255, 3), (SIDE, SIDE, 3)).copy()


_ACCURACY: tuple[_Gen, ...] = (_chart, _plasma, _mosaic, _stripes, _blocks, _flat)


def accuracy_frames(n: int = 96, seed: int = ACCURACY_SEED) -> list[np.ndarray]:
    """``n`` frames from generators the calibration set does not use, for checking
    INT8 against FP32 (never for calibrating)."""
    rng = np.random.default_rng(seed)
    return [_finish(_ACCURACY[i % len(_ACCURACY)](rng), rng) for i in range(n)]


def warm_frames(n: int = 24, seed: int = ACCURACY_SEED) -> list[np.ndarray]:
    """The calibration set's warm-field generator with another seed: the synthetic frames
    on which Open-NSFW scores highest (up to about 0.7), so the accuracy set has scores
    away from 0. Same generator as calibration: reported as its own group."""
    rng = np.random.default_rng(seed + 1)
    return [_finish(_warm_field(rng), rng) for _ in range(n)]
