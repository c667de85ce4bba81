"""The oracle: one whole-stream cross-correlation from the raw events, to show a case is solvable.

audio: the picture's frame difference (grey 32x32, less its median, positive
part), each frame's value placed half-way to the previous frame, against the
positive change of log audio energy per 10 ms hop, both blurred by half a
frame interval (the change happened somewhere since the previous frame) and
less their 0.5 s moving average; text: caption starts
against speech onsets (a rise after at least 200 ms of quiet), which gives
the caption lag behind the sound, plus the audio lag. Lags are searched over
+-``max_lag_ms`` at 10 ms and refined by a parabola through the peak. It
sees the whole stream at once, which no live estimator can: it bounds what
the content allows, it is not a goal to match.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import simplejpeg
from PIL import Image

from schemas.events import AudioChunk, Event, FrameEvent, TextEvent

__all__ = ["HOP_US", "frame_change", "log_energy", "oracle", "speech_onsets", "xcorr_lag"]

#: Oracle resolution: 10 ms.
HOP_US = 10_000
#: Grid margin before the stream start, us (a negative skew puts audio before it).
_PRE_US = 3_000_000
_THUMB = 32
#: Frames further apart than this have no "previous frame", us.
_MAX_GAP_US = 500_000


def _grid_len(seconds: float) -> int:
    return int((seconds * 1e6 + 2 * _PRE_US + 2_500_000) // HOP_US)


def _split(grid: np.ndarray, t_us: float, origin: int, w: float) -> None:
    """Add ``w`` at time ``t_us``, split between the two nearest bins (sub-bin placement)."""
    x = (t_us - origin) / HOP_US
    k = int(np.floor(x))
    f = x - k
    if 0 <= k < len(grid) - 1:
        grid[k] += w * (1 - f)
        grid[k + 1] += w * f


def frame_change(frames: Sequence[FrameEvent], origin: int, n: int) -> np.ndarray:
    grid = np.zeros(n)
    prev: tuple[int, np.ndarray] | None = None
    points: list[tuple[float, float]] = []
    for ev in sorted(frames, key=lambda e: e.ts):
        g = simplejpeg.decode_jpeg(ev.data, colorspace="GRAY", min_height=_THUMB,
                                   min_width=_THUMB)[:, :, 0]
        small = _resize(g, _THUMB)
        if prev is not None and 0 < ev.ts - prev[0] <= _MAX_GAP_US:
            points.append(((prev[0] + ev.ts) / 2, float(np.mean(np.abs(small - prev[1])))))
        prev = (ev.ts, small)
    if points:
        floor = float(np.median([w for _, w in points]))
        for t, w in points:
            if w > floor:
                _split(grid, t, origin, w - floor)
    return grid


def _resize(g: np.ndarray, side: int) -> np.ndarray:
    return np.asarray(Image.fromarray(g).resize((side, side), Image.Resampling.BOX),
                      dtype=np.float32)


def log_energy(chunks: Sequence[AudioChunk], origin: int, n: int) -> np.ndarray:
    """Log10 mean power per 10 ms bin of the audio's own clock (NaN where no audio)."""
    energy, count = np.zeros(n), np.zeros(n)
    for ev in chunks:
        x = np.frombuffer(ev.data, dtype="<i2").astype(np.float64) / 32768.0
        if ev.ch > 1:
            x = x.reshape(-1, ev.ch).mean(axis=1)
        t = ev.ts + np.arange(len(x)) * 1e6 / ev.sr
        k = ((t - origin) // HOP_US).astype(np.int64)
        ok = (k >= 0) & (k < n)
        energy += np.bincount(k[ok], weights=x[ok] ** 2, minlength=n)[:n]
        count += np.bincount(k[ok], minlength=n)[:n]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.log10(energy / np.maximum(count, 1) + 1e-10), np.nan)


def _rises(e: np.ndarray) -> np.ndarray:
    d = np.diff(e, prepend=np.nan)
    return np.nan_to_num(np.maximum(d, 0.0))


