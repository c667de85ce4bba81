"""Sound and picture primitives for the synthetic corpus, in true (reference) time.

Sound is mono float64 in -1..1 at the stream's rate; pictures are RGB uint8.
Everything draws from a numpy Generator passed in, so a case is a function of
its seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Frames", "bursts", "drum_hit", "jingle_note", "place", "sensor_noise",
           "syllabic_burst", "texture"]

#: Picture size of the synthetic cases: 16:9, small (the light signals look at 16x16).
W, H = 128, 72


def bursts(rng: np.random.Generator, t0: float, t1: float, *, min_s: float = 0.6,
           max_s: float = 2.4, gap_min_s: float = 0.35, gap_max_s: float = 1.6
           ) -> list[tuple[float, float]]:
    """Speech bursts (start, end) in ``t0..t1``, s: irregular lengths and pauses."""
    out, t = [], t0 + rng.uniform(0.2, 0.8)
    while True:
        d = rng.uniform(min_s, max_s)
        if t + d > t1 - 0.2:
            break
        out.append((t, t + d))
        t += d + rng.uniform(gap_min_s, gap_max_s)
    return out


def syllabic_burst(rng: np.random.Generator, sr: int, dur_s: float) -> np.ndarray:
    """Voiced speech-like sound: 4-6 syllables a second, each a raised-cosine bump.

    The first syllable starts at sample 0 (the burst's onset is the speech onset).
    """
    n = int(dur_s * sr)
    t = np.arange(n) / sr
    f0 = rng.uniform(110, 220) * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voice = sum(np.sin(k * phase) / k for k in range(1, 6)) + 0.15 * rng.normal(0, 1, n)
    env = np.zeros(n)
    rate = rng.uniform(4.0, 6.0)
    s = 0.0
    while s < dur_s - 0.08:
        length = min(rng.uniform(0.10, 0.17), dur_s - s)
        a, b = int(s * sr), int((s + length) * sr)
        env[a:b] = np.maximum(env[a:b], rng.uniform(0.5, 1.0) * np.sin(
            np.pi * np.arange(b - a) / max(1, b - a)) ** 2)
        s += rng.uniform(0.8, 1.2) / rate
    # a soft floor inside the burst: speech does not drop to silence between syllables
    env = np.maximum(env, 0.08 * (np.arange(n) < n - int(0.03 * sr)))
    return 0.25 * env * voice


def drum_hit(rng: np.random.Generator, sr: int, strength: float) -> np.ndarray:
    """A kick: a falling sine with a click, 180 ms."""
    n = int(0.18 * sr)
    t = np.arange(n) / sr
    f = 50 + 90 * np.exp(-t / 0.03)
    body = np.sin(2 * np.pi * np.cumsum(f) / sr) * np.exp(-t / 0.05)
    click = rng.normal(0, 1, n) * np.exp(-t / 0.004)
    return strength * (0.7 * body + 0.2 * click)


def jingle_note(sr: int, freq: float, dur_s: float, level: float) -> np.ndarray:
    n = int(dur_s * sr)
    t = np.arange(n) / sr
    env = np.minimum(1.0, t / 0.01) * np.exp(-t / max(0.05, dur_s / 2))
    return level * env * (np.sin(2 * np.pi * freq * t) + 0.3 * np.sin(4 * np.pi * freq * t))


def place(dst: np.ndarray, src: np.ndarray, at_s: float, sr: int) -> None:
    """Add ``src`` into ``dst`` starting at ``at_s`` (clipped at the end)."""
    a = int(round(at_s * sr))
    if a >= len(dst) or a < 0:
        return
    b = min(len(dst), a + len(src))
    dst[a:b] += src[: b - a]


def texture(rng: np.random.Generator, w: int, h: int, cells: int = 12) -> np.ndarray:
    """A smooth random colour picture (blocky noise upsampled), float32 0..255."""
    ch, cw = max(2, cells * h // w), cells
    small = rng.uniform(30, 220, size=(ch + 1, cw + 1, 3))
    ys, xs = np.linspace(0, ch, h), np.linspace(0, cw, w)
    y0, x0 = np.floor(ys).astype(int).clip(0, ch - 1), np.floor(xs).astype(int).clip(0, cw - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    a = small[y0][:, x0]
    b = small[y0][:, x0 + 1]
    c = small[y0 + 1][:, x0]
    d = small[y0 + 1][:, x0 + 1]
    return ((a * (1 - fx) + b * fx) * (1 - fy) + (c * (1 - fx) + d * fx) * fy).astype(np.float32)


def sensor_noise(rng: np.random.Generator, img: np.ndarray, sigma: float) -> np.ndarray:
    """Per-frame Gaussian noise, then uint8."""
    if sigma > 0:
        img = img + rng.normal(0, sigma, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


@dataclass
class Frames:
    """A picture as a function of true time: a background plus timed overlays.

    ``pan_px_s`` slides a wider background by that many pixels a second (never a
    still frame); ``scenes`` (start s, picture) replace the background from their
    start on (cuts); ``cards`` (start s, end s, box, colour) are drawn on top.
    """

    background: np.ndarray
    noise: float = 3.0
    pan_px_s: float = 0.0
    scenes: list[tuple[float, np.ndarray]] | None = None
    cards: list[tuple[float, float, tuple[int, int, int, int], tuple[int, int, int]]] | None = None
    #: spans where the picture stands still, noise and all (a paused or frozen source).
    frozen: list[tuple[float, float]] | None = None

    def __call__(self, t: float, rng: np.random.Generator) -> np.ndarray:
        for a, b in self.frozen or ():
            if a <= t < b:
                t = a  # the frame at the span's start, without fresh noise
                rng = np.random.default_rng(int(a * 1000))
                break
        bg = self.background
        for start, pic in self.scenes or ():
            if start <= t:
                bg = pic
        if self.pan_px_s:
            x = self.pan_px_s * t % max(1, bg.shape[1] - W - 1)
            x0, fx = int(x), x - int(x)
            img = (1 - fx) * bg[:H, x0:x0 + W] + fx * bg[:H, x0 + 1:x0 + 1 + W]
        else:
            img = bg[:H, :W].copy()
        for a, b, (x, y, w, h), colour in self.cards or ():
            if a <= t < b:
                img[y:y + h, x:x + w] = colour
        return sensor_noise(rng, img, self.noise)