def speech_onsets(e: np.ndarray, quiet_bins: int = 20, confirm_bins: int = 15) -> np.ndarray:
    """Bins where sound leaves a quiet stretch of ``quiet_bins`` and turns loud within
    ``confirm_bins`` (quiet and loud: log10 thresholds from the level's percentiles)."""
    valid = e[np.isfinite(e) & (e > -9.5)]  # digital silence (log10 1e-10) is no floor
    if not len(valid):
        return np.zeros(len(e))
    floor, peak = np.percentile(valid, 10), np.percentile(valid, 95)
    hi = max(floor + 1.5, peak - 3.0)  # log10 units: 15 dB over the floor, within 30 dB of peaks
    lo = min(hi - 0.7, floor + 0.8)
    x = np.nan_to_num(e, nan=-20.0)
    loud, quiet = x >= hi, x < lo
    out = np.zeros(len(e))
    run = 0
    for j in range(len(e)):
        if not quiet[j] and run >= quiet_bins and loud[j:j + confirm_bins].any():
            out[j] = 1.0
        run = run + 1 if quiet[j] else 0
    return out


def _smooth(x: np.ndarray, sigma_bins: float) -> np.ndarray:
    r = int(3 * sigma_bins)
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma_bins) ** 2)
    return np.convolve(x, k / k.sum(), mode="same")


def _local(x: np.ndarray, bins: int = 50) -> np.ndarray:
    """Less its 0.5 s moving average: syllables go on for a whole burst, so a picture change
    at a burst's start would otherwise match any lag that lands inside the burst."""
    return x - np.convolve(x, np.ones(bins) / bins, mode="same")


def xcorr_lag(ref: np.ndarray, sig: np.ndarray, max_lag_ms: float, min_lag_ms: float | None = None
              ) -> float | None:
    """Lag of ``sig`` behind ``ref`` in ms (positive: later), searched over the given range."""
    if not ref.any() or not sig.any():
        return None
    a, b = ref - ref.mean(), sig - sig.mean()
    hi = int(max_lag_ms * 1000 // HOP_US)
    lo = -hi if min_lag_ms is None else int(min_lag_ms * 1000 // HOP_US)
    n = len(a)
    full = np.fft.irfft(np.fft.rfft(b, 2 * n) * np.conj(np.fft.rfft(a, 2 * n)), 2 * n)
    lags = np.arange(lo, hi + 1)
    score = full[lags % (2 * n)]
    i = int(np.argmax(score))
    frac = 0.0
    if 0 < i < len(score) - 1:
        y0, y1, y2 = score[i - 1], score[i], score[i + 1]
        den = y0 - 2 * y1 + y2
        frac = 0.5 * (y0 - y2) / den if den < 0 else 0.0
    return float((lags[i] + frac) * HOP_US / 1000)


def oracle(events: Sequence[Event], start_us: int, seconds: float, *, max_lag_ms: float = 1000.0,
           text_style: str | None = None) -> dict[str, float | None]:
    """Whole-stream lags of audio and text behind the picture, ms (None: nothing to go on).

    ``text_style`` "asr": captions are searched 0.5 to 2.5 s behind their speech and
    blurred by 150 ms (each has its own delay), else within +-1 s, blurred by 40 ms.
    """
    origin, n = start_us - _PRE_US, _grid_len(seconds)
    frames = [e for e in events if isinstance(e, FrameEvent)]
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    texts = [e for e in events if isinstance(e, TextEvent)]
    img = frame_change(frames, origin, n)
    e = log_energy(chunks, origin, n)
    # a frame's change happened anywhere since the previous frame: blur both sides by half
    # a frame interval (at least 20 ms), so sparse frames still meet the sound's rises
    gaps = np.diff(sorted(f.ts for f in frames)) if len(frames) > 1 else np.array([40_000])
    sigma = max(2.0, float(np.median(gaps)) / HOP_US / 2)
    audio = xcorr_lag(_local(_smooth(img, sigma)), _local(_smooth(_rises(e), sigma)), max_lag_ms)
    out: dict[str, float | None] = {"audio": audio}
    if texts:
        caps = np.zeros(n)
        for t in texts:
            _split(caps, t.ts, origin, 1.0)
        lo, hi, blur = (-500.0, 2500.0, 15) if text_style == "asr" else (-1000.0, 1000.0, 4)
        rel = xcorr_lag(_smooth(speech_onsets(e), blur), _smooth(caps, blur), hi, lo)
        out["text"] = None if rel is None or audio is None else rel + audio
    return out
